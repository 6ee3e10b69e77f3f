"""Files a run writes take the umask's mode, as any other program's do: a shared project folder
(umask 002) needs its group to read checkpoints and summaries (mkstemp alone gives 0600)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conftest import debug_fit_args, run_main


@pytest.fixture
def umask_002():
    previous = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mask", [0o002, 0o027])
def test_an_atomic_write_takes_the_umasks_mode(tmp_path, mask):
    from attnlab.checkpoints.atomic import atomic_write_text, umask

    previous = os.umask(mask)
    try:
        assert umask() == mask
        path = atomic_write_text(tmp_path / "summary.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_a_fits_checkpoints_summary_and_lock_take_the_umasks_mode(tmp_path, umask_002):
    result = run_main(debug_fit_args(tmp_path, version="shared"), cwd=tmp_path)
    assert result.code == 0, result.err[-3000:]
    run_dir = tmp_path / "debug" / "shared"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"last.ckpt", "summary.json", "config.yaml", "metrics.csv", ".lock"} <= names, names
    assert any(p.suffix == ".ckpt" and p.name != "last.ckpt" for p in files), names
    modes = {str(p.relative_to(run_dir)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {oct(0o664)}, modes
    assert not list(run_dir.rglob("*.partial"))


def test_the_umask_is_read_without_changing_it(tmp_path):
    from attnlab.checkpoints.atomic import umask

    previous = os.umask(0o037)
    try:
        assert umask() == 0o037 and umask() == 0o037
        Path(tmp_path / "plain").touch()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640
