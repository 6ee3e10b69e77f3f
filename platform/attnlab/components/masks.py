"""Boolean attention masks (True = may attend), shaped to broadcast against (B, H, Lq, Lk).

Every mask keeps at least one visible key per query row (a pad query sees itself), so no
backend ever softmaxes an all-masked row into NaN.
"""
from __future__ import annotations

import torch


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Lq, Lk): query i, standing at absolute index n_keys - n_queries + i, sees keys up to it."""
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None] + offset
    k = torch.arange(n_keys, device=device)[None, :]
    return k <= q


def self_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Lq, Lk): True where the key is the query itself (queries are the last Lq keys)."""
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None] + offset
    return torch.arange(n_keys, device=device)[None, :] == q


def padding_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, 1, Lk) from a (B, Lk) bool tensor of real (non-pad) keys."""
    return key_valid[:, None, None, :]


def lengths_to_valid(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, L) bool: True on the first `lengths[b]` positions."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def causal_padding_mask(key_valid: torch.Tensor, n_queries: int) -> torch.Tensor:
    """(B, 1, Lq, Lk): causal over all keys, pads hidden, every query sees at least itself."""
    n_keys = key_valid.shape[1]
    device = key_valid.device
    visible = padding_mask(key_valid) | self_mask(n_queries, n_keys, device)
    return causal_mask(n_queries, n_keys, device) & visible


def prefix_mask(prefix_lengths: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L): prefix-LM; the first prefix_lengths[b] tokens see each other, the rest is causal."""
    n = key_valid.shape[1]
    in_prefix = lengths_to_valid(prefix_lengths, n)
    both_in_prefix = in_prefix[:, None, :, None] & in_prefix[:, None, None, :]
    return causal_padding_mask(key_valid, n) | (both_in_prefix & padding_mask(key_valid))
