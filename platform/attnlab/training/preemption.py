"""A preempted fit saves last.ckpt at the step it reached and says so with its exit status.

SLURM and Kubernetes preempt with SIGTERM; a terminal sends SIGINT (Ctrl-C); some schedulers
warn with SIGUSR1. Each one stops the fit at the end of the current training step, on every
rank at the same step, with last.ckpt written exactly as the periodic save writes it (so the same
command resumes to the metrics an uninterrupted run would have), one line that says so, and exit
status `EXIT_INTERRUPTED`, so that a job script or the sweep can tell a preempted fit from a
finished one (0) and from a failed one (1, or 2 for bad input).

While training runs, these handlers replace Lightning's SIGTERM handler, which would stop a
validation half-way and leave last.ckpt at its previous save: a signal during validation stops
the fit after the next training step instead. A validation due right after the step that saw the
signal (an epoch's end, val_check_interval, FinalValidation) still runs, and the stop follows it:
a resumed run starts after that validation and would never run it (seen: an epoch's validation
row and best-checkpoint candidate lost). last.ckpt, saved before it, is saved again after it. Outside training (setup, the sanity check)
Lightning's handler stops the command with the same status. Under Lightning's SLURM auto-requeue,
SIGUSR1 and SIGTERM stay Lightning's. A second Ctrl-C stops at once.
"""
from __future__ import annotations

import signal
import threading

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from attnlab.compat import private_api as private
from attnlab.errors import Preempted


class Preemption(Callback):
    """See the module docstring. `resume_hint`: how the user resumes this run folder."""

    def __init__(self, resume_hint: str = "the same command resumes"):
        self.resume_hint = resume_hint
        self._signal: str | None = None
        self._stopping: str | None = None
        self._previous: dict = {}

    def _catch(self, signum, frame) -> None:
        if self._signal is not None and signum == signal.SIGINT:  # the second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._signal = signal.Signals(signum).name

    def on_train_start(self, trainer, pl_module) -> None:
        self._signal = self._stopping = None
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only
        environment = getattr(trainer.strategy, "cluster_environment", None)  # a single device has none
        requeue = isinstance(environment, SLURMEnvironment) and environment.auto_requeue
        for signum in (signal.SIGINT,) if requeue else (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            self._previous[signum] = signal.signal(signum, self._catch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        received = self._signal or ("SIGTERM" if trainer.received_sigterm else None)
        stop = received is not None
        if trainer.world_size > 1:  # every rank stops at the same step (one of them may not have the signal yet)
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        last = self._save_last(trainer)
        where = f"; last.ckpt saved in {last.dirpath}" if last is not None else ""
        self._stopping = f"interrupted ({received or 'another rank was'}) at step {trainer.global_step}{where}; {self.resume_hint}"

    # The stop itself comes at the next hook, once Lightning has logged the step just saved (the
    # resumed run starts after it and would not log it again), and after a validation due at it.
    def _stop(self, *args) -> None:
        if self._stopping is not None:
            message, self._stopping = self._stopping, None
            self._say(message)
            raise Preempted(message)

    on_train_batch_start = on_train_epoch_end = on_train_end = _stop

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._stopping is not None:
            self._say(f"stopping after the validation due at step {trainer.global_step} (a resumed run would skip it)")

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._stopping is not None:  # last.ckpt again, now after the validation (see the module docstring)
            self._save_last(trainer)

    @staticmethod
    def _save_last(trainer):
        last = next((c for c in trainer.checkpoint_callbacks if getattr(c, "save_last", False)), None)
        if last is not None:  # ModelCheckpoint's own last.ckpt save (see attnlab.compat.private_api)
            private.get(last, "_save_last_checkpoint")(trainer, private.get(last, "_monitor_candidates")(trainer))
        return last

    @rank_zero_only
    def _say(self, message: str) -> None:
        print(f"\n{message}", flush=True)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
