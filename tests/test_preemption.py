"""Preemption that loses nothing: a stop at an epoch's end keeps that epoch's best checkpoint and
early-stopping check; SIGINT and SIGUSR1 outside training end with the interrupted status; a
one-GPU SLURM job keeps Lightning's requeue (hpc_ckpt in the run folder, `scontrol requeue`),
and an hpc_ckpt left in the working directory is never loaded into another fit.

Each signal comes from the process itself at a fixed hook (a wrapper around `attnlab`), so the
moment is deterministic."""
from __future__ import annotations

import csv
import os
import stat
import subprocess
import sys

import pytest
import torch

from conftest import debug_fit_args, run_main

# 64 pairs / batch 8: 8 steps an epoch; the run bounded by max_steps 12 (as a run.budget bounds it),
# half-way through the second; early stopping on, so its state is checkpointed too.
EPOCH_ARGS = ["--trainer.max_steps", "12", "--trainer.max_epochs", "-1", "--data.init_args.batch_size", "8",
              "--run.patience", "2"]

SIGNALLER = """
import importlib, os, signal, sys
target = getattr(importlib.import_module({module!r}), {cls!r})
original = getattr(target, {method!r})
def wrapped(self, *args, **kwargs):
    if {condition}:
        os.kill(os.getpid(), signal.{signal})
    return original(self, *args, **kwargs)
setattr(target, {method!r}, wrapped)
from attnlab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
AT_STEP = ("attnlab.families.base", "FamilyModule", "on_train_batch_start", "self.trainer.global_step == {step}")
IN_SETUP = ("data_modules.base", "TokenizedDataModule", "setup", "True")
AFTER_FIT = ("attnlab.cli.lightning_cli", "AttnlabCLI", "after_fit", "True")


def _signalled(args, cwd, where, signal_name, env=None, **fields) -> subprocess.CompletedProcess:
    module, cls, method, condition = where
    script = SIGNALLER.format(module=module, cls=cls, method=method, condition=condition.format(**fields),
                              signal=signal_name)
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=cwd, timeout=180,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, errors="replace")


def _train_rows(run_dir) -> list[tuple[int, float]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [(int(row["step"]), float(row["train/loss"])) for row in csv.DictReader(f) if row.get("train/loss")]


def _selection_state(last_ckpt) -> dict:
    """What the best-checkpoint and early-stopping callbacks recorded in a run's last.ckpt."""
    callbacks = torch.load(last_ckpt, map_location="cpu", weights_only=True)["callbacks"]
    best = next(v for k, v in callbacks.items() if k.startswith("ModelCheckpoint") and v.get("monitor"))
    stopping = next(v for k, v in callbacks.items() if k.startswith("EarlyStopping"))
    return {"best": os.path.basename(best["best_model_path"]), "score": float(best["best_model_score"]),
            "early_stopping": (float(stopping["best_score"]), stopping["wait_count"])}


def test_a_stop_at_an_epochs_end_keeps_its_best_checkpoint_and_early_stopping_check(tmp_path):
    """SIGTERM while the last step of the first epoch trains: the step, the validation after it and
    the checkpoint callbacks that Lightning runs last at the epoch's end all happen before the stop.
    The resumed run starts the next epoch (under max_steps too: EpochEndResume), logs every step
    once with the uninterrupted run's losses, and ends with its best checkpoint, score and
    early-stopping state."""
    full = run_main(debug_fit_args(tmp_path, *EPOCH_ARGS, version="full"), cwd=tmp_path)
    assert full.code == 0, full.err[-3000:]
    args = debug_fit_args(tmp_path, *EPOCH_ARGS, version="cut")
    stopped = _signalled(args, tmp_path, AT_STEP, "SIGTERM", step=7)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "interrupted (SIGTERM) at step 8" in stopped.stdout, stopped.stdout[-3000:]
    resumed = run_main(args, cwd=tmp_path)
    assert resumed.code == 0, resumed.err[-3000:]
    assert "could not find the monitored key" not in resumed.err
    full_dir, cut_dir = tmp_path / "debug" / "full", tmp_path / "debug" / "cut"
    got_rows, want_rows = _train_rows(cut_dir), _train_rows(full_dir)
    assert [s for s, _ in got_rows] == [s for s, _ in want_rows] == list(range(12))
    assert [v for _, v in got_rows] == pytest.approx([v for _, v in want_rows], abs=1e-6, rel=0)
    want = _selection_state(full_dir / "checkpoints" / "last.ckpt")
    assert want["best"] in ("best-epoch=0-step=8.ckpt", "best-epoch=1-step=12.ckpt")
    assert _selection_state(cut_dir / "checkpoints" / "last.ckpt") == want
    assert (cut_dir / "checkpoints" / want["best"]).is_file()
    assert f"best checkpoint: {cut_dir / 'checkpoints' / want['best']}" in resumed.out


@pytest.mark.parametrize("signal_name, where", [("SIGINT", IN_SETUP), ("SIGUSR1", AFTER_FIT)],
                         ids=["sigint-before-training", "sigusr1-after-training"])
def test_a_signal_outside_training_ends_with_the_interrupted_status(tmp_path, signal_name, where):
    """Not Lightning's KeyboardInterrupt path (exit 1) nor SIGUSR1's default (the process dies, 138)."""
    result = _signalled(debug_fit_args(tmp_path, version="v1"), tmp_path, where, signal_name)
    assert result.returncode == 75, (result.stdout + result.stderr)[-3000:]
    assert f"attnlab: interrupted ({signal_name}) outside a training step" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def _fake_scontrol(tmp_path) -> dict:
    """A SLURM batch job of one task whose `scontrol` records its arguments instead of requeueing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1",
            "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def test_a_one_gpu_slurm_job_keeps_lightnings_requeue_and_ignores_a_stale_hpc_ckpt(tmp_path):
    """SIGUSR1 in a one-task SLURM job: Lightning's handler writes hpc_ckpt_1.ckpt into the run
    folder (slurm-<job id>, which the requeued job finds again) and calls `scontrol requeue`.
    A copy of it in the working directory, where Lightning would look by default, is not loaded
    into a later job's fit of another model."""
    env = _fake_scontrol(tmp_path)
    args = [a for a in debug_fit_args(tmp_path, "--data.init_args.batch_size", "8", version="x") if a != "--run.version" and a != "x"]
    args += ["--trainer.max_steps", "6"]
    result = _signalled(args, tmp_path, AT_STEP, "SIGUSR1", env=env, step=3)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    run_dir = tmp_path / "debug" / "slurm-4242"
    hpc = run_dir / "hpc_ckpt_1.ckpt"
    assert torch.load(hpc, map_location="cpu", weights_only=True)["global_step"] == 3
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]

    hpc.rename(tmp_path / "hpc_ckpt_1.ckpt")  # stale, where Lightning's default root would find it
    other = subprocess.run([sys.executable, "-m", "attnlab", *map(str, args), "--model.init_args.backbone.d_model", "48"],
                           cwd=tmp_path, env={**os.environ, **env, "SLURM_JOB_ID": "4243"}, timeout=180,
                           capture_output=True, text=True, errors="replace")
    assert other.returncode == 0, (other.stdout + other.stderr)[-3000:]
    assert "resuming" not in other.stdout and "hpc_ckpt" not in other.stdout + other.stderr
