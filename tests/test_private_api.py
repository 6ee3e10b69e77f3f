"""Every private Lightning name attnlab uses (attnlab.compat.private_api.USED) still exists and
still does what it is used for, in the installed Lightning; and nothing private is used unlisted."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

import attnlab
from attnlab.compat import private_api as private
from attnlab.errors import AttnlabError


def _csv_logger(tmp_path):
    return CSVLogger(tmp_path, name="x", version="v")


def _wandb_logger(tmp_path):
    return WandbLogger(save_dir=str(tmp_path), offline=True, mode="disabled")


# (class, name) -> a check that the name exists on a fresh instance and does what attnlab assumes
CHECKS = {
    ("CSVLogger", "_experiment"): lambda tmp: private.get(_csv_logger(tmp), "_experiment") is None,  # made lazily
    ("CSVLogger", "_fs"): lambda tmp: hasattr(private.get(_csv_logger(tmp), "_fs"), "makedirs"),
    ("ExperimentWriter", "_check_log_dir_exists"): lambda tmp: any(  # called by the writer's __init__
        "self._check_log_dir_exists()" in inspect.getsource(c.__init__) for c in ExperimentWriter.__mro__
        if "__init__" in vars(c) and c.__module__.startswith("lightning")),
    ("ExperimentWriter", "_record_new_keys"): lambda tmp: callable(private.get(ExperimentWriter(str(tmp)), "_record_new_keys")),
    ("WandbLogger", "_experiment"): lambda tmp: private.get(_wandb_logger(tmp), "_experiment") is None,
    ("WandbLogger", "_offline"): lambda tmp: private.get(_wandb_logger(tmp), "_offline") is True,
    ("WandbLogger", "_wandb_init"): lambda tmp: private.get(_wandb_logger(tmp), "_wandb_init").get("mode") == "disabled",
    ("_ChildProcessObserver", "_run"): lambda tmp: "self._run()" in inspect.getsource(_ChildProcessObserver.run),
}


def test_every_listed_name_has_a_check():
    assert set(CHECKS) == set(private.USED)


@pytest.mark.parametrize("entry", sorted(private.USED), ids=lambda e: ".".join(e))
def test_the_name_still_exists_and_means_the_same(entry, tmp_path):
    assert CHECKS[entry](tmp_path), f"lightning {private.lightning_version()} changed {'.'.join(entry)}"


def test_an_unlisted_private_name_is_refused():
    with pytest.raises(AssertionError, match="not listed"):
        private.get(CSVLogger("."), "_name")


def test_a_name_an_upgrade_removed_is_one_clear_error():
    class Renamed(CSVLogger):
        def __getattribute__(self, name):
            if name == "_fs":
                raise AttributeError(name)
            return super().__getattribute__(name)

    with pytest.raises(AttnlabError, match=r"has no Renamed\._fs.*install lightning"):
        private.get(Renamed("."), "_fs")


def test_nothing_outside_the_compat_module_reaches_into_lightning_or_torch_privately():
    """Private attributes of other libraries' objects are reached only through private_api.get/put."""
    package = Path(attnlab.__file__).parent
    names = sorted({name for _, name in private.USED})
    pattern = re.compile(r"\.(?:%s)\b(?!\s*\()" % "|".join(re.escape(n) for n in names))
    offenders = []
    for path in package.rglob("*.py"):
        if path.parent.name == "compat":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(package)}:{i}: {line.strip()}")
    assert not offenders
