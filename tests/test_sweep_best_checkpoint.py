"""The sweep evaluates the best checkpoint that the fit recorded in last.ckpt, not the newest
best-*.ckpt by mtime (copies and restores change mtimes; a resumed run can leave several)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.sweeps.sweep import checkpoint_to_test


def _fake_last(folder, best_path, monitor="val/nll"):
    """A last.ckpt with the callback states Lightning writes: the monitoring ModelCheckpoint and LastCheckpoint."""
    callbacks = {
        f"ModelCheckpoint{{'monitor': '{monitor}', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
        "'train_time_interval': None}": {"monitor": monitor, "best_model_path": best_path, "last_model_path": ""},
        "LastCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 200, 'every_n_epochs': 0, "
        "'train_time_interval': None}": {"monitor": None, "best_model_path": "",
                                          "last_model_path": str(folder / "last.ckpt")},
    }
    torch.save({"attnlab": {"family": "decoder_only"}, "state_dict": {}, "hyper_parameters": {},
                "callbacks": callbacks}, folder / "last.ckpt")


def _bests(folder, names):
    """best-*.ckpt files whose mtimes follow `names`' order (the last is the newest)."""
    for i, name in enumerate(names):
        (folder / name).write_text("x")
        os.utime(folder / name, (1_000_000 + i, 1_000_000 + i))


def test_the_recorded_best_is_evaluated_even_when_another_best_file_is_newer(tmp_path):
    folder = tmp_path / "fit" / "checkpoints"
    folder.mkdir(parents=True)
    _bests(folder, ["best-epoch=1-step=4.ckpt", "best-epoch=0-step=2.ckpt", "best-epoch=2-step=6.ckpt"])
    # recorded on another machine: only the file name counts
    _fake_last(folder, "/elsewhere/runs/debug/fit/checkpoints/best-epoch=1-step=4.ckpt")
    assert checkpoint_to_test(tmp_path / "fit", "best") == folder / "best-epoch=1-step=4.ckpt"
    assert checkpoint_to_test(tmp_path / "fit", "last") == folder / "last.ckpt"


def test_a_recorded_best_that_is_missing_is_an_error_not_another_file(tmp_path):
    folder = tmp_path / "fit" / "checkpoints"
    folder.mkdir(parents=True)
    _bests(folder, ["best-epoch=0-step=2.ckpt"])
    _fake_last(folder, str(folder / "best-epoch=3-step=8.ckpt"))
    with pytest.raises(AttnlabError, match=r"records best-epoch=3-step=8\.ckpt.*does not exist"):
        checkpoint_to_test(tmp_path / "fit", "best")


def test_without_a_record_the_newest_best_file_is_taken(tmp_path):
    folder = tmp_path / "fit" / "checkpoints"
    folder.mkdir(parents=True)
    _bests(folder, ["best-epoch=1-step=4.ckpt", "best-epoch=0-step=2.ckpt"])
    assert checkpoint_to_test(tmp_path / "fit", "best").name == "best-epoch=0-step=2.ckpt"  # no last.ckpt
    _fake_last(folder, "")  # no validation recorded yet
    assert checkpoint_to_test(tmp_path / "fit", "best").name == "best-epoch=0-step=2.ckpt"


def test_a_real_fits_record_is_read_in_a_moved_folder(trained_run, tmp_path):
    """A real last.ckpt (Lightning's callback state keys), its run folder copied elsewhere, plus a
    newer decoy best-*.ckpt."""
    _, run_dir = trained_run()
    fit = tmp_path / "moved" / "fit"
    shutil.copytree(run_dir / "checkpoints", fit / "checkpoints")
    (best,) = [p.name for p in (fit / "checkpoints").glob("best-*.ckpt")]
    decoy = fit / "checkpoints" / "best-epoch=9-step=99.ckpt"
    decoy.write_text("x")
    os.utime(decoy, (4_000_000_000, 4_000_000_000))
    assert checkpoint_to_test(fit, "best") == fit / "checkpoints" / best
