"""Per-row losses of a batch: what every family's `loss_terms` returns and the pieces it is built from.

Per-row sums (not a batch mean) let evaluation count every example once and save per-example
likelihoods, and let distributed training normalise by the global token count.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class LossTerms(NamedTuple):
    """loss: training objective sums (B,); nll: negative log-likelihood sums in nats (B,) (a bound
    for block diffusion); targets: target tokens per row (B,); inputs: tokens fed to the model;
    flops: training FLOPs of the batch (attnlab.training.flops.FlopCounter), for train/mfu."""

    loss: torch.Tensor
    nll: torch.Tensor
    targets: torch.Tensor
    inputs: int
    flops: float = 0.0


def token_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, excluded: int | None = None):
    """Per-token training loss (label-smoothed) and NLL, each (N,), from one log-softmax.

    smoothed = (1 - eps) * nll + eps * mean over the vocabulary of -log p, as torch's
    cross_entropy(label_smoothing=eps); an `excluded` token (block diffusion's mask, logit -inf)
    is left out of the mean.
    """
    log_probs = logits.log_softmax(dim=-1)
    nll = -log_probs.gather(1, labels[:, None]).squeeze(1)
    if not label_smoothing:
        return nll, nll
    if excluded is None:
        uniform = -log_probs.mean(dim=-1)
    else:
        uniform = -log_probs.index_fill(-1, torch.tensor([excluded], device=logits.device), 0.0).sum(-1)
        uniform = uniform / (logits.shape[-1] - 1)
    return (1 - label_smoothing) * nll + label_smoothing * uniform, nll


def row_sums(rows: torch.Tensor, n_rows: int, *values: torch.Tensor) -> list[torch.Tensor]:
    """Per-row sums (n_rows,) of per-token values, given each token's row: one index_add for all."""
    out = values[0].new_zeros(n_rows, len(values))
    out.index_add_(0, rows, torch.stack(values, dim=1))
    return list(out.unbind(1))


def target_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, labelled: torch.Tensor):
    """Per-row training loss and NLL sums (B,) over the `labelled` positions of a (B, L) layout,
    from those positions' logits (N, V) and labels (N,)."""
    smoothed, nll = token_losses(logits, labels, label_smoothing)
    return row_sums(labelled.nonzero()[:, 0], len(labelled), smoothed, nll)
