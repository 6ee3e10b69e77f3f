"""Guards that stop a run cleanly instead of letting it go bad.

NonFiniteLossGuard: a NaN / inf training loss stops the run before the backward pass, so the
weights never see the poisoned gradients and no checkpoint is written from them (Lightning's
ModelCheckpoint does not save on an exception unless `save_on_exception=True`). Every rank joins
one reduction of the flag per step, so under DDP / FSDP all ranks stop at the same step.

ChildProcessReaper and describe_distributed_failure: a rank that dies or hangs makes the others
stop in bounded time with one line, and leaves no process behind.
"""
from __future__ import annotations

import math
import subprocess
import threading
import time

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


# ---- distributed runs: a rank that dies or hangs ------------------------------------------------

# How long rank zero lets the processes it started finish on their own after a failure (each of
# them usually hits the same error a moment later and says why) before it kills them.
CHILD_GRACE_SECONDS = 5.0


class ChildProcessReaper(L.Callback):
    """When the run fails on the rank that started the others (Lightning's subprocess launcher:
    `--trainer.devices 2`), stop those processes: one stuck in a collective (or stopped) would
    otherwise outlive the command. Lightning itself only kills them on Ctrl-C."""

    def on_exception(self, trainer, pl_module, exception):
        procs = [p for p in getattr(trainer.strategy.launcher, "procs", None) or [] if p.poll() is None]
        if procs:
            _quiet_lightning_child_observer()
        deadline = time.monotonic() + CHILD_GRACE_SECONDS
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _quiet_lightning_child_observer() -> None:
    """Lightning's child watcher (a thread polling every 5 s) SIGKILLs this process when a child
    exits non-zero, e.g. rank 1 stopping on the same NonFiniteLossError a moment earlier: this
    process would then die as -9 without its message. From here on the reaper owns the cleanup."""
    for thread in threading.enumerate():
        if thread.name == "child-process-observer" and hasattr(thread, "_run"):
            thread._run = lambda: True


# What torch.distributed raises on a surviving rank (gloo / NCCL), and what it means for the user.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote worker",
              "NCCL communicator was aborted", "ProcessGroupNCCL")
_TIMED_OUT = ("Timed out", "timed out", "Timeout", "timeout", "DEADLINE_EXCEEDED")


def close_process_group() -> None:
    """Destroy the default process group at the end of a successful distributed run, while the
    interpreter is fully alive. A gloo group left to interpreter finalisation can abort the process
    (SIGABRT, "terminate called without an active exception") when its worker threads still hold
    tensors of finished collectives (pytorch/pytorch#179291): seen here in ~1 of 10 two-process runs.
    Local to each process (no collective), so ranks that finish at different times are fine."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def describe_distributed_failure(err: BaseException | None) -> str | None:
    """One line for an error that means another rank died or stopped answering; None otherwise."""
    import torch.distributed as dist

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        # gloo's own wording for a peer that stopped answering ("Application timeout caused pair
        # closure") names no backend; it is raised from a barrier or an all-reduce alike.
        backend_error = isinstance(err, getattr(dist, "DistBackendError", ())) or any(
            tag in text for tag in ("gloo", "nccl", "NCCL", "c10d", "pair closure"))
        if isinstance(err, RuntimeError) and backend_error:
            first = (text.strip().splitlines() or [""])[0]
            first = first[:300] + ("..." if len(first) > 300 else "")
            if any(tag in text for tag in _PEER_LOST):
                return (f"another process of this distributed run died ({first}); its output says why, if it "
                        "printed anything (a process killed for memory prints nothing). This process stopped too.")
            if any(tag in text for tag in _TIMED_OUT):
                return (f"another process of this distributed run stopped answering ({first}); the wait is "
                        "bounded by the strategy's timeout (experiments/distributed/*.yaml). This process stopped too.")
        err = err.__cause__ or err.__context__
    return None
