"""What a family's `attention_weights` returns: one AttentionMap per attention kind, with labels."""
from __future__ import annotations

from typing import NamedTuple

import torch

SPECIAL_NAMES = ("pad", "unk", "bos", "eos", "sep", "mask")


class AttentionMap(NamedTuple):
    """One figure's worth of attention: weights (layers, heads, Lq, Lk) and the token labels."""

    kind: str
    weights: torch.Tensor
    queries: list[str]
    keys: list[str]


def layer_weights(per_layer: list[dict], kind: str) -> torch.Tensor:
    """(layers, heads, Lq, Lk) float CPU weights of the first row from a stack's per-layer dicts."""
    return torch.stack([layer[kind][0] for layer in per_layer]).float().cpu()


def token_labels(module, ids) -> list[str]:
    """Tick labels: special tokens by name, other pieces as text (ids without a tokenizer)."""
    names = {getattr(module.special, n): f"<{n}>" for n in SPECIAL_NAMES}
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    if module.tokenizer is None:
        return [names.get(i, str(i)) for i in ids]
    return [names.get(i) or module.tokenizer.decode([i]).strip() or "▁" for i in ids]
