"""Faults that must lose nothing (issue 30): a checkpoint write that fails part-way, and a second
command on a run folder that another process is writing. Preemption (SIGTERM, Ctrl-C) is in
tests/test_resume.py; runs across nodes in tests/test_distributed.py."""
from __future__ import annotations

import errno
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from attnlab.checkpoints.atomic import WriteFailed, atomic_torch_save, atomic_write
from conftest import debug_fit_args, run_main


def _snapshot(folder):
    """Every file under `folder`: its bytes and mtime."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_write_that_fails_part_way_leaves_the_previous_file_intact(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"w": torch.arange(1000.0)}, path)
    before = path.read_bytes()

    def fills_the_disk(f):
        torch.save({"w": torch.zeros(1000)}, f)  # most of a checkpoint reaches the disk, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(WriteFailed) as failed:
        atomic_write(path, fills_the_disk)
    assert path.read_bytes() == before
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(1000.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the partial file is gone
    message = str(failed.value)
    assert f"free in {tmp_path}" in message and "No space left" in message and "intact" in message


def _limit_file_size(limit: int):
    """A file-size limit (RLIMIT_FSIZE) for the child: a write past it fails with EFBIG, as on a full disk."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_fit_whose_checkpoint_write_fails_part_way_keeps_last_ckpt_and_says_where(tmp_path):
    """A run continued under a file-size limit below a checkpoint's size: its next checkpoint fails
    part-way through the real writer. last.ckpt stays byte-identical and loadable, no partial file
    is left, and the run stops with one line naming the folder and its free space (exit 74: no room,
    which a sweep stops at and a job script tells from bad input)."""
    args = [str(a) for a in debug_fit_args(tmp_path, "--trainer.max_epochs", "3", version="v")]
    assert run_main(args, cwd=tmp_path).code == 0
    folder = tmp_path / "debug" / "v" / "checkpoints"
    before = (folder / "last.ckpt").read_bytes()
    more = [*args, "--trainer.max_steps", "4"]  # resumes from step 2; its next save goes past the limit
    limited = subprocess.run([sys.executable, "-m", "attnlab", *more], cwd=tmp_path, capture_output=True, text=True,
                             preexec_fn=_limit_file_size(len(before) // 2), timeout=180)
    assert limited.returncode == 74, limited.stderr[-3000:]
    errors = [line for line in limited.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert len(errors) == 1 and "Traceback" not in limited.stderr, limited.stderr[-3000:]
    assert f"free in {folder}" in errors[0] or f"free in {folder.resolve()}" in errors[0], errors[0]
    assert "File too large" in errors[0] and "intact" in errors[0]
    assert (folder / "last.ckpt").read_bytes() == before
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2
    assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]


HOLDER = """
import sys, time
from pathlib import Path
from attnlab.training.run_folder import RunFolderLock
RunFolderLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_fit_on_a_held_run_folder_is_refused_and_a_dead_holder_is_taken_over(tmp_path):
    args = debug_fit_args(tmp_path, version="v")
    assert run_main(args, cwd=tmp_path).code == 0  # a finished run in the folder
    run_dir = tmp_path / "debug" / "v"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _snapshot(tmp_path)
        started = time.monotonic()
        second = run_main(args, cwd=tmp_path)
        assert time.monotonic() - started < 30  # refused before any training, not after
        assert second.code == 2, second.err[-3000:]
        assert f"run folder {run_dir.absolute()} is in use by PID {holder.pid} on {socket.gethostname()}" in second.err
        assert "choose another --run.version" in second.err
        assert second.out == ""  # refused before it printed anything ("resuming ...") or built the data
        assert _snapshot(tmp_path) == before  # not a byte or an mtime changed
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed: its lock died with it, and the same command runs (it resumes the run).
    third = run_main(args, cwd=tmp_path)
    assert third.code == 0, third.err[-3000:]
    assert "resuming" in third.out
    assert (run_dir / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]


@pytest.mark.parametrize("requeue", [False, True], ids=["plain", "slurm-auto-requeue"])
def test_preemption_leaves_lightnings_slurm_requeue_signals_alone(requeue):
    """Under Lightning's SLURM auto-requeue, SIGUSR1 (save and requeue) and SIGTERM stay
    Lightning's (on one device too, whose strategy has no cluster environment); otherwise all three
    stop signals are the Preemption callback's while training, and the previous handlers come back
    at teardown."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.environments import LightningEnvironment, SLURMEnvironment

    from attnlab.training.preemption import Preemption

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    before = {s: signal.getsignal(s) for s in signals}
    environment = SLURMEnvironment(auto_requeue=True) if requeue else LightningEnvironment()
    trainer = Trainer(accelerator="cpu", devices=1, plugins=[environment], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    callback = Preemption()
    callback.on_train_start(trainer, None)
    try:
        ours = {s for s in signals if signal.getsignal(s) == callback._catch}
        assert ours == ({signal.SIGINT} if requeue else set(signals))
    finally:
        callback.teardown(None, None, "fit")
    assert {s: signal.getsignal(s) for s in signals} == before
