"""Reading and writing data files, shared by every file-backed data module.

One place decides what a readable data file is (UTF-8, optionally gzip, one example per line),
so the parallel and the plain-text modules report the same mistakes the same way: naming the
file, the config argument it came from, the line, and the fix.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tempfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from data_modules.errors import DataError


def require_file(path: str | Path, arg: str, hint: str = "") -> Path:
    """Return `path` as a Path, or raise DataError naming it and the argument it came from."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a directory, not a file" if p.is_dir() else "not found"
        raise DataError(f"{arg}: {what}: {p} (resolved: {p.resolve()}). {hint}".rstrip())
    return p


def iter_lines(path: str | Path, arg: str, hint: str = "") -> Iterator[str]:
    """The lines of a UTF-8 text file (.gz accepted), read as a stream, trailing whitespace stripped.

    Lines are split on "\\n" only (not on the Unicode separators str.splitlines knows), so two
    aligned files stay aligned even when a sentence contains U+2028 or a form feed. A file whose
    lines are all blank is an error, raised once the stream ends.
    """
    p = require_file(path, arg, hint)
    opener = gzip.open if p.suffix == ".gz" else open
    number, blank = 0, True
    try:
        with opener(p, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{arg}: {p}, line {number}: bytes {raw[e.start:e.end]!r} are not valid UTF-8; "
                        "re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
                    ) from e
                if number == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                line = line.rstrip()
                blank = blank and not line
                yield line
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(
            f"{arg}: {p} is not a valid gzip file ({e}); "
            "re-compress it with `gzip`, or drop the .gz suffix if it is plain text"
        ) from e
    if blank:
        raise DataError(f"{arg}: {p} is empty; it must hold one example per line")


def read_lines(path: str | Path, arg: str, hint: str = "") -> list[str]:
    """All lines of a UTF-8 text file (.gz accepted), as `iter_lines` reads them."""
    return list(iter_lines(path, arg, hint))


def sha256_files(paths: list[str | Path]) -> str:
    """Hash of the files' bytes as stored (compressed or not): the identity of a data set."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` (os.replace) only when the block ends without error, so a
    crash or a second process never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)
