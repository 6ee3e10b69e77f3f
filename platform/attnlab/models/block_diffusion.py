"""BD3-LM: autoregressive over blocks, masked diffusion inside a block, on the shared stack.

Training sees `x_t ⊕ x_0` in one pass (both halves at the same positions) under the
block-diffusion mask. Sampling denoises one block at a time against the clean blocks' cached
keys and values, which is exact because clean tokens never attend to noisy ones.

Two options make the network an autoregressive model's (Fast-dLLM v2, DiffuLLaMA), so a
DecoderOnly checkpoint converts without relearning its head: `shift` (the hidden state at i-1
predicts the masked token at i; a block's first token comes from the last clean position) and
a `causal` clean context (clean tokens see clean tokens up to themselves, not their whole block).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.components import BackboneConfig, DecodeState, TransformerStack
from attnlab.components.masks import (
    block_diffusion_flex_mask,
    block_diffusion_mask,
    block_diffusion_visible,
    self_mask,
)
from attnlab.errors import ConfigError
from attnlab.generation.compiled_step import stack_step

MASK_BACKENDS = ("auto", "dense", "flex")
CONTEXTS = ("block_causal", "causal")


class BlockDiffusionModel(nn.Module):
    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int, mask_id: int, mask_backend: str = "auto",
                 shift: bool = False, context: str = "block_causal"):
        super().__init__()
        if mask_backend not in MASK_BACKENDS:
            raise ConfigError(f"model.init_args.mask_backend={mask_backend!r} is not one of {', '.join(MASK_BACKENDS)}")
        if context not in CONTEXTS:
            raise ConfigError(f"model.init_args.context={context!r} is not one of {', '.join(CONTEXTS)}")
        if not isinstance(shift, bool):
            raise ConfigError(f"model.init_args.shift={shift!r} must be true or false")
        self.stack = TransformerStack(cfg, vocab_size, pad_id=pad_id)
        self.mask_id = mask_id
        self.mask_backend = mask_backend
        self.shift, self.causal = shift, context == "causal"

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits with the mask token ruled out (SUBS: the model never predicts a mask)."""
        logits = self.stack.embedding.logits(hidden)
        logits[..., self.mask_id] = float("-inf")
        return logits

    def _use_flex(self, tokens: torch.Tensor) -> bool:
        """Flex where it is fast (compiled, GPU) and computes the same function: no additive
        position bias (ALiBi), no attention dropout, no need for the weights."""
        if self.mask_backend == "flex" and not tokens.is_cuda and torch.is_grad_enabled():
            raise ConfigError(
                "model.init_args.mask_backend=flex cannot train on CPU (FlexAttention has no CPU backward): "
                "use auto (flex on GPU, dense masks on CPU) or dense"
            )
        if self.mask_backend != "auto":
            return self.mask_backend == "flex"
        cfg = self.stack.cfg
        no_dropout = not (self.training and cfg.attention_dropout)
        return tokens.is_cuda and cfg.positional != "alibi" and cfg.backend == "sdpa" and no_dropout

    def denoise(self, noisy, noisy_blocks, noisy_positions, clean, clean_blocks, clean_positions=None):
        """Hidden states (B, Ln, d) that predict the noisy tokens, given the clean sequence: the
        noisy tokens' own, or with `shift` those of the token before each (see `predictors`).

        Block indices are -1 on padding; clean positions default to 0..Lc-1 (right padding).
        """
        hidden, _ = self.joint_pass(noisy, noisy_blocks, noisy_positions, clean, clean_blocks, clean_positions)
        return self.predictors(hidden, noisy_blocks, noisy_positions, clean_blocks, clean_positions)

    def predictors(self, hidden, noisy_blocks, noisy_positions, clean_blocks, clean_positions=None):
        """From the joint pass's hidden states (B, Ln+Lc, d), those that predict each noisy token:
        without shift its own; with shift, inside a block the noisy token before it, and for a
        block's first token the clean token at the position before (the last clean position)."""
        n = noisy_blocks.shape[1]
        noisy_hidden, clean_hidden = hidden[:, :n], hidden[:, n:]
        if not self.shift:
            return noisy_hidden
        before = noisy_positions - 1
        if clean_positions is None:  # right-padded: a clean token's column is its position
            column = before.clamp(min=0)
        else:  # left-padded (the uncached sampler): the real clean token at that position
            same = (clean_positions[:, None, :] == before[:, :, None]) & (clean_blocks >= 0)[:, None, :]
            column = same.long().argmax(-1)
        from_clean = clean_hidden.gather(1, column[..., None].expand(-1, -1, hidden.shape[-1]))
        first = torch.ones_like(noisy_blocks, dtype=torch.bool)
        first[:, 1:] = noisy_blocks[:, 1:] != noisy_blocks[:, :-1]
        return torch.where(first[..., None], from_clean, noisy_hidden.roll(1, dims=1))

    def joint_pass(self, noisy, noisy_blocks, noisy_positions, clean, clean_blocks, clean_positions=None,
                   need_weights=False):
        """Hidden states (B, Ln+Lc, d) of `x_t ⊕ x_0` and per-layer weights when asked (which
        takes the dense mask: FlexAttention returns no weights).

        The mask is built per call: its layout depends on the batch's padding (see
        `block_diffusion_flex_mask` for why it is not cached and how it is kept cheap on GPU)."""
        if clean_positions is None:
            clean_positions = torch.arange(clean.shape[1], device=clean.device).expand_as(clean)
        tokens = torch.cat((noisy, clean), dim=1)
        positions = torch.cat((noisy_positions, clean_positions), dim=1)
        flex = self._use_flex(tokens) and not need_weights
        build = block_diffusion_flex_mask if flex else block_diffusion_mask
        mask = build(noisy_blocks, clean_blocks, self.causal)
        return self.stack(tokens, positions, mask=mask, need_weights=need_weights)

    # ---- incremental: the sampler's path ---------------------------------------------------------
    def new_state(self, batch_size: int, device=None, capacity: int | None = None) -> DecodeState:
        """A growing state, or with `capacity` a fixed one (see DecodeState.fixed)."""
        return DecodeState.new(len(self.stack.layers), batch_size, device, capacity)

    def advance(self, clean, clean_valid, noisy, state: DecodeState, compiled: bool = False) -> torch.Tensor:
        """Logits (B, n, V) of a noisy block placed after the cache and after `clean`.

        `clean` (the prompt, with `clean_valid` marking its left padding, or the block just
        finished; None for none) joins the cache in the same forward pass: its tokens see the
        cache and each other, never the noisy block. The noisy block's keys are dropped again,
        so denoising a block costs one call per step and nothing extra to commit it.
        """
        rows, device = noisy.shape[0], noisy.device
        if clean is None:
            clean = noisy.new_zeros(rows, 0)
            clean_valid = torch.ones_like(clean, dtype=torch.bool)
        if state.capacity is not None:
            return self._advance_fixed(clean, clean_valid, noisy, state, compiled)
        n_cached, n_clean = len(state), clean.shape[1]
        trial = state.fork()  # the noisy block's keys stay in the fork, dropped after this call
        trial.append(clean_valid, state.positions_of(clean_valid))
        noisy_valid = torch.ones_like(noisy, dtype=torch.bool)
        trial.append(noisy_valid, trial.positions_of(noisy_valid))
        key_valid, key_positions = trial.key_valid, trial.key_positions
        n_queries, n_keys = n_clean + noisy.shape[1], key_valid.shape[1]
        if n_clean == 0 and bool(key_valid.all()):
            mask = None  # a noisy block alone after an unpadded cache sees every key
        else:  # the training rule, with the cache as block 0, `clean` as block 1, the noisy block as 2
            index = torch.arange(n_keys, device=device)
            noisy_key = index >= n_cached + n_clean
            key_blocks = torch.where(key_valid, (index >= n_cached).long() + noisy_key.long(), -1)
            query_blocks, noisy_query = key_blocks[:, n_cached:], noisy_key[n_cached:]
            visible = block_diffusion_visible(
                query_blocks[:, :, None], key_blocks[:, None, :], noisy_query[:, None], noisy_key[None, :],
                self._clean_order(index, index[n_cached:]),
            )
            mask = visible[:, None] | self_mask(n_queries, n_keys, device)
        hidden, _ = self.stack(
            torch.cat((clean, noisy), dim=1), key_positions[:, n_cached:],
            mask=mask, key_positions=key_positions, caches=trial.caches,
        )
        trial.truncate(n_cached + n_clean)
        trial.next_position = trial.next_position - noisy.shape[1]
        state.caches, state.key_valid, state.key_positions = trial.caches, trial.key_valid, trial.key_positions
        state.next_position, state.padded = trial.next_position, trial.padded
        return self._block_logits(hidden, n_clean, state)

    def _clean_order(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor | None:
        """With a causal context, (Lq, Lk): key index <= query index (the queries' slots)."""
        return keys[None, :] <= queries[:, None] if self.causal else None

    def _block_logits(self, hidden: torch.Tensor, n_clean: int, state: DecodeState) -> torch.Tensor:
        """Logits of the noisy block from a call's hidden states (clean tokens first). With shift,
        the last clean token predicts the block's first token: a call with clean tokens records
        it in the state, the block's later calls (no clean tokens) reuse it; it never changes
        while the block is denoised, since clean tokens never see noisy ones."""
        if not self.shift:
            return self.logits(hidden[:, n_clean:])
        if n_clean:
            state.last_clean_hidden = hidden[:, n_clean - 1]
        if state.last_clean_hidden is None:
            raise ValueError("a shifted block needs a clean token before it: start with the prompt")
        return self.logits(torch.cat((state.last_clean_hidden[:, None], hidden[:, n_clean:-1]), dim=1))

    def _advance_fixed(self, clean, clean_valid, noisy, state: DecodeState, compiled: bool) -> torch.Tensor:
        """`advance` over a fixed state: clean and noisy tokens are written at the next slots in
        place, the mask spans the whole buffer, and the noisy slots are hidden again afterwards
        (the next call overwrites them), so every call has the shapes a compiled step reuses."""
        n_cached, n_clean, n_noisy = len(state), clean.shape[1], noisy.shape[1]
        clean_positions = state.positions_of(clean_valid)
        after_clean = state.next_position + clean_valid.long().sum(1)
        noisy_positions = after_clean[:, None] + torch.arange(n_noisy, device=noisy.device)
        positions = torch.cat((clean_positions, noisy_positions), dim=1)
        self.stack.positional.check_positions(positions)
        state.append(torch.cat((clean_valid, torch.ones_like(noisy, dtype=torch.bool)), dim=1), positions)
        index = torch.arange(state.capacity, device=noisy.device)
        noisy_key = index >= n_cached + n_clean
        key_blocks = torch.where(state.key_valid, (index >= n_cached).long() + noisy_key.long(), -1)
        query_blocks, noisy_query = key_blocks[:, n_cached : state.filled], noisy_key[n_cached : state.filled]
        query_slots = torch.arange(n_cached, state.filled, device=noisy.device)
        visible = block_diffusion_visible(
            query_blocks[:, :, None], key_blocks[:, None, :], noisy_query[:, None], noisy_key[None, :],
            self._clean_order(index, query_slots),
        )
        itself = index == query_slots[:, None]
        hidden = stack_step(self.stack, compiled)(
            torch.cat((clean, noisy), dim=1), positions, visible[:, None] | itself, state.key_positions,
            state.caches, None,
        )
        state.truncate(n_cached + n_clean)
        state.next_position = after_clean
        return self._block_logits(hidden, n_clean, state)
