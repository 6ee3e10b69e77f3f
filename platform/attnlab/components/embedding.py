"""Token embeddings and the output projection, optionally tied (one matrix, as in the paper)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.components.config import BackboneConfig


class TokenEmbedding(nn.Module):
    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, cfg.d_model))
        # Scaled embeddings start at std d^-0.5 so that sqrt(d) * E has unit scale (as fairseq).
        nn.init.normal_(self.weight, std=cfg.d_model**-0.5 if cfg.scale_embeddings else 0.02)
        with torch.no_grad():
            self.weight[pad_id].zero_()
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight) * self.scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden) if self.output is not None else F.linear(hidden, self.weight)
