"""A transformer layer: self-attention [+ cross-attention] + feed-forward, post- or pre-norm."""
from __future__ import annotations

import torch
from torch import nn

from attnlab.components.attention import MultiHeadAttention
from attnlab.components.config import BackboneConfig
from attnlab.components.feedforward import build_feedforward, build_norm
from attnlab.components.kv_cache import LayerCache


class SubLayer(nn.Module):
    """Residual wrapper: post-norm `norm(x + drop(f(x)))` (the paper) or pre-norm `x + drop(f(norm(x)))`."""

    def __init__(self, cfg: BackboneConfig, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.norm = build_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.norm_position == "pre"

    def forward(self, x: torch.Tensor, *args, **kwargs):
        out = self.inner(self.norm(x) if self.pre_norm else x, *args, **kwargs)
        out, extra = out if isinstance(out, tuple) else (out, None)
        x = x + self.drop(out)
        return (x if self.pre_norm else self.norm(x)), extra


class TransformerLayer(nn.Module):
    def __init__(self, cfg: BackboneConfig, cross_attention: bool = False):
        super().__init__()
        self.self_attn = SubLayer(cfg, MultiHeadAttention(cfg))
        self.cross_attn = SubLayer(cfg, MultiHeadAttention(cfg, cross_attention=True)) if cross_attention else None
        self.ffn = SubLayer(cfg, build_feedforward(cfg))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary=None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, dict]:
        weights = {}
        x, weights["self"] = self.self_attn(
            x, mask=mask, is_causal=is_causal, rotary=rotary,
            cache=cache.self_attn if cache else None, need_weights=need_weights,
        )
        if self.cross_attn is not None:
            x, weights["cross"] = self.cross_attn(
                x, context=context, mask=context_mask,
                cache=cache.cross_attn if cache else None, need_weights=need_weights,
            )
        x, _ = self.ffn(x)
        return x, weights
