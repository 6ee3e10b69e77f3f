"""When a rank of a distributed run dies or hangs: the others stop in bounded time with one line,
and no process is left behind; a successful run tears its process group down cleanly."""
from __future__ import annotations

import subprocess
import threading
import time

import lightning as L

from attnlab.compat import private_api as private

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
        if thread.name == "child-process-observer":
            private.put(thread, "_run", lambda: True)


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
