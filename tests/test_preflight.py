"""Checks made before a run folder is written (attnlab.cli.preflight); the CLI rows are in
tests/test_bad_input_catalogue.py (run_root_*, fit_max_steps_*)."""
from __future__ import annotations

import errno
import os

import pytest

from attnlab.cli import preflight
from attnlab.cli.preflight import check_run_root, check_training_budget
from attnlab.errors import ConfigError


def test_a_creatable_root_passes_and_the_probe_leaves_nothing(tmp_path):
    check_run_root(tmp_path / "runs" / "deeper")
    check_run_root(tmp_path)  # an existing folder
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_keeps_its_words(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=f"run.root={blocker / 'runs'} cannot be created: {blocker} is a file"):
        check_run_root(blocker / "runs")


def test_a_link_to_nothing_is_named_as_such(tmp_path):
    (tmp_path / "runs").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'runs'} is a link to nothing"):
        check_run_root(tmp_path / "runs" / "sub")


def test_a_name_too_long_is_one_config_error(tmp_path):
    root = tmp_path / ("r" * 300) / "runs"
    with pytest.raises(ConfigError, match=os.strerror(errno.ENAMETOOLONG)) as raised:
        check_run_root(root)
    assert f"run.root={root} cannot be created" in str(raised.value) and "choose another --run.root" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fails", ["mkdtemp", "makedirs"])
def test_any_os_error_making_the_root_is_one_config_error_and_leaves_nothing(tmp_path, monkeypatch, fails):
    """A read-only mount, a full disk, a quota: whatever the OS says, said as run.root's reason."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    if fails == "mkdtemp":
        monkeypatch.setattr(preflight.tempfile, "mkdtemp", read_only)
    else:
        monkeypatch.setattr(preflight.os, "makedirs", read_only)
    with pytest.raises(ConfigError, match=f"making a folder in {tmp_path} fails \\({os.strerror(errno.EROFS)}\\)"):
        check_run_root(tmp_path / "runs", "--output")
    assert list(tmp_path.iterdir()) == []  # the probe made before makedirs failed is gone too


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")
def test_a_pseudo_file_system_is_refused_even_for_root():
    with pytest.raises(ConfigError, match="run.root=/proc/attnlab_runs cannot be"):
        check_run_root("/proc/attnlab_runs")


@pytest.mark.parametrize("config, fit, words", [
    ({"max_steps": 0}, True, "trainer.max_steps=0 trains nothing"),
    ({"max_epochs": 0, "max_steps": -1}, True, "trainer.max_epochs=0 trains nothing"),
    ({"max_epochs": 3, "max_steps": 0}, True, "trainer.max_steps=0"),
    ({"max_steps": -5}, False, "trainer.max_steps=-5 is not a limit"),
    ({"max_epochs": -2}, True, "trainer.max_epochs=-2 is not a limit"),
])
def test_a_training_budget_of_nothing_is_refused(config, fit, words):
    with pytest.raises(ConfigError, match=words):
        check_training_budget(config, fit=fit)


@pytest.mark.parametrize("config, fit", [
    ({}, True), ({"max_steps": -1, "max_epochs": None}, True), ({"max_steps": -1, "max_epochs": -1}, True),
    ({"max_steps": 1, "max_epochs": 1}, True), ({"max_steps": 0}, False),  # validate / test train nothing anyway
])
def test_a_training_budget_that_trains_or_is_not_fit_passes(config, fit):
    check_training_budget(config, fit=fit)
