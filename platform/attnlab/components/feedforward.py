"""Position-wise feed-forward blocks and norms, chosen by name in the backbone config."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.components.config import BackboneConfig
from attnlab.components.linear import Linear


class FeedForward(nn.Module):
    """ReLU (the paper) or GELU: d_model -> d_ff -> d_model."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.up = Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.activation = F.relu if cfg.activation == "relu" else F.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


class SwiGLU(nn.Module):
    """silu(x W) * (x V), projected down (Shazeer, 2020); W and V in one matmul."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.up = Linear(cfg.d_model, 2 * cfg.d_ff, bias=cfg.bias)
        self.down = Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * value)


def build_feedforward(cfg: BackboneConfig) -> nn.Module:
    return SwiGLU(cfg) if cfg.activation == "swiglu" else FeedForward(cfg)


def build_norm(cfg: BackboneConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model)
    return nn.LayerNorm(cfg.d_model, bias=cfg.bias)
