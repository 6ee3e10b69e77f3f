"""One run folder per run: its version is the same on every rank and node, and one process at a
time writes it.

The version (`runs/<name>/<version>/`) is, in order: `--run.version`; rank zero's, inherited by
the processes Lightning starts itself; for a `fit`, the launcher's job id, so that every node of a
torchrun or SLURM job agrees and a relaunch of the same job resumes it; else rank zero's
timestamp, broadcast through torchrun's store (an elastic restart finds the same one there and
resumes it). Timestamps are never taken on other ranks, whose clocks may differ.

A job id names a fit, not a job: `test`, `validate` and `predict` in the same job get their own
folder (a timestamp; under srun, which has no store, the job id, the command and the job step),
so they never write into a fit's folder. torchrun's `--standalone` makes up a random id per
launch, which the same command would never find again: it counts as no job id.

The process that writes a run folder holds an exclusive `flock` on `<folder>/.lock`, holding its
PID and host. A second command on the folder is refused in one line naming them. The kernel
releases the lock when its process dies, however it dies, so a killed run's lock is simply taken.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from attnlab.errors import ConfigError

INHERITED = "ATTNLAB_RUN_VERSION"  # rank zero's version, for the processes Lightning starts
LOCK_FILE = ".lock"
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # torchrun --standalone's id


@dataclass(frozen=True)
class Version:
    name: str
    named: bool  # the folder may hold an earlier segment of this run: look for its last.ckpt
    source: str = "--run.version"  # what finds it again: --run.version, --rdzv-id, SLURM_JOB_ID, or "timestamp"


def is_global_rank_zero() -> bool:
    """Whether this process is rank zero of its job, before any process group exists."""
    return all(int(os.environ.get(variable) or 0) == 0 for variable in _RANK_VARIABLES)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)


def slurm_batch_job() -> bool:
    """Whether Lightning takes this process for a SLURM job (SLURMEnvironment.detect: its requeue
    is on), one task included; a job named bash or interactive is a shell, not a job."""
    return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def launcher_job_id() -> tuple[str, str] | None:
    """(version, its source) from the launcher of a job of several processes, or of a SLURM batch
    job of one (a requeued job resumes its folder), if it names the job."""
    if world_size() < 2 and not (slurm_batch_job() and os.environ.get("SLURM_JOB_ID")):
        return None
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none" and not _UUID.fullmatch(run_id):
        return f"torchrun-{run_id}", "--rdzv-id"
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}", "SLURM_JOB_ID"
    return None


def resolve_version(version: str | None, folder_of, command: str = "fit") -> Version:
    """The run's version (see the module docstring). `folder_of(version)` is the run folder a
    version names; `command` is the subcommand (only a fit is named by a job id)."""
    if version:
        return Version(version, named=True)
    inherited = os.environ.get(INHERITED)
    if inherited and not is_global_rank_zero():
        return Version(inherited, named=False, source="timestamp")
    job = launcher_job_id()
    if job is not None and command == "fit":
        return Version(job[0], named=True, source=job[1])
    if job is not None and world_size() > 1 and not _has_agent_store() and os.environ.get("SLURM_JOB_ID"):  # srun: no store to share through
        step = os.environ.get("SLURM_STEP_ID", "0")
        restart = os.environ.get("SLURM_RESTART_COUNT", "0")
        name = f"{job[0]}-{command}-{step}" + (f"-r{restart}" if restart != "0" else "")
        return Version(name, named=False, source=job[1])
    if world_size() > 1:
        stamp, again = _broadcast_from_rank_zero(lambda: _new_stamp(folder_of), command)
        return Version(stamp, named=again, source="timestamp")
    stamp = _new_stamp(folder_of)
    os.environ[INHERITED] = stamp
    return Version(stamp, named=False, source="timestamp")


def _new_stamp(folder_of) -> str:
    """A timestamp whose folder this call creates (a suffix when taken, also by a command started
    in the same second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    version, n = stamp, 1
    while True:
        try:
            folder_of(version).mkdir(parents=True)
            return version
        except FileExistsError:
            version, n = f"{stamp}-{n}", n + 1


def _has_agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _agent_store():
    """torchrun's store (the one its workers rendezvous through), as a client, or None."""
    if not _has_agent_store():
        return None
    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(minutes=5))


def _broadcast_from_rank_zero(pick, command: str) -> tuple[str, bool]:
    """(rank zero's pick, whether an earlier attempt of this launch picked it). The store outlives
    the workers of an elastic restart, so a restarted fit finds the folder it was writing."""
    store = _agent_store()
    if store is None:  # no store to share through: a job without a job id must name its run
        raise ConfigError("a job of several processes without a launcher job id (torchrun --rdzv-id, SLURM_JOB_ID): "
                          "add --run.version NAME to every process's command so all of them write one run folder")
    key = f"attnlab/run_version/{command}"
    again = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and store.check([key])
    if is_global_rank_zero() and not again:
        version = pick()
        store.set(key, version)
        return version, False
    return store.get(key).decode(), again


def _holder(fd: int) -> str:
    """`PID <pid> on <host>` as the lock's holder wrote it; a holder that has just taken the lock
    writes right after, so wait up to a second for it rather than print "PID ?"."""
    for _ in range(20):
        words = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
        if len(words) >= 2:
            return f"PID {words[0]} on {words[1]}"
        time.sleep(0.05)
    return "another process (it has not written its PID)"


class RunFolderLock:
    """An exclusive lock on a run folder while this process writes it (see the module docstring).
    `kind` names the folder and `fix` says what to do in the refusal."""

    held: dict[Path, "RunFolderLock"] = {}

    def __init__(self, folder: Path, kind: str = "run folder",
                 fix: str = "wait for that run to end (or stop it), or choose another --run.version"):
        self.folder = Path(folder).absolute()
        self.kind, self.fix = kind, fix
        self._fd: int | None = None

    def acquire(self) -> "RunFolderLock":
        if self.folder in RunFolderLock.held:
            return RunFolderLock.held[self.folder]
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"{self.kind} {self.folder} is in use by {holder}: {self.fix}") from None
        except OSError as err:  # a file system without locks (some network mounts): run, and say so
            os.close(fd)
            print(f"attnlab: {self.folder} cannot be locked ({err.strerror}): nothing stops a second command "
                  "from writing this folder at the same time", file=sys.stderr, flush=True)
            return self
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        RunFolderLock.held[self.folder] = self
        return self

    @property
    def locked(self) -> bool:
        """Whether this process holds the lock (not so on a file system without locks)."""
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        RunFolderLock.held.pop(self.folder, None)


def hold_run_folder(folder: Path) -> RunFolderLock | None:
    """Lock `folder` on rank zero (the process that writes it); other ranks hold nothing. The
    first time, the temporaries of writes that a killed process left (`.<name>.partial`, see
    attnlab.checkpoints.atomic and .sharded_steps) go: no one else writes the folder while its
    lock is held."""
    if not is_global_rank_zero():
        return None
    taken = Path(folder).absolute() in RunFolderLock.held
    lock = RunFolderLock(folder).acquire()
    if not taken and lock.locked:
        for orphan in Path(folder).rglob(".*.partial"):  # a file, or a sharded checkpoint's step folder
            shutil.rmtree(orphan, ignore_errors=True) if orphan.is_dir() else orphan.unlink(missing_ok=True)
    return lock


@contextlib.contextmanager
def releasing_run_folders():
    """Let the folders a command locked go when it ends, as a process's exit would (a command run
    in-process: a notebook, the tests); those held before it (a sweep's own) stay held."""
    before = set(RunFolderLock.held)
    try:
        yield
    finally:
        for folder, lock in list(RunFolderLock.held.items()):
            if folder not in before:
                lock.release()


def in_use_under(folder: Path) -> str | None:
    """Who holds a lock on `folder` or on a run folder inside it (`PID .. on ..`), if anyone: a
    folder a live command writes must not be moved or deleted."""
    for lock_file in sorted(Path(folder).rglob(LOCK_FILE)):
        try:
            fd = os.open(lock_file, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd)
        except OSError:
            continue
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None
