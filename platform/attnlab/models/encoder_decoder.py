"""The 2017 translation transformer: a bidirectional encoder and a causal decoder with cross-attention."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnlab.components import BackboneConfig, DecodeState, TransformerStack
from attnlab.components.masks import padding_mask
from attnlab.generation.compiled_step import step_runner


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
        """Decoder hidden states for `target_in`: right-padded targets against `source` in training
        (pads only follow real tokens, so causal alone is exact), or the next tokens against a
        `state` from `start_state`, which holds the source's K/V (`valid`: left padding of decoder
        prefixes of different lengths, when continuing text)."""
        if state is not None:
            return state.forward(self.decoder, target_in, valid), []
        positions = torch.arange(target_in.shape[1], device=target_in.device)
        return self.decoder(target_in, positions, is_causal=True, context=source.memory, context_mask=source.mask,
                            need_weights=need_weights)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.embedding.logits(hidden)

    def forward(self, source, source_valid, target_in) -> torch.Tensor:
        encoded, _ = self.encode(source, source_valid)
        hidden, _ = self.decode(target_in, encoded)
        return self.logits(hidden)

    def start_state(self, source: EncodedSource, capacity: int, beams: int = 1, *, compiled: bool = False) -> DecodeState:
        """A decoding state of `beams` rows per source whose cross-attention K/V are computed once
        per source and never copied: a source's beams read them together (see MultiHeadAttention);
        the memory itself is not kept, only its mask. `capacity`: decoder tokens per row;
        `compiled`: its calls compiled (generation/compiled_step.py)."""
        rows = len(source.mask) * beams
        state = DecodeState.new(len(self.decoder.layers), rows, capacity, source.mask.device, context_mask=source.mask,
                                beams=beams, run=step_runner(compiled))
        for cache, layer in zip(state.caches, self.decoder.layers):  # contiguous: read at every step
            cache.cross_attn.update(*(x.contiguous() for x in layer.cross_attn.inner.project_kv(source.memory)))
        return state
