"""Optimizer and learning-rate schedules shared by every family."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import torch

from attnlab.components.embedding import TokenEmbedding
from attnlab.errors import ConfigError

SCHEDULES = ("cosine", "inverse_sqrt", "noam", "constant")


@dataclass
class OptimizerConfig:
    """AdamW with linear warmup, then cosine decay to `min_lr_ratio`, inverse-sqrt, or constant.

    `noam` is the paper's rate: lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), so
    there `lr` is a scale (1.0 in the paper) rather than the peak.

    `warmup_ratio` (when set, instead of `warmup_steps`): the warmup as a share of the run's
    optimizer steps, so runs whose budgets give them different step counts warm up alike.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.01
    schedule: str = "cosine"
    warmup_steps: int = 200
    warmup_ratio: float | None = None
    min_lr_ratio: float = 0.1
    label_smoothing: float = 0.0

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optimizer.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.lr <= 0:
            raise ConfigError(f"optimizer.lr={self.lr} must be > 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"optimizer.warmup_steps={self.warmup_steps} must be >= 0")
        ratio = self.warmup_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1):
            raise ConfigError(f"optimizer.warmup_ratio={ratio!r} must be a share of the run's steps in [0, 1) "
                              "(e.g. 0.1), or null to warm up for warmup_steps")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"optimizer.label_smoothing={self.label_smoothing} must be in [0, 1)")

    def warmup(self, total_steps: int) -> int:
        """Warmup steps of a run of `total_steps` optimizer steps."""
        return self.warmup_steps if self.warmup_ratio is None else round(self.warmup_ratio * total_steps)


def lr_multiplier(cfg: OptimizerConfig, step: int, total_steps: int, d_model: int = 512) -> float:
    """Factor on `lr` at optimizer step `step` (0-based)."""
    step += 1
    warmup_steps = cfg.warmup(total_steps)
    warmup = max(warmup_steps, 1)
    if cfg.schedule == "noam":
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if step <= warmup_steps:
        return step / warmup
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(warmup / step)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _is_embedding_or_norm(module: torch.nn.Module) -> bool:
    """Tables (nn.Embedding, the token embedding, a learned position table) and normalization
    layers (LayerNorm, RMSNorm, any *Norm / *Norm2d class), whatever they are named."""
    return isinstance(module, (torch.nn.Embedding, TokenEmbedding)) or bool(re.search(r"Norm(\d+d)?$", type(module).__name__))


def decay_groups(module: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The names of the trainable parameters that get weight decay, and of those that do not, in
    `named_parameters` order (an optimizer's state is restored by position). Decided by type, not
    by name: every matrix decays but those of embedding and normalization modules; no vector does.
    A parameter shared with an embedding (a tied output projection) is the embedding's."""
    exempt = {id(param) for owner in module.modules() if _is_embedding_or_norm(owner)
              for param in owner.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in exempt else no_decay).append(name)
    return decay, no_decay


def build_optimizer(module: torch.nn.Module, cfg: OptimizerConfig, horizon: Callable[[], int], d_model: int):
    """AdamW; weight decay on matrices only (not biases, norms or embeddings: see `decay_groups`).
    `horizon()`: the run's optimizer steps, read at every step, since a budget may move the last
    one while the run trains (attnlab.training.ledger)."""
    params = dict(module.named_parameters())
    decay, no_decay = ([params[name] for name in names] for names in decay_groups(module))
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(cfg, step, horizon(), d_model)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
