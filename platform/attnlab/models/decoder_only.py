"""GPT-style decoder: one causal stack over `[bos] source [sep] target [eos]` (or plain text)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.components import BackboneConfig, LayerCache, TransformerStack
from attnlab.components.masks import causal_padding_mask


@dataclass
class DecodeState:
    """What incremental decoding remembers: per-layer K/V plus the keys' positions and validity."""

    caches: list[LayerCache]
    key_valid: torch.Tensor  # (B, Lk) bool
    key_positions: torch.Tensor  # (B, Lk)
    next_position: torch.Tensor  # (B,) position of the next real token
    padded: bool = False  # has any key been padding? Until then no call needs a mask

    @classmethod
    def empty(cls, caches: list[LayerCache], batch_size: int, device=None) -> "DecodeState":
        nothing = torch.zeros(batch_size, 0, device=device)
        return cls(caches, nothing.bool(), nothing.long(), torch.zeros(batch_size, dtype=torch.long, device=device))

    def reorder(self, index: torch.Tensor) -> None:
        for cache in self.caches:
            cache.reorder(index)
        self.key_valid = self.key_valid.index_select(0, index)
        self.key_positions = self.key_positions.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)


class DecoderOnlyModel(nn.Module):
    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.stack = TransformerStack(cfg, vocab_size, pad_id=pad_id)

    def new_state(self, batch_size: int, device=None) -> DecodeState:
        return DecodeState.empty(self.stack.new_caches(), batch_size, device)

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
        start = state.next_position if state is not None else torch.zeros_like(tokens[:, 0])
        positions = (start[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)
        key_valid, key_positions = valid, positions
        mask, is_causal = None, False
        if state is not None:
            key_valid = torch.cat((state.key_valid, valid), dim=1)
            key_positions = torch.cat((state.key_positions, positions), dim=1)
            state.key_valid, state.key_positions = key_valid, key_positions
            state.next_position = start + valid.long().sum(1)
            state.padded = state.padded or not bool(valid.all())
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
