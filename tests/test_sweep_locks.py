"""A sweep never moves or retrains a folder a live command writes: one sweep command at a time on a
sweep folder, and an unfinished point whose run folder is locked is left where it is."""
from __future__ import annotations

import csv
import fcntl
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, run_sweep


def sweep_args(tmp_path: Path, heads=(1, 2)) -> list:
    sweep_file = tmp_path / "heads.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": list(heads)}}))
    return [sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]


def hold(folder: Path, pid: int = 4242, host: str = "node-7") -> int:
    """Lock `folder` as a live command does (flock on .lock, holding its PID and host)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{pid} {host}\n".encode())
    return fd


def train_steps(metrics: Path) -> list[int]:
    with metrics.open() as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]


def test_a_second_sweep_on_a_live_sweep_folder_is_refused_and_moves_nothing(tmp_path):
    """Two real `attnlab sweep` processes of one file, the second started while the first trains."""
    args = [str(a) for a in sweep_args(tmp_path, heads=(1,))]
    first = subprocess.Popen([sys.executable, "-m", "attnlab", "sweep", *args], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lock = tmp_path / "runs" / "heads" / ".lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip()) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    second = subprocess.run([sys.executable, "-m", "attnlab", "sweep", *args], cwd=tmp_path, text=True,
                            capture_output=True, timeout=120)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines() == [second.stderr.strip()]
    assert f"sweep folder {(tmp_path / 'runs' / 'heads').absolute()} is in use by PID {first.pid} on " \
           f"{socket.gethostname()}" in second.stderr and "--root" in second.stderr
    assert "[sweep]" not in second.stdout
    sweep_dir = tmp_path / "runs" / "heads"
    assert not (sweep_dir / ".incomplete").exists()
    steps = train_steps(sweep_dir / "n_heads=1" / "fit" / "metrics.csv")
    assert steps and len(steps) == len(set(steps)), steps
    assert (sweep_dir / "n_heads=1" / "done.json").is_file()


def test_an_unfinished_point_held_by_a_live_run_is_skipped_not_moved(tmp_path):
    """A fit started by hand in a point's folder (no last.ckpt yet): the sweep names its holder and
    leaves the folder; the other point runs."""
    args = sweep_args(tmp_path)
    fit_dir = tmp_path / "runs" / "heads" / "n_heads=1" / "fit"
    fd = hold(fit_dir)
    (fit_dir / "metrics.csv").write_text("step,train/loss\n0,6.0\n")
    try:
        result = run_sweep(args, cwd=tmp_path)
    finally:
        os.close(fd)
    assert result.returncode == 1
    assert "n_heads=1: skipped" in result.stdout and "in use by PID 4242 on node-7" in result.stdout
    assert (fit_dir / "metrics.csv").read_text() == "step,train/loss\n0,6.0\n"
    assert not (tmp_path / "runs" / "heads" / ".incomplete").exists()
    assert (tmp_path / "runs" / "heads" / "n_heads=2" / "done.json").is_file()
    assert "1 run(s) failed: n_heads=1" in result.stderr


def test_a_lock_whose_holder_has_not_written_yet_still_names_it(tmp_path):
    """Between taking the lock and writing its PID the holder is named once it writes (no "PID ?")."""
    from attnlab.errors import ConfigError
    from attnlab.training.run_folder import RunFolderLock

    folder = tmp_path / "run"
    folder.mkdir()
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    writer = subprocess.Popen([sys.executable, "-c", f"import time, os; time.sleep(0.1); "
                               f"open({str(folder / '.lock')!r}, 'w').write('777 host-b\\n')"])
    try:
        RunFolderLock(folder).acquire()
        raise AssertionError("a held folder was taken")
    except ConfigError as err:
        message = str(err)
    finally:
        writer.wait(timeout=30)
        os.close(fd)
    assert "in use by PID 777 on host-b" in message, message
