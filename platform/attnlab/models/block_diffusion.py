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
from attnlab.components.masks import block_diffusion_flex_mask, block_diffusion_mask
from attnlab.errors import ConfigError
from attnlab.generation.compiled_step import step_runner

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
        return tokens.is_cuda and not self.stack.positional.adds_score_bias and cfg.backend == "sdpa" and no_dropout

    def predictors(self, hidden, noisy_blocks, noisy_positions, clean_blocks, clean_positions=None):
        """From the joint pass's hidden states (B, Ln+Lc, d), those that predict each noisy token:
        without shift its own; with shift, inside a block the noisy token before it, and for a
        block's first token the clean token at the position before (the last clean position)."""
        n = noisy_blocks.shape[1]
        noisy_hidden, clean_hidden = hidden[:, :n], hidden[:, n:]
        if not self.shift:
            return noisy_hidden
        before = noisy_positions - 1
        if clean_positions is None:  # right-padded: a clean token's column is its position (the
            # clean half may stop at the columns noisy tokens read: a block's first token reads one)
            column = before.clamp(min=0, max=clean_hidden.shape[1] - 1)
        else:  # left-padded (the tests' uncached reference): the real clean token at that position
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
    def new_state(self, batch_size: int, capacity: int, device=None, *, compiled: bool = False) -> DecodeState:
        """A decoding state whose caches hold `capacity` tokens per row before they grow, whose
        calls are compiled with `compiled` (generation/compiled_step.py)."""
        return DecodeState.new(len(self.stack.layers), batch_size, capacity, device, run=step_runner(compiled))

    def advance(self, clean, clean_valid, noisy, state: DecodeState) -> torch.Tensor:
        """Logits (B, n, V) of a noisy block placed after the cache and after `clean`.

        `clean` (the prompt, with `clean_valid` marking its left padding, or each row's block just
        finished, with `clean_valid` False on rows that finished none; None for none) joins the
        cache in the same call: its tokens see the cache and each other (causally with a causal
        context), never the noisy block. The noisy block is a trial (`DecodeState.forward`): its
        keys are not kept, so denoising a block costs one call per step and nothing to commit it.
        """
        n_clean = 0 if clean is None else clean.shape[1]
        tokens, valid = noisy, None
        if n_clean:
            tokens = torch.cat((clean, noisy), dim=1)
            valid = torch.cat((clean_valid, torch.ones_like(noisy, dtype=torch.bool)), dim=1)
        hidden = state.forward(self.stack, tokens, valid, noisy=noisy.shape[1], causal=self.causal)
        return self._block_logits(hidden, n_clean, None if valid is None else clean_valid[:, -1], state)

    def _block_logits(self, hidden: torch.Tensor, n_clean: int, committed, state: DecodeState) -> torch.Tensor:
        """Logits of the noisy block from a call's hidden states (clean tokens first). With shift,
        the last clean token predicts the block's first token: a row that committed clean tokens
        (`committed`) records it in the state, its block's later calls reuse it; it never changes
        while the block is denoised, since clean tokens never see noisy ones."""
        if not self.shift:
            return self.logits(hidden[:, n_clean:])
        if n_clean:
            last = hidden[:, n_clean - 1]
            previous = state.last_clean_hidden
            state.last_clean_hidden = last if previous is None else torch.where(committed[:, None], last, previous)
        if state.last_clean_hidden is None:
            raise ValueError("a shifted block needs a clean token before it: start with the prompt")
        return self.logits(torch.cat((state.last_clean_hidden[:, None], hidden[:, n_clean:-1]), dim=1))

    def draft_call(self, clean, clean_valid, n_noisy: int, state: DecodeState, first: int) -> torch.Tensor:
        """Draft-and-verify's call (generation/draft_verify.py): `clean` (B, c) joins the cache
        causally, a block of `n_noisy` masks follows it, and the logits (B, c - first + n_noisy - 1, V)
        of every hidden state from column `first` on but the last. With shift and a causal context
        each predicts the token after it: after a clean token the AR view's next token (which checks
        the next clean token), from the last clean token on the diffusion view's draft of each
        masked position. Logits are computed only for those columns."""
        if not (self.shift and self.causal):
            raise ConfigError("draft-and-verify decoding needs model.init_args.shift true and context causal "
                              "(the AR view that checks the drafts)")
        masks = torch.full((clean.shape[0], n_noisy), self.mask_id, dtype=clean.dtype, device=clean.device)
        tokens = torch.cat((clean, masks), dim=1)
        valid = torch.cat((clean_valid, torch.ones_like(masks, dtype=torch.bool)), dim=1)
        hidden = state.forward(self.stack, tokens, valid, noisy=n_noisy, causal=True)
        return self.logits(hidden[:, first:-1])
