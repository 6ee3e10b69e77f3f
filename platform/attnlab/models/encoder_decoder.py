"""The 2017 translation transformer: a bidirectional encoder and a causal decoder with cross-attention."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnlab.components import BackboneConfig, DecodeState, TransformerStack
from attnlab.components.masks import causal_mask, causal_padding_mask, padding_mask


@dataclass
class EncodedSource:
    """The encoder's output for a batch of sources."""

    memory: torch.Tensor  # (B, S, d)
    mask: torch.Tensor  # (B, 1, 1, S) bool, True on real source tokens


class EncoderDecoderModel(nn.Module):
    def __init__(
        self,
        cfg: BackboneConfig,
        vocab_size: int,
        pad_id: int = 0,
        n_encoder_layers: int | None = None,
        share_embeddings: bool = True,
    ):
        """`cfg.n_layers` decoder layers; `n_encoder_layers` (default: the same) encoder layers.

        With a joint vocabulary, `share_embeddings` ties source, target and output embeddings
        into one matrix, as the paper does.
        """
        super().__init__()
        encoder_cfg = replace(cfg, n_layers=n_encoder_layers or cfg.n_layers)
        self.encoder = TransformerStack(encoder_cfg, vocab_size, pad_id=pad_id)
        self.decoder = TransformerStack(
            cfg, vocab_size, cross_attention=True, pad_id=pad_id,
            embedding=self.encoder.embedding if share_embeddings else None,
        )
        self.pad_id = pad_id

    def encode(self, source: torch.Tensor, source_valid: torch.Tensor, need_weights: bool = False):
        """Bidirectional self-attention over real source tokens (pads are never attended to)."""
        positions = torch.arange(source.shape[1], device=source.device)
        mask = padding_mask(source_valid)
        memory, weights = self.encoder(source, positions, mask=mask, need_weights=need_weights)
        return EncodedSource(memory, mask), weights

    def decode(self, target_in: torch.Tensor, source: EncodedSource | None = None, state: DecodeState | None = None,
               valid: torch.Tensor | None = None, need_weights: bool = False):
        """Decoder hidden states for `target_in`: right-padded targets against `source` in training,
        or the next tokens against a `state` from `start_state` (which holds the source's K/V);
        `valid` marks left padding of decoder prefixes of different lengths (continuing text)."""
        past = len(state) if state is not None else 0
        n = target_in.shape[1]
        positions = torch.arange(past, past + n, device=target_in.device)
        key_positions = torch.arange(past + n, device=target_in.device)
        if state is None:  # training: pads only follow real tokens, so causal alone is exact
            mask, is_causal = None, True
            context, context_mask = source.memory, source.mask
        elif state.capacity is not None:  # fixed layout: the whole buffer, masked
            is_causal, context, context_mask = False, None, state.context_mask
            valid = torch.ones_like(target_in, dtype=torch.bool) if valid is None else valid
            positions = state.place(valid)
            mask, key_positions = state.slot_mask(), state.key_positions
        else:
            is_causal = False
            context, context_mask = None, state.context_mask
            valid = torch.ones_like(target_in, dtype=torch.bool) if valid is None else valid
            row_positions = state.place(valid)
            if state.padded:  # left-padded prefixes: positions count real tokens, pads are hidden
                positions, key_positions = row_positions, state.key_positions
                mask = causal_padding_mask(state.key_valid, n)
            else:
                mask = causal_mask(n, past + n, target_in.device) if n > 1 else None
        return self.decoder(
            target_in, positions, mask=mask, is_causal=is_causal, key_positions=key_positions,
            context=context, context_mask=context_mask,
            caches=state.caches if state is not None else None, need_weights=need_weights,
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.embedding.logits(hidden)

    def forward(self, source, source_valid, target_in) -> torch.Tensor:
        encoded, _ = self.encode(source, source_valid)
        hidden, _ = self.decode(target_in, encoded)
        return self.logits(hidden)

    def start_state(self, source: EncodedSource, repeat: int = 1, capacity: int | None = None) -> DecodeState:
        """A decoding state whose cross-attention K/V are computed once per source, then repeated
        per beam; the memory itself is not kept (nor copied per beam step), only its mask.
        `capacity`: a fixed-capacity self-attention cache (DecodeState.fixed)."""
        mask = source.mask.repeat_interleave(repeat, 0)
        state = DecodeState.new(len(self.decoder.layers), len(mask), mask.device, capacity, context_mask=mask)
        for cache, layer in zip(state.caches, self.decoder.layers):
            k, v = layer.cross_attn.inner.project_kv(source.memory)
            cache.cross_attn.update(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0))
        return state
