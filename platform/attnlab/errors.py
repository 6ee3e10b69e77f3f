"""One error type for every mistake a user can make, so the CLI can print it without a traceback;
and the exit status of a fit stopped by a signal.

A preempted fit (SIGTERM from SLURM or Kubernetes, Ctrl-C, SIGUSR1) saves last.ckpt and exits with
`EXIT_INTERRUPTED`, so that a job script or `attnlab sweep` can tell it from a finished run (0), a
failed one (1) and bad input (2): see attnlab.training.preemption. Kept free of heavy imports: the
CLI reads it for every verb.
"""
from __future__ import annotations

import sys

# Defined in the base package (data_modules imports nothing from attnlab), the same classes here.
from data_modules.errors import AttnlabError, ConfigError, DataError

__all__ = ["AttnlabError", "ConfigError", "DataError", "EXIT_INTERRUPTED", "EXIT_NO_ROOM", "NoRoom", "Preempted",
           "interrupted_status"]


EXIT_INTERRUPTED = 75  # sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry"
EXIT_NO_ROOM = 74  # sysexits.h EX_IOERR: a file could not be written (full disk, quota, file-size limit)


class NoRoom(AttnlabError):
    """No room to write a file (full disk, quota, file-size limit), the previous one intact. Its own
    exit status, so that a sweep stops at the first (every later run would fail the same way) and a
    job script tells it from bad input: the same command, once there is room, resumes."""

    exit_status = EXIT_NO_ROOM


class Preempted(SystemExit):
    """Raised at the end of a training step after a stop signal, once last.ckpt holds that step."""

    def __init__(self, message: str):
        super().__init__(EXIT_INTERRUPTED)
        self.message = message


def interrupted_status(err: SystemExit) -> int | None:
    """EXIT_INTERRUPTED for a fit stopped by a signal, else None (an ordinary exit)."""
    if isinstance(err, Preempted):
        return EXIT_INTERRUPTED  # the callback has said where last.ckpt is
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")
    if exceptions is not None and isinstance(err, exceptions.SIGTERMException):
        print("attnlab: interrupted (SIGTERM) outside a training step; the same command resumes from the run's "
              "last saved checkpoints/last.ckpt", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return None
