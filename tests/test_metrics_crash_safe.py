"""metrics.csv survives a crash: a kill mid-append damages only the last line, which the report and a
resume drop; a rewrite (a new column, a resume's trim) replaces the file whole or not at all."""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from conftest import run_main

ROWS = "epoch,step,train/loss\r\n0,0,6.0\r\n0,1,5.9\r\n0,2,5.8\r\n"


def test_the_report_drops_a_partial_last_line_and_says_so(trained_run, tmp_path):
    from attnlab.reports.runs import read_metrics

    _, run_dir = trained_run()
    copy = tmp_path / "debug" / "cut"
    shutil.copytree(run_dir, copy)
    metrics = copy / "metrics.csv"
    whole = metrics.read_bytes()
    complete = whole[: whole.rstrip(b"\r\n").rfind(b"\n") + 1]  # every line but the last
    metrics.write_bytes(whole[: len(complete) + 7])  # the last row cut after 7 bytes, as a kill leaves it
    assert read_metrics(metrics) == read_metrics_text(tmp_path, complete)
    result = run_main(["report", str(tmp_path / "debug")], cwd=tmp_path)
    assert result.code == 0, result.err[-2000:]
    lines = [line for line in result.err.splitlines() if "is partial" in line]
    cut_line = complete.count(b"\n") + 1
    assert lines == [f"attnlab: {metrics}: line {cut_line} is partial (the run stopped while "
                     "writing it); left out"], result.err


def read_metrics_text(tmp_path, data: bytes):
    from attnlab.reports.runs import read_metrics

    path = tmp_path / "complete.csv"
    path.write_bytes(data)
    return read_metrics(path)


def test_a_resume_after_a_cut_append_drops_the_partial_line(tmp_path):
    from attnlab.training.resume import _ContinuingWriter

    (tmp_path / "metrics.csv").write_text(ROWS + "0,", newline="")  # cut in its step field
    writer = _ContinuingWriter(str(tmp_path))
    writer.log_metrics({"epoch": 0, "train/loss": 5.7}, step=3)
    writer.save()
    text = (tmp_path / "metrics.csv").read_bytes().decode()
    assert text == ROWS + "0,3,5.7\r\n"


def test_a_new_column_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """Lightning rewrites metrics.csv in place for a new column: a kill or a full disk there lost every row."""
    from attnlab.checkpoints.atomic import WriteFailed
    from attnlab.training.resume import _ContinuingWriter

    path = tmp_path / "metrics.csv"
    path.write_text(ROWS, newline="")
    writer = _ContinuingWriter(str(tmp_path))
    writer.log_metrics({"epoch": 0, "train/loss": 5.7}, step=3)
    writer.save()  # the resume's trim, written whole
    before = path.read_bytes()

    def no_room(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    writer.log_metrics({"epoch": 0, "val/nll": 5.5}, step=3)  # a new column: the header changes
    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(WriteFailed, match="metrics.csv"):
        writer.save()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]
    writer.save()  # the rows are still pending: the next save writes them
    assert path.read_bytes().decode().splitlines()[0] == "epoch,step,train/loss,val/nll"


def test_a_config_yaml_that_cannot_be_written_leaves_the_previous_one(tmp_path, monkeypatch):
    """The same command again (a resume) rewrites config.yaml; a full disk there must not truncate it
    (Lightning's SaveConfigCallback writes it in place)."""
    from conftest import debug_fit_args

    args = debug_fit_args(tmp_path, version="v")
    assert run_main(args, cwd=tmp_path).code == 0
    config = tmp_path / "debug" / "v" / "config.yaml"
    before = config.read_bytes()
    real_fsync = os.fsync

    def no_room_for_the_config(fd):
        if ".config.yaml." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_room_for_the_config)
    result = run_main(args, cwd=tmp_path)
    assert result.code == 74, result.err[-2000:]
    assert f"could not write {config}" in result.err and "No space left on device" in result.err
    assert config.read_bytes() == before
    assert not list(config.parent.glob(".config.yaml.*"))
