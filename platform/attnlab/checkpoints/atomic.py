"""Files written whole or not at all: a temporary file in the same folder, flushed to disk, then
`os.replace`d over the old one.

Lightning's own atomic save stages the file under /tmp and then *moves* it, which across file
systems copies over the old file in place: a disk that fills during that copy truncates the very
checkpoint a run would resume from. Here the temporary file sits beside its target, so the
rename is atomic, and a write that fails (no space, a file-size limit) leaves the previous file
byte-identical and stops the run with one line naming the folder and its free space.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable

from attnlab.errors import NoRoom

_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class WriteFailed(NoRoom):
    """A file could not be written (full disk, quota, size limit); the previous one is intact."""


def _free(folder: Path) -> str:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if free < 1024 or unit == "GB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """`write(file)` into a temporary file beside `path`, then replace `path` with it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would hide the file from a shared project's group
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as err:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        cause = _os_error(err)
        if cause is not None and cause.errno in _NO_ROOM:
            raise WriteFailed(
                f"could not write {path}: {os.strerror(cause.errno)} ({_free(path.parent)} free in {path.parent}); "
                f"the previous {path.name} is intact: free some space (or choose --run.root on another disk) "
                "and run the same command again") from err
        raise
    sync_folder(path.parent)
    return path


def umask() -> int:
    """The process's umask, read without setting it where Linux shows it (os.umask sets it, and a
    file another thread creates in between would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind `err` (torch.save wraps the writer's error in a RuntimeError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        if isinstance(err, RuntimeError) and ("No space left" in str(err) or "file write failed" in str(err)):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def complete_lines(text: str) -> tuple[str, str]:
    """(the complete lines of an appended text file, its unterminated last line): a row is appended
    with its line end, so a last line without one is what a kill or a full disk left of an append."""
    cut = text.rfind("\n") + 1
    return text[:cut], text[cut:]


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_torch_save(obj, path: str | os.PathLike) -> Path:
    import torch  # here, not above: sweeps and reports write text through this module without torch

    return atomic_write(path, lambda f: torch.save(obj, f))
