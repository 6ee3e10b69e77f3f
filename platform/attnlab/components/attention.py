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
from attnlab.components.positional import Rotary, apply_rotary


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer.

    Self-attention appends every step; cross-attention is filled once per source (`static`).
    Keys are stored after the rotary rotation, so cached positions are never recomputed.
    """

    def __init__(self, static: bool = False):
        self.static = static
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None or self.static:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def fork(self) -> "KVCache":
        """A cache that starts from this one's keys and values (no copy) but whose updates stay
        its own: block diffusion reads the clean blocks' cache while a noisy block is denoised."""
        other = KVCache(self.static)
        other.k, other.v = self.k, self.v
        return other

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows (beam search keeps the surviving hypotheses)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


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
    """Explicit softmax(q·kᵀ/√d + mask)·v; returns the output and the weights (B, H, Lq, Lk)."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal and mask is None:  # as in sdpa, an explicit mask wins
        n_q, n_k = scores.shape[-2:]
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        scores = scores.masked_fill(~causal, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = scores.softmax(dim=-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    return weights @ v, weights


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.backend = cfg.backend
        self.dropout = cfg.attention_dropout
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=cfg.bias)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, bias=cfg.bias)
        self.out_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=cfg.bias)
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
        return x.view(b, n, n_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H_kv, L, D) of a sequence; cross-attention caches them once per source."""
        k, v = self.kv_proj(source).chunk(2, dim=-1)
        return self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

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
        q = self._split(self.q_proj(x), self.n_heads)
        if cache is not None and cache.static and len(cache):
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(x if context is None else context)
            if rotary is not None:
                k = apply_rotary(k, rotary)
            if cache is not None:
                k, v = cache.update(k, v)
        if rotary is not None:
            q = apply_rotary(q, rotary)
        if self.n_kv_heads != self.n_heads:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if isinstance(mask, BlockMask):  # block diffusion on GPU; the model falls back to dense masks otherwise
            out = flex_attention_for(q)(q, k, v, block_mask=mask)
        elif self.backend == "math" or need_weights:
            out, weights = math_attention(q, k, v, mask, is_causal, dropout_p)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal and mask is None
            )
        if self.heads_masked:
            out = out * self.head_mask[None, :, None, None].to(out.dtype)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.out_proj(out), weights
