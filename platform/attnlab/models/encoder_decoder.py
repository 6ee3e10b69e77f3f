"""The 2017 translation transformer: a bidirectional encoder and a causal decoder with cross-attention."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnlab.components import BackboneConfig, LayerCache, TransformerStack
from attnlab.components.masks import causal_mask, padding_mask


@dataclass
class EncodedSource:
    memory: torch.Tensor | None  # (B, S, d); None once every layer's cross-attention K/V are cached
    mask: torch.Tensor  # (B, 1, 1, S) bool, True on real source tokens


@dataclass
class DecoderState:
    """Incremental decoding: per-layer self-attention K/V (growing) and cross-attention K/V (fixed)."""

    caches: list[LayerCache]
    source: EncodedSource
    length: int = 0

    def reorder(self, index: torch.Tensor) -> None:
        for cache in self.caches:
            cache.reorder(index)
        self.source = EncodedSource(None, self.source.mask.index_select(0, index))


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

    def decode(self, target_in: torch.Tensor, source: EncodedSource, state: DecoderState | None = None,
               need_weights: bool = False):
        """Decoder hidden states for `target_in` (right-padded in training, new tokens with a state)."""
        past = state.length if state is not None else 0
        n = target_in.shape[1]
        positions = torch.arange(past, past + n, device=target_in.device)
        if state is None:  # training: pads only follow real tokens, so causal alone is exact
            mask, is_causal = None, True
        else:
            mask = causal_mask(n, past + n, target_in.device) if n > 1 else None
            is_causal = False
            state.length += n
        key_positions = torch.arange(past + n, device=target_in.device)
        hidden, weights = self.decoder(
            target_in, positions, mask=mask, is_causal=is_causal, key_positions=key_positions,
            context=source.memory, context_mask=source.mask,
            caches=state.caches if state is not None else None, need_weights=need_weights,
        )
        return hidden, weights

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.embedding.logits(hidden)

    def forward(self, source, source_valid, target_in) -> torch.Tensor:
        encoded, _ = self.encode(source, source_valid)
        hidden, _ = self.decode(target_in, encoded)
        return self.logits(hidden)

    def start_state(self, source: EncodedSource, repeat: int = 1) -> DecoderState:
        """A decoding state whose cross-attention K/V are computed once per source, then repeated per beam."""
        caches = self.decoder.new_caches()
        for cache, layer in zip(caches, self.decoder.layers):
            k, v = layer.cross_attn.inner.project_kv(source.memory)
            cache.cross_attn.update(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0))
        # The memory itself is no longer needed (and not copied per beam step): only its mask is.
        return DecoderState(caches, EncodedSource(None, source.mask.repeat_interleave(repeat, 0)))
