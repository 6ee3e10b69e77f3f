"""Multi-head attention for self- and cross-attention, shared by every family.

`n_kv_heads` < `n_heads` gives GQA (1 gives MQA). Backends compute the same function:
`sdpa` calls torch's fused kernel; `math` is the explicit softmax, the reference in tests,
and the one that can return the attention weights.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from attnlab.components.config import BackboneConfig
from attnlab.components.kv_cache import KVCache
from attnlab.components.linear import Linear
from attnlab.components.positional import Rotary, apply_rotary

_compiled_flex = None


def flex_attention_for(q: torch.Tensor):
    """Compiled FlexAttention on GPU (eager flex is a slow O(L²) reference); eager on CPU, for tests."""
    global _compiled_flex
    if not q.is_cuda:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def math_attention(q, k, v, mask=None, is_causal=False, dropout_p=0.0):
    """Explicit softmax(q·kᵀ/√d + mask)·v; returns the output and the weights (B, H, Lq, Lk).

    Grouped keys and values (k, v with H_kv < H heads; head h reads KV head h // (H / H_kv), as
    repeat_interleave would give it) are never repeated: each group's queries are stacked along
    the query axis, so one matmul per KV head serves the whole group.
    """
    b, n_heads, n_q, d = q.shape
    n_kv, n_k = k.shape[1], k.shape[2]
    grouped = q.reshape(b, n_kv, n_heads // n_kv * n_q, d)
    scores = (grouped @ k.transpose(-2, -1)).view(b, n_heads, n_q, n_k) / math.sqrt(d)
    if is_causal and mask is None:  # as in sdpa, an explicit mask wins
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        scores = scores.masked_fill(~causal, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = scores.softmax(dim=-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    out = weights.view(b, n_kv, -1, n_k) @ v
    return out.view(b, n_heads, n_q, v.shape[-1]), weights


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: BackboneConfig, cross_attention: bool = False):
        """`cross_attention`: queries from x, keys and values from a context (the decoder's view of
        the encoder). Only self-attention can fuse its projections (`cfg.fused_qkv`): q, k and v
        then come from one Linear, one GEMM instead of two, which pays on a GPU; cross-attention
        projects different inputs and keeps q_proj + kv_proj.
        """
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.backend = cfg.backend
        self.dropout = cfg.attention_dropout
        q_size, kv_size = cfg.n_heads * cfg.head_dim, 2 * cfg.kv_heads * cfg.head_dim
        if cfg.fused_qkv and not cross_attention:
            self.qkv_proj = Linear(cfg.d_model, q_size + kv_size, bias=cfg.bias)
            # Rows [q | k | v]; initialised part by part, as q_proj and kv_proj would be (the stack reads this).
            self.qkv_proj.init_rows = [q_size, kv_size]
            self.q_proj = self.kv_proj = None
        else:
            self.qkv_proj = None
            self.q_proj = Linear(cfg.d_model, q_size, bias=cfg.bias)
            self.kv_proj = Linear(cfg.d_model, kv_size, bias=cfg.bias)
        self.out_proj = Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.register_buffer("head_mask", torch.ones(cfg.n_heads), persistent=False)
        self.heads_masked = False

    def mask_heads(self, heads: Iterable[int] = ()) -> None:
        """Silence the given heads (evaluation-time ablation); an empty list restores all."""
        self.head_mask.fill_(1.0)
        heads = list(heads)
        if heads:
            self.head_mask[torch.tensor(heads, dtype=torch.long)] = 0.0
        self.heads_masked = bool(heads)

    def _split(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, n_heads, self.head_dim).transpose(1, 2)  # (B, n, H * D) -> (B, H, n, D)

    def project_kv(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H_kv, L, D) of a sequence; cross-attention caches them once per source."""
        k, v = self.kv_proj(source).chunk(2, dim=-1)
        return self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, L, D), keys and values (B, H_kv, L, D) of x (self-attention).

        Fused, the rows of `qkv_proj` are [q | k | v]: the concatenation of q_proj's weight and
        kv_proj's (itself [k | v]), so an unfused checkpoint converts by concatenating."""
        if self.qkv_proj is None:
            return (self._split(self.q_proj(x), self.n_heads), *self.project_kv(x))
        kv_size = self.n_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([self.n_heads * self.head_dim, kv_size, kv_size], dim=-1)
        return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary: Rotary | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Lq, d); context (B, Lk, d) for cross-attention; mask bool (True = attend) or additive float."""
        if context is None:
            q, k, v = self.project_qkv(x)  # (B, H, Lq, D), (B, H_kv, Lq, D) x 2
        elif self.qkv_proj is not None:
            raise ValueError("fused q/k/v is self-attention only: build cross-attention with cross_attention=True")
        else:
            q = self._split(self.q_proj(x), self.n_heads)  # (B, H, Lq, D)
        if cache is not None and cache.static and len(cache):
            k, v = cache.k, cache.v
        else:
            if context is not None:
                k, v = self.project_kv(context)  # (B, H_kv, Lk, D)
            if rotary is not None:
                k = apply_rotary(k, rotary)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H_kv, cached + Lq, D)
        if rotary is not None:
            q = apply_rotary(q, rotary)
        beams = cache.beams if cache is not None and cache.static else 1  # > 1: beams share their source's keys
        if q.shape[0] != k.shape[0] * beams:
            raise ValueError(f"{q.shape[0]} rows of queries against keys of {k.shape[0]} rows, "
                             f"{beams} row(s) of queries each")
        if beams > 1:
            q = _fold_beams(q, beams)  # (S * beams, H, Lq, D) -> (S, H, beams * Lq, D)
        out, weights = self._attend(q, k, v, mask, is_causal, need_weights)  # (B, H, Lq, D)
        if beams > 1:
            out = _unfold_beams(out, beams)
            weights = None if weights is None else _unfold_beams(weights, beams)
        if self.heads_masked:
            out = out * self.head_mask[None, :, None, None].to(out.dtype)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, Lq, H * D)
        return self.out_proj(out), weights

    def _attend(self, q, k, v, mask, is_causal: bool, need_weights: bool):
        grouped = self.n_kv_heads != self.n_heads  # GQA: kernels read each KV head once per group
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if isinstance(mask, BlockMask):  # block diffusion on GPU; the model falls back to dense masks otherwise
            out = flex_attention_for(q)(q, k, v, block_mask=mask, enable_gqa=grouped)
        elif self.backend == "math" or need_weights:
            out, weights = math_attention(q, k, v, mask, is_causal, dropout_p)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal and mask is None,
                enable_gqa=grouped,
            )
        return out, weights


def _fold_beams(q: torch.Tensor, beams: int) -> torch.Tensor:
    """(S * beams, H, n, D) -> (S, H, beams * n, D): a source's beams become one row of queries."""
    rows, heads, n, d = q.shape
    return q.view(rows // beams, beams, heads, n, d).transpose(1, 2).reshape(rows // beams, heads, beams * n, d)


def _unfold_beams(x: torch.Tensor, beams: int) -> torch.Tensor:
    """The inverse of `_fold_beams`, for outputs (S, H, beams * n, D) and weights (S, H, beams * n, L)."""
    sources, heads, folded, last = x.shape
    n = folded // beams
    return x.view(sources, heads, beams, n, last).transpose(1, 2).reshape(sources * beams, heads, n, last)
