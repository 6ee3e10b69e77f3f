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
    Appends write into a buffer with spare room (doubled when full), so a step copies only the
    new keys, not the whole cache as torch.cat would. `k` / `v` are views of the filled part;
    whoever replaces them (a fork's result, a reorder) simply gets a fresh buffer at the next append.
    """

    MIN_CAPACITY = 64

    def __init__(self, static: bool = False):
        self.static = static
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None or self.static:
            self.k, self.v = k, v
            return k, v
        n, total = len(self), len(self) + k.shape[2]
        k_buffer, v_buffer = self._room_for(total)
        k_buffer[:, :, n:total] = k
        v_buffer[:, :, n:total] = v
        self.k, self.v = k_buffer[:, :, :total], v_buffer[:, :, :total]
        return self.k, self.v

    def _owns_buffers(self) -> bool:
        """True when k / v are still the leading part of this cache's own buffers."""
        if self._buffers is None:
            return False
        k_buffer, v_buffer = self._buffers
        return (self.k.data_ptr() == k_buffer.data_ptr() and self.v.data_ptr() == v_buffer.data_ptr()
                and self.k.shape[:2] == k_buffer.shape[:2] and self.k.stride() == k_buffer.stride())

    def _room_for(self, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._owns_buffers() and self._buffers[0].shape[2] >= total:
            return self._buffers
        capacity = max(2 * total, self.MIN_CAPACITY)
        buffers = []
        for cached in (self.k, self.v):
            buffer = cached.new_empty(*cached.shape[:2], capacity, cached.shape[3])
            buffer[:, :, : cached.shape[2]] = cached
            buffers.append(buffer)
        self._buffers = tuple(buffers)
        return self._buffers

    def fork(self) -> "KVCache":
        """A cache that starts from this one's keys and values (no copy) but whose updates stay
        its own: block diffusion reads the clean blocks' cache while a noisy block is denoised."""
        other = KVCache(self.static)
        other.k, other.v = self.k, self.v
        return other

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows (beam search keeps the surviving hypotheses); the spare room moves along."""
        if self.k is None:
            return
        n = len(self)
        if self._owns_buffers():
            self._buffers = tuple(buffer.index_select(0, index) for buffer in self._buffers)
            self.k, self.v = self._buffers[0][:, :, :n], self._buffers[1][:, :, :n]
        else:
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
            self.qkv_proj = nn.Linear(cfg.d_model, q_size + kv_size, bias=cfg.bias)
            # Rows [q | k | v]; initialised part by part, as q_proj and kv_proj would be (the stack reads this).
            self.qkv_proj.init_rows = [q_size, kv_size]
            self.q_proj = self.kv_proj = None
        else:
            self.qkv_proj = None
            self.q_proj = nn.Linear(cfg.d_model, q_size, bias=cfg.bias)
            self.kv_proj = nn.Linear(cfg.d_model, kv_size, bias=cfg.bias)
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
            q, k, v = self.project_qkv(x)
        elif self.qkv_proj is not None:
            raise ValueError("fused q/k/v is self-attention only: build cross-attention with cross_attention=True")
        else:
            q = self._split(self.q_proj(x), self.n_heads)
        if cache is not None and cache.static and len(cache):
            k, v = cache.k, cache.v
        else:
            if context is not None:
                k, v = self.project_kv(context)
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
