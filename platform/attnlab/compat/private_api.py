"""The private Lightning API attnlab still relies on, each name listed once with why.

No public API offers these; `get` / `put` are the only way the rest of the code touches one, and
fail with one clear line (the installed version, the one these were read in) once an upgrade
removes it. tests/test_private_api.py checks every entry against the installed Lightning.
"""
from __future__ import annotations

from importlib.metadata import version

from attnlab.errors import AttnlabError

READ_IN = "2.6"  # the Lightning release (major.minor) whose source these names were read in

# (class, attribute) -> why attnlab needs it
USED = {
    ("CSVLogger", "_experiment"): "a resumed run's logger writes with a writer that continues metrics.csv",
    ("CSVLogger", "_fs"): "that writer's folder is made with the logger's own filesystem",
    ("ExperimentWriter", "_check_log_dir_exists"): "Lightning's writer deletes an existing metrics.csv here",
    ("ExperimentWriter", "_record_new_keys"): "the header of a continued metrics.csv takes the new keys",
    ("WandbLogger", "_experiment"): "a failed online start is dropped before starting offline",
    ("WandbLogger", "_offline"): "the logger is switched to offline after a failed online start",
    ("WandbLogger", "_wandb_init"): "the offline start takes wandb.init's settings, mode and id",
    ("_ChildProcessObserver", "_run"): "Lightning's child watcher SIGKILLs rank zero when a child fails; muted "
                                       "while rank zero stops the children itself and reports why",
}


def lightning_version() -> str:
    return version("lightning")


def _check_listed(obj, name: str) -> None:
    classes = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
    if not any((cls.__name__, name) in USED for cls in classes):
        raise AssertionError(f"{type(obj).__name__}.{name} is private API not listed in attnlab.compat.private_api.USED")


def _gone(obj, name: str) -> AttnlabError:
    return AttnlabError(
        f"the installed lightning {lightning_version()} has no {type(obj).__name__}.{name}, which attnlab "
        f"uses (read in lightning {READ_IN}): install lightning {READ_IN}.* or a release that still has it"
    )


def get(obj, name: str):
    """obj.<name>, a listed private attribute or method."""
    _check_listed(obj, name)
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _gone(obj, name) from None


def put(obj, name: str, value) -> None:
    """Set a listed private attribute that the object already has."""
    _check_listed(obj, name)
    if not hasattr(obj, name):
        raise _gone(obj, name)
    setattr(obj, name, value)
