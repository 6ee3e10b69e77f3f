"""A guard that stops a run cleanly instead of letting it go bad.

NonFiniteLossGuard: a NaN / inf training loss stops the run before the backward pass, so the
weights never see the poisoned gradients and no checkpoint is written from them (Lightning's
ModelCheckpoint does not save on an exception unless `save_on_exception=True`). Every rank joins
one reduction of the flag per step, so under DDP / FSDP all ranks stop at the same step.
"""
from __future__ import annotations

import math

import lightning as L
import torch

from attnlab.errors import AttnlabError


class NonFiniteLossError(AttnlabError):
    """The training loss became NaN or infinite; the message names the step and what to try."""


class NonFiniteLossGuard(L.Callback):
    """Raise NonFiniteLossError when the loss about to be backpropagated is not finite (on any rank)."""

    _batch_idx = -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch_idx = batch_idx

    def on_before_backward(self, trainer, pl_module, loss):
        value = loss.detach()
        bad = not bool(torch.isfinite(value).all())
        if trainer.world_size > 1:
            # any(): one all-reduce that every rank joins every step, so all ranks stop together.
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return
        shown = float(value.float().reshape(-1)[0]) if value.numel() else math.nan
        what = f"is {shown}" if not math.isfinite(shown) else "is not finite on another rank"
        last = _last_checkpoint(trainer)
        kept = (f"; the last good checkpoint is kept: {last} (resume from it only with a change below)"
                if last else "; no checkpoint had been written yet")
        raise NonFiniteLossError(
            f"the training loss {what} at global step {trainer.global_step} "
            f"(epoch {trainer.current_epoch}, batch {self._batch_idx}); stopped before updating the weights{kept}. "
            "Try a lower learning rate (--model.init_args.optimizer.lr), gradient clipping "
            "(--trainer.gradient_clip_val 1.0), or float32 instead of bf16/16-mixed (--trainer.precision 32-true)"
        )


def _last_checkpoint(trainer) -> str | None:
    """The newest last.ckpt any checkpoint callback wrote (LastCheckpoint writes it, not the
    best-by-val/nll callback), else the best checkpoint."""
    callbacks = trainer.checkpoint_callbacks
    last = [c.last_model_path for c in callbacks if getattr(c, "last_model_path", "")]
    best = [c.best_model_path for c in callbacks if getattr(c, "best_model_path", "")]
    return (last or best or [None])[0]
