"""Checkpoints chosen by any validation metric (--run.monitor), early stopping (--run.patience),
and bad selection settings refused before anything is written."""
from __future__ import annotations

import re

import pytest

from conftest import debug_fit_args, read_metrics

# conftest.PeakingOracle: generations right on 1/3, all, 1/2, 1/4, 1/4 of the val pairs in epochs 0-4;
# on the grammar task, whose references are sentences (number words are single words: BLEU 0).
PEAKING = ["--data.class_path", "data_modules.GrammarDataModule", "--data.init_args.vocab_size", "400",
           "--model.class_path", "conftest.PeakingOracle", "--model.init_args.eval_every_n_epochs", "1",
           "--trainer.max_steps", "-1", "--trainer.max_epochs", "5", "--trainer.limit_train_batches", "1"]


def _best(run_dir):
    (best,) = (run_dir / "checkpoints").glob("best-*.ckpt")
    return int(re.search(r"epoch=(\d+)", best.name).group(1))


def test_monitor_val_bleu_keeps_the_checkpoint_with_the_highest_logged_bleu(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, *PEAKING, "--run.monitor", "val/bleu", "--run.monitor_mode", "max",
                                 version="bleu"))
    assert result.code == 0, result.err[-3000:]
    metrics = read_metrics(tmp_path / "debug" / "bleu")
    bleu = metrics["val/bleu"]
    assert len(bleu) == 5 and len(set(bleu)) > 2
    assert _best(tmp_path / "debug" / "bleu") == bleu.index(max(bleu)) == 1
    # The default (val/nll, min) picks another epoch on the same run: the monitor made the choice.
    nll = metrics["val/nll"]
    assert nll.index(min(nll)) != 1


def test_the_mode_follows_the_metric_when_not_given(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, *PEAKING, "--run.monitor", "val/exact_match", version="em"))
    assert result.code == 0, result.err[-3000:]
    assert _best(tmp_path / "debug" / "em") == 1  # max, as for every generation score


def test_patience_stops_after_that_many_validations_without_improvement(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, *PEAKING, "--run.monitor", "val/chrf", "--run.patience", "2",
                                 version="patient"))
    assert result.code == 0, result.err[-3000:]
    chrf = read_metrics(tmp_path / "debug" / "patient")["val/chrf"]
    # chrF improves in epochs 0 and 1, not in 2 or 3: two validations without improvement, stop.
    assert len(chrf) == 4, chrf


@pytest.mark.parametrize("flags, expected", [
    (["--run.monitor", "val/blue"], ["run.monitor='val/blue'", "never logged", "val/bleu"]),
    (["--run.monitor", "train/loss"], ["run.monitor='train/loss'", "validation metric"]),
    (["--run.monitor", "val/bleu", "--model.init_args.eval_every_n_epochs", "2"],
     ["run.monitor='val/bleu'", "eval_every_n_epochs 1"]),
    (["--run.patience", "0"], ["run.patience=0", ">= 1"]),
    (["--run.monitor_mode", "maximum"], ["run.monitor_mode='maximum'", "min or max"]),
])
def test_bad_selection_settings_are_one_line_before_any_run(cli, tmp_path, flags, expected):
    result = cli(*debug_fit_args(tmp_path, *flags, version="bad"))
    assert result.code == 2
    errors = [line for line in result.err.splitlines() if line.startswith("attnlab: error:")]
    assert len(errors) == 1 and "Traceback" not in result.err, result.err[-2000:]
    for part in expected:
        assert part in errors[0], errors[0]
    assert not (tmp_path / "debug" / "bad").exists()  # nothing written
