"""GPT-style decoder: one causal stack over `[bos] source [sep] target [eos]` (or plain text)."""
from __future__ import annotations

import torch
from torch import nn

from attnlab.components import BackboneConfig, DecodeState, TransformerStack
from attnlab.generation.compiled_step import step_runner


class DecoderOnlyModel(nn.Module):
    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.stack = TransformerStack(cfg, vocab_size, pad_id=pad_id)

    def new_state(self, batch_size: int, capacity: int, device=None, *, compiled: bool = False) -> DecodeState:
        """A decoding state whose caches hold `capacity` tokens per row before they grow, whose
        calls are compiled with `compiled` (generation/compiled_step.py)."""
        return DecodeState.new(len(self.stack.layers), batch_size, capacity, device, run=step_runner(compiled))

    def hidden(self, tokens, valid=None, state: DecodeState | None = None, need_weights=False):
        """Final hidden states (B, L, d) and per-layer attention weights.

        Training passes right-padded tokens alone: pads only follow real tokens, so the causal
        mask is exact for every real query and the fused causal kernel is used. Generation passes
        a `state` to decode incrementally (`valid`: left padding of prompts).
        """
        if state is not None:
            return state.forward(self.stack, tokens, valid), []
        if valid is not None:
            raise ValueError("valid (left padding) is read by incremental decoding only: pass a state from new_state")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.stack(tokens, positions, is_causal=True, need_weights=need_weights)

    def forward(self, tokens, valid=None, state: DecodeState | None = None) -> torch.Tensor:
        """Logits (B, L, V)."""
        hidden, _ = self.hidden(tokens, valid, state)
        return self.stack.embedding.logits(hidden)
