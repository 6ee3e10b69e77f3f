"""A run that max_steps stops mid-epoch validates at its last step, once (issue 30): its best
checkpoint and early stopping see the last steps; no step is validated twice."""
from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch

from attnlab.training.final_validation import FinalValidation
from conftest import debug_fit_args

# debug_fit_args' data: two training batches, so an epoch is two optimizer steps.


def val_steps(run_dir) -> list[int]:
    """The metrics.csv step of each val/nll row, in order (Lightning logs global step - 1)."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("val/nll")]


def val_nll(run_dir) -> list[float]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [float(row["val/nll"]) for row in csv.DictReader(f) if row.get("val/nll")]


def fit(cli, tmp_path, version, *extra):
    result = cli(*debug_fit_args(tmp_path, "--trainer.max_epochs", "5", *extra, version=version))
    assert result.code == 0, result.err[-3000:]
    return tmp_path / "debug" / version


def recorded_best(run_dir) -> str:
    callbacks = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    (best,) = [s["best_model_path"] for s in callbacks.values() if isinstance(s, dict) and s.get("monitor")]
    return best.rsplit("/", 1)[-1]


def test_a_run_stopped_mid_epoch_validates_its_last_step_and_can_keep_it_as_best(cli, tmp_path):
    run = fit(cli, tmp_path, "mid", "--trainer.max_steps", "3")
    assert val_steps(run) == [1, 2]  # the epoch end (global step 2), then the last step (3)
    nll = val_nll(run)
    assert nll[1] < nll[0]
    assert recorded_best(run) == "best-epoch=1-step=3.ckpt"
    assert [p.name for p in (run / "checkpoints").glob("best-*.ckpt")] == ["best-epoch=1-step=3.ckpt"]


@pytest.mark.parametrize("extra, steps", [
    (["--trainer.max_steps", "4"], [1, 3]),  # stops at an epoch end: validated there, once
    (["--trainer.max_steps", "3", "--trainer.val_check_interval", "1"], [0, 1, 2]),  # every step, once
    (["--trainer.max_steps", "-1", "--trainer.max_epochs", "2"], [1, 3]),  # epochs bound the run
    # check_val_every_n_epoch 2 skips odd epochs, but not the run's last one: by max_epochs (3) ...
    (["--trainer.max_steps", "-1", "--trainer.max_epochs", "3", "--trainer.check_val_every_n_epoch", "2"], [3, 5]),
    # ... or by max_steps, mid-epoch 3
    (["--trainer.max_steps", "5", "--trainer.check_val_every_n_epoch", "2"], [3, 4]),
], ids=["epoch-end", "every-step", "no-max-steps", "skipped-last-epoch", "skipped-epoch-max-steps"])
def test_a_step_that_validates_anyway_validates_once(cli, tmp_path, extra, steps):
    assert val_steps(fit(cli, tmp_path, "once", *extra)) == steps


def test_nothing_is_set_before_max_steps_or_without_it():
    callback = FinalValidation()
    for max_steps, step, stops in ((-1, 50, False), (None, 50, False), (10, 9, False), (10, 10, True)):
        trainer = SimpleNamespace(max_steps=max_steps, global_step=step, should_stop=False, check_val_every_n_epoch=3)
        callback.on_train_batch_end(trainer, None, None, None, 0)
        assert trainer.should_stop is stops, (max_steps, step)
        assert trainer.check_val_every_n_epoch == (1 if stops else 3)


def generation_steps(run_dir) -> list[int]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("val/bleu")]


def test_generation_every_n_epochs_without_an_epoch_limit(cli, tmp_path):
    """max_epochs -1 (max_steps bounds the run) is no "last epoch" at every epoch: generation runs
    every 2nd epoch (global step 4) and at the run's last step (6), not at the first epoch's end."""
    run = fit(cli, tmp_path, "gen", "--trainer.max_epochs", "-1", "--trainer.max_steps", "6",
              "--model.init_args.eval_every_n_epochs", "2")
    assert val_steps(run) == [1, 3, 5]
    assert generation_steps(run) == [3, 5]
