"""A fit in a process that has already run others logs what the same fit logs in a fresh process.

Named to run last: in the whole suite the fit here follows every other test's in-process work,
as a notebook user's second fit follows the first. Run alone, the session's shared run
(`trained_run`) gives it the same first-fit-of-the-process work to follow. Block diffusion with
dropout draws training noise at every step, so any shift of the global RNG shows in the loss.
"""
from __future__ import annotations

import csv

import pytest
import torch

from conftest import debug_fit_args, run_main, run_process

NOISY_FIT = [
    "--model", "attnlab.BlockDiffusion", "--trainer.max_steps", "3", "--data.init_args.batch_size", "8",
    "--model.init_args.backbone.dropout", "0.1",
]
COMPARED = ("train/loss", "val/loss", "val/nll")


def _logged(run_dir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of each compared metric, in metrics.csv's row order."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {key: [(int(r["step"]), float(r[key])) for r in rows if r.get(key)] for key in COMPARED}


def test_a_fit_after_other_fits_in_this_process_logs_a_fresh_processs_losses(tmp_path, trained_run):
    trained_run()  # at least one fit has run in this process before the one compared
    torch.manual_seed(1234)
    torch.rand(1000)  # and a user's own draws in between: the fit must not depend on them
    here = run_main(debug_fit_args(tmp_path / "here", *NOISY_FIT), cwd=tmp_path)
    assert here.code == 0, here.err[-3000:]
    fresh = run_process(debug_fit_args(tmp_path / "fresh", *NOISY_FIT), cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    got, want = _logged(tmp_path / "here" / "debug" / "v1"), _logged(tmp_path / "fresh" / "debug" / "v1")
    assert [s for s, _ in want["train/loss"]] == [0, 1, 2] and want["val/nll"]
    for key in COMPARED:
        assert [s for s, _ in got[key]] == [s for s, _ in want[key]], key
        for (step, a), (_, b) in zip(got[key], want[key]):
            assert a == pytest.approx(b, abs=1e-6, rel=0), f"{key} at step {step}: {a} in this process, {b} fresh"
