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

    def new_state(self, batch_size: int, capacity: int, device=None) -> DecodeState:
        """A decoding state whose caches hold `capacity` tokens per row before they grow."""
        return DecodeState.new(len(self.stack.layers), batch_size, capacity, device)

    def hidden(self, tokens, valid=None, state: DecodeState | None = None, need_weights=False):
        """Final hidden states (B, L, d) and per-layer attention weights.

        Training passes right-padded tokens alone: pads only follow real tokens, so the causal
        mask is exact for every real query and the fused causal kernel is used. Generation passes
        a `state` to decode incrementally (`valid`: left padding of prompts); `valid` without a
        state runs a left-padded batch in one call (the uncached reference in tests).
        """
        if state is not None:
            return state.forward(self.stack, tokens, valid), []
        if valid is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            return self.stack(tokens, positions, is_causal=True, need_weights=need_weights)
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        return self.stack(tokens, positions, mask=causal_padding_mask(valid, tokens.shape[1]),
                          key_positions=positions, need_weights=need_weights)

    def forward(self, tokens, valid=None, state: DecodeState | None = None) -> torch.Tensor:
        """Logits (B, L, V)."""
        hidden, _ = self.hidden(tokens, valid, state)
        return self.stack.embedding.logits(hidden)
