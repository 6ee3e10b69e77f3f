"""GPT-style decoder: one causal stack over `[bos] source [sep] target [eos]` (or plain text)."""
from __future__ import annotations

import torch
from torch import nn

from attnlab.components import BackboneConfig, DecodeState, TransformerStack
from attnlab.components.masks import causal_padding_mask


class DecoderOnlyModel(nn.Module):
    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.stack = TransformerStack(cfg, vocab_size, pad_id=pad_id)

    def new_state(self, batch_size: int, device=None, capacity: int | None = None) -> DecodeState:
        """A growing state, or with `capacity` a fixed one (see DecodeState.fixed)."""
        return DecodeState.new(len(self.stack.layers), batch_size, device, capacity)

    def hidden(self, tokens, valid=None, state: DecodeState | None = None, need_weights=False):
        """Final hidden states (B, L, d) and per-layer attention weights.

        Training passes right-padded tokens alone: pads only follow real tokens, so the causal
        mask is exact for every real query and the fused causal kernel is used. Generation passes
        `valid` (left-padded prompts) and a `state` to decode incrementally.
        """
        if valid is None and state is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            return self.stack(tokens, positions, is_causal=True, need_weights=need_weights)
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        if state is not None and state.capacity is not None:  # fixed layout: the whole buffer, masked
            positions = state.place(valid)
            return self.stack(tokens, positions, mask=state.slot_mask(), key_positions=state.key_positions,
                              caches=state.caches, need_weights=need_weights)
        mask, is_causal = None, False
        if state is None:  # a left-padded batch in one call (the uncached reference in tests)
            key_valid, key_positions = valid, (valid.long().cumsum(1) - 1).clamp(min=0)
            positions = key_positions
        else:
            positions = state.place(valid)
            key_valid, key_positions = state.key_valid, state.key_positions
        n_new, n_keys = tokens.shape[1], key_valid.shape[1]
        if state is not None and not state.padded and (n_new == 1 or n_new == n_keys):
            # Unpadded: one new token sees every key, and a first call is plain causal, so the
            # fused kernels run without a mask (most of a decoding step's fixed cost on CPU).
            is_causal = n_new > 1
        else:
            mask = causal_padding_mask(key_valid, n_new)
        return self.stack(
            tokens, positions, mask=mask, is_causal=is_causal, key_positions=key_positions,
            caches=state.caches if state is not None else None, need_weights=need_weights,
        )

    def forward(self, tokens, valid=None, state: DecodeState | None = None) -> torch.Tensor:
        """Logits (B, L, V)."""
        hidden, _ = self.hidden(tokens, valid, state)
        return self.stack.embedding.logits(hidden)
