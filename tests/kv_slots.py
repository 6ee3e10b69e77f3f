"""Driving one layer's KVCache without a DecodeState, for attention-level tests."""
from __future__ import annotations

import torch


def open_slots(cache, rows: int, n: int) -> None:
    """What DecodeState.forward does to each layer's cache before a call of n real tokens per row:
    point it at the next n slots and at the prefix that ends with them (growing it when full)."""
    start = cache.span
    if start + n > cache.capacity:
        cache.grow(2 * (start + n), start)
    cache.prepare(start + n, torch.arange(start, start + n).expand(rows, n))
