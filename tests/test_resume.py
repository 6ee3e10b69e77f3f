"""Resume: a CPU run killed with SIGKILL mid-epoch and started again continues exactly.

The killed run and its resume use the same command line; only the killed run gets a process of
its own, wrapped (python -c) so it SIGKILLs itself at a fixed step, which makes "mid-epoch"
deterministic. The uninterrupted and resumed runs run in this process. The resumed run must reach
the uninterrupted run's metrics (to 1e-6) with the same logged steps in metrics.csv, each exactly
once.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
import torch

from conftest import debug_fit_args, read_metrics, run_main

# 64 pairs / batch 8 = 8 steps per epoch, 2 epochs; block diffusion with dropout on, so the RNG
# state matters too: the resumed run must draw the uninterrupted run's masks, times and dropout.
# last.ckpt every 2 steps: killed when global step 5 starts, the checkpoint is step 4 (mid-epoch 0)
# and the row of step 4 was logged after it (the resumed run must drop it and log it again).
# Killed at step 9: the checkpoint is the one written at the end of epoch 0, after validation.
# Every run averages its two epoch-end snapshots: a resumed run must average the same weights.
RESUME_ARGS = [
    "--model", "attnlab.BlockDiffusion", "--trainer.max_steps", "-1", "--trainer.max_epochs", "2", "--data.init_args.batch_size", "8",
    "--model.init_args.backbone.dropout", "0.1", "--run.checkpoint_every_n_steps", "2",
    "--trainer.callbacks+=attnlab.checkpoints.averaging.CheckpointAveraging", "--trainer.callbacks.last_k", "2",
]
STEPS_PER_EPOCH = 8

KILLER = """
import os, signal, sys
from attnlab.families.base import FamilyModule
original = FamilyModule.on_train_batch_start
def on_train_batch_start(self, batch, batch_idx):
    if self.trainer.global_step == {step}:
        os.kill(os.getpid(), signal.{signal})
    return original(self, batch, batch_idx)
FamilyModule.on_train_batch_start = on_train_batch_start
from attnlab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _args(root, version, *extra):
    return debug_fit_args(root, *RESUME_ARGS, *extra, version=version)


def _run_killed(args, cwd, step, signal_name="SIGKILL"):
    """`attnlab ARGS` in a process that sends itself `signal_name` when global step `step` starts."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", KILLER.format(step=step, signal=signal_name), *[str(a) for a in args]],
        cwd=cwd, env=dict(os.environ), timeout=180, capture_output=True, text=True, errors="replace",
    )


def _run(args, cwd):
    """`attnlab ARGS` in this process, as run_process returns it; warnings (pytest would swallow
    them) are appended to stderr. Its numbers are a fresh process's: a fit draws the same noise
    whatever ran before it in the process (test_zz_in_process_reproducible.py)."""
    import subprocess
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_main(args, cwd=cwd)
    err = result.err + "".join(f"\n{w.category.__name__}: {w.message}" for w in caught)
    return subprocess.CompletedProcess(args, result.code, result.out, err)


def _steps(run_dir, key):
    """(step, value) of every metrics.csv row that holds `key`, in row order."""
    import csv

    with (run_dir / "metrics.csv").open(newline="") as f:
        return [(int(row["step"]), float(row[key])) for row in csv.DictReader(f) if row.get(key)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_full")
    proc = _run(_args(root, "full"), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "debug" / "full"


def _assert_same_run(resumed, full):
    for key in ("train/loss", "val/nll", "val/loss", "budget/flops", "budget/tokens", "budget/epochs"):
        got, want = _steps(resumed, key), _steps(full, key)
        assert [s for s, _ in got] == [s for s, _ in want], f"{key}: logged steps differ"
        assert len({s for s, _ in got}) == len(got), f"{key}: a step is logged twice"
        for (step, a), (_, b) in zip(got, want):
            assert a == pytest.approx(b, abs=1e-6, rel=0), f"{key} at step {step}: {a} vs {b}"
    assert [s for s, _ in _steps(full, "train/loss")] == list(range(2 * STEPS_PER_EPOCH))
    # every column's rows line up (epoch, step, ...): the whole CSV but the timing column
    got, want = read_metrics(resumed), read_metrics(full)
    assert sorted(got) == sorted(want)
    for key in ("epoch", "step"):
        assert got[key] == want[key]
    # the best checkpoint's record survived the resume: the same files, none orphaned
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == sorted(
        p.name for p in (full / "checkpoints").iterdir())
    # the budget ledger continued its totals (summary.json): the same FLOPs, tokens and epochs
    assert _ledger(resumed) == _ledger(full) and _ledger(full)["flops"] > 0
    _assert_same_average(resumed, full)


def _ledger(run_dir) -> dict:
    """The fit's ledger totals but its wall time (a resumed run loses the time after its checkpoint)."""
    totals = json.loads((run_dir / "summary.json").read_text())["ledger"]
    return {key: value for key, value in totals.items() if key != "train_seconds"}


def _assert_same_average(resumed, full):
    """averaged.ckpt of the resumed run holds the uninterrupted run's average (not its last weights)."""
    want, got, last = (torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=True)["state_dict"]
                       for run, name in ((full, "averaged.ckpt"), (resumed, "averaged.ckpt"), (full, "last.ckpt")))
    assert any(not torch.equal(want[k], last[k]) for k in want)  # an average, not the last weights
    assert want.keys() == got.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)


def _kill(root, args, step=5):
    killed = _run_killed(args, root, step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = root / "debug" / "cut"
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] == step - 1 and state["epoch"] == 0
    logged = [s for s, _ in _steps(run_dir, "train/loss")]
    assert logged == list(range(step)), logged  # includes the row logged after the checkpoint
    return run_dir


@pytest.mark.parametrize("kill_at", [5, 9], ids=["mid-epoch", "after-epoch-end"])
def test_killed_run_resumed_with_the_same_command_matches_an_uninterrupted_run(tmp_path, uninterrupted, kill_at):
    args = _args(tmp_path, "cut")
    run_dir = _kill(tmp_path, args, kill_at)
    resumed = _run(args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming " in resumed.stdout and f"last.ckpt (epoch 0, step {kill_at - 1})" in resumed.stdout
    assert "not resumable" not in resumed.stderr  # Lightning's warning: ours is resumable
    _assert_same_run(run_dir, uninterrupted)


def test_a_preempted_run_saves_its_step_exits_75_and_resumes_exactly(tmp_path, uninterrupted):
    """SIGTERM (SLURM, Kubernetes) while step 7 trains, the last of epoch 0: the step finishes,
    the epoch's validation still runs (a resumed run would skip it), last.ckpt holds the step
    (global step 8), the process says so and exits 75. The same command resumes; Ctrl-C while
    step 11 trains, mid-epoch 1, stops it the same way at 12 (the periodic saves wrote step 10);
    the same command again finishes with the uninterrupted run's metrics, validations included."""
    from attnlab.errors import EXIT_INTERRUPTED

    args = _args(tmp_path, "cut")
    run_dir = tmp_path / "debug" / "cut"
    for signal_name, step, resumed_from in (("SIGTERM", 7, None), ("SIGINT", 11, 8)):
        stopped = _run_killed(args, tmp_path, step, signal_name)
        assert stopped.returncode == EXIT_INTERRUPTED == 75, stopped.stderr[-3000:]
        assert f"interrupted ({signal_name}) at step {step + 1}" in stopped.stdout, stopped.stdout[-3000:]
        assert "the same command resumes it" in stopped.stdout and "Traceback" not in stopped.stderr
        assert resumed_from is None or f"last.ckpt (epoch 0, step {resumed_from})" in stopped.stdout
        state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert (state["global_step"], state["epoch"]) == (step + 1, step // STEPS_PER_EPOCH)
    resumed = _run(args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "last.ckpt (epoch 1, step 12)" in resumed.stdout
    _assert_same_run(run_dir, uninterrupted)


AVERAGING_BY_STEPS = [  # every 2 steps, the last 4, instead of RESUME_ARGS's two epoch ends
    "--trainer.callbacks.every_n_steps", "2", "--trainer.callbacks.last_k", "4", "--run.checkpoint_every_n_steps", "4"]


def test_a_killed_run_resumed_averages_the_same_snapshots_taken_by_steps(tmp_path):
    """Killed at step 15 with last.ckpt at step 12 (window 6, 8, 10, 12; snapshot 14 written after
    it), resumed: averaged.ckpt is the uninterrupted run's (window 10, 12, 14, 16). Averages of
    epoch-end snapshots are checked by every resume test above (RESUME_ARGS)."""
    full_root, cut_root = tmp_path / "full", tmp_path / "cut"
    cut_root.mkdir()
    full = _run(_args(full_root, "full", *AVERAGING_BY_STEPS), cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    args = _args(cut_root, "cut", *AVERAGING_BY_STEPS)
    killed = _run_killed(args, cut_root, 15)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run(args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming " in resumed.stdout
    _assert_same_average(cut_root / "debug" / "cut", full_root / "debug" / "full")


def _text_args(root, version, corpus):
    """The resume run on streamed plain text (token files read by chunk), 8 batches an epoch."""
    return _args(root, version, "--data", "data_modules.TextFolderDataModule", "--data.init_args.data_dir", corpus,
                 "--data.init_args.seq_len", "16", "--data.init_args.vocab_size", "300",
                 "--data.init_args.cache_dir", root / "cache", "--data.init_args.max_eval_examples", "8",
                 "--trainer.limit_train_batches", str(STEPS_PER_EPOCH))


def test_a_killed_run_on_streamed_text_resumes_exactly(tmp_path, text_folder_dir):
    full_root, cut_root = tmp_path / "full", tmp_path / "cut"
    cut_root.mkdir()
    full = _run(_text_args(full_root, "full", text_folder_dir), cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    args = _text_args(cut_root, "cut", text_folder_dir)
    run_dir = _kill(cut_root, args)
    resumed = _run(args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(run_dir, full_root / "debug" / "full")


def test_ckpt_path_last_resumes_and_continues_the_wandb_run(tmp_path, uninterrupted):
    args = _args(tmp_path, "cut", "--run.wandb", "offline")
    run_dir = _kill(tmp_path, args)
    # wandb names an offline segment by its start second: a resume within the killed run's second
    # (a warm wandb service in this process) would share its folder
    time.sleep(max(0.0, 1.05 - (time.time() % 1.0)))
    resumed = _run([*args, "--ckpt_path", "last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(run_dir, uninterrupted)
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.name.endswith(f"-{run_id}") for p in offline), offline
    # one `wandb sync` of both segments, in order: synced one by one, the second replaces the first
    (line,) = [line for line in resumed.stdout.splitlines() if "wandb sync" in line]
    command = line.split("`")[1].split()
    assert [p.rsplit("/", 1)[-1] for p in command[2:]] == [p.name for p in offline], line


def test_a_new_run_says_how_to_resume(tmp_path):
    args = debug_fit_args(tmp_path)
    at = args.index("--run.version")
    del args[at : at + 2]  # a timestamped run
    proc = _run(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if "if interrupted" in l)
    version = next((tmp_path / "debug").iterdir()).name
    assert f"--run.version {version}" in line


def test_samplers_repeat_an_epoch_and_skip_what_was_trained():
    from data_modules.batching import EpochRandomSampler, TokenBudgetBatchSampler

    torch.manual_seed(123)
    sampler = EpochRandomSampler(range(20), seed=3)
    sampler.set_epoch(1)
    epoch_1 = list(sampler)
    torch.manual_seed(456)  # the global RNG plays no part
    assert list(sampler) == epoch_1 and sorted(epoch_1) == list(range(20))
    sampler.set_epoch(2)
    assert list(sampler) != epoch_1
    resumed = EpochRandomSampler(range(20), seed=3)
    resumed.resume_at(1, 8)
    assert len(resumed) == 20 and list(resumed) == epoch_1[8:]
    assert list(resumed) == epoch_1  # the skip applies once

    budget = TokenBudgetBatchSampler([5, 9, 3, 7, 2, 8, 6, 4] * 4, max_tokens=30, seed=1)
    budget.set_epoch(1)
    batches = list(budget)
    again = TokenBudgetBatchSampler([5, 9, 3, 7, 2, 8, 6, 4] * 4, max_tokens=30, seed=1)
    again.resume_at(1, 2)
    assert list(again) == batches[2:] and len(again) == len(batches)
    again.set_epoch(2)
    assert list(again) != batches


def test_continued_csv_drops_only_the_rows_logged_again(tmp_path):
    """A resume that repeats a validation at the checkpoint's step drops the old validation row at
    that step (not the step's training row) and every later row; the header is kept."""
    import csv

    from attnlab.training.resume import ResumableCSVLogger

    run = tmp_path / "debug" / "v"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "epoch,step,train/loss,val/nll\n0,2,1.5,\n0,3,1.25,\n0,3,,2.0\n1,4,1.0,\n"
    )
    logger = ResumableCSVLogger(str(tmp_path), name="debug", version="v", resume=True)
    logger.log_metrics({"val/nll": 1.75, "epoch": 0}, step=3)
    logger.log_metrics({"train/loss": 0.5, "epoch": 1}, step=4)
    logger.save()
    with (run / "metrics.csv").open(newline="") as f:
        rows = [(r["step"], r["train/loss"], r["val/nll"]) for r in csv.DictReader(f)]
    assert rows == [("2", "1.5", ""), ("3", "1.25", ""), ("3", "", "1.75"), ("4", "0.5", "")]

    fresh = ResumableCSVLogger(str(tmp_path), name="debug", version="v")  # not resuming: a new file
    fresh.log_metrics({"train/loss": 9.0}, step=0)
    fresh.save()
    assert (run / "metrics.csv").read_text().splitlines()[1:] == ["0,9.0"]


def test_each_rank_draws_its_own_noise_and_one_process_resumes_its_stream(monkeypatch):
    """RngStates at the start of training: ranks are seeded by (seed, rank), the same each time;
    a checkpoint's states come back exactly on one process; on two ranks (a checkpoint holds
    rank zero's states only) each rank is reseeded by (seed, rank, step) instead."""
    from types import SimpleNamespace

    from attnlab.training.resume import RngStates

    monkeypatch.setenv("PL_GLOBAL_SEED", "3")

    def first_draws(rank, world, step=0, saved=None):
        callback, trainer = RngStates(), SimpleNamespace(world_size=world, global_rank=rank, global_step=step)
        if saved is not None:
            callback.load_state_dict(saved)
        callback.on_train_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)
        return torch.rand(4)

    zero, one = first_draws(0, 2), first_draws(1, 2)
    assert not torch.equal(zero, one) and torch.equal(first_draws(1, 2), one)
    torch.manual_seed(123)
    saved = RngStates().state_dict()
    expected = torch.rand(4)
    assert torch.equal(first_draws(0, 1, step=5, saved=saved), expected)
    zero, one = first_draws(0, 2, step=5, saved=saved), first_draws(1, 2, step=5, saved=saved)
    assert not torch.equal(zero, one) and not torch.equal(zero, expected)
