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
signal (an epoch's end, val_check_interval, FinalValidation) still runs, and the stop follows it
and the checkpoint callbacks after it (Lightning calls ModelCheckpoint and EarlyStopping last at an
epoch's end): a resumed run starts after that validation and would never run it, so the stop at an
epoch's end waits for the next hook (the next epoch's first step, or the end of training), by
when the epoch's best-checkpoint candidate and early-stopping check are saved. last.ckpt, saved
before the validation, is saved again after it.

Outside training (building the data, setup, after the fit) `outside_training` turns SIGINT and
SIGUSR1 into the same status, with nothing to save; SIGTERM there is Lightning's, and stops the
command with that status too (attnlab.errors.interrupted_status). Under SLURM with Lightning's
auto-requeue (any SLURM batch job, one GPU included), SIGUSR1 and SIGTERM stay Lightning's: it
writes hpc_ckpt_N.ckpt into the run folder and calls `scontrol requeue`, and the requeued job
resumes from it. A second Ctrl-C stops at once.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from attnlab.compat import private_api as private
from attnlab.errors import Preempted
from attnlab.training.run_folder import slurm_batch_job


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
        # The strategy's environment is None on a single device; Lightning's signal connector reads this one.
        environment = private.get(trainer, "_accelerator_connector").cluster_environment
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

    on_train_batch_start = on_train_end = _stop  # not on_train_epoch_end: see the module docstring

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


@contextlib.contextmanager
def outside_training():
    """SIGINT and SIGUSR1 outside training steps stop the command with EXIT_INTERRUPTED and one line,
    instead of Lightning's KeyboardInterrupt path (exit 1) or SIGUSR1's default (the process dies
    with no message). Preemption's handlers take over while training runs. Under Lightning's SLURM
    auto-requeue SIGUSR1 is left alone: Lightning registers its requeue handler only on a signal
    that has none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = [signal.SIGINT] + ([] if slurm_batch_job() else [signal.SIGUSR1])

    def stop(signum, frame):
        message = (f"interrupted ({signal.Signals(signum).name}) outside a training step; nothing was lost since the "
                   "run's last saved checkpoints/last.ckpt, where the same command resumes a fit")
        print(f"\nattnlab: {message}", file=sys.stderr, flush=True)
        raise Preempted(message)

    previous = {signum: signal.signal(signum, stop) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
