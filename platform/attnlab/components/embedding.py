"""Token embeddings and the output projection, optionally tied (one matrix, as in the paper)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.components.config import BackboneConfig
from attnlab.components.linear import Linear, rows_times


class TokenEmbedding(nn.Module):
    """`vocab_size` tokens in a table of `vocab_multiple`-rounded rows.

    A GPU multiplies fastest when the output projection's width is a multiple of 64, so
    `cfg.vocab_multiple` pads the table (and an untied output projection) with rows that no
    token uses. They start at zero and, since `logits` keeps only the first `vocab_size`
    columns, no loss ever reaches them: losses, sampling and the mask token are as unpadded.
    """

    decode_weight: torch.Tensor | None = None  # the tied table's decoding copy (components/linear.py)

    def __init__(self, cfg: BackboneConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.vocab_size = vocab_size
        rows = -(-vocab_size // cfg.vocab_multiple) * cfg.vocab_multiple
        self.weight = nn.Parameter(torch.empty(rows, cfg.d_model))
        # Scaled embeddings start at std d^-0.5 so that sqrt(d) * E has unit scale (as fairseq).
        nn.init.normal_(self.weight[:vocab_size], std=cfg.d_model**-0.5 if cfg.scale_embeddings else 0.02)
        with torch.no_grad():
            self.weight[pad_id].zero_()
            self.weight[vocab_size:].zero_()
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.output = None if cfg.tie_embeddings else Linear(cfg.d_model, rows, bias=False)
        if self.output is not None:
            with torch.no_grad():
                self.output.weight[vocab_size:].zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight) * self.scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, vocab_size) logits: the padded columns are cut off."""
        if self.output is not None:
            logits = self.output(hidden)
        elif self.decode_weight is not None:
            logits = rows_times(hidden, self.weight, self.decode_weight)
        else:
            logits = F.linear(hidden, self.weight)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]
