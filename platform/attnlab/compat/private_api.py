"""The private API of other libraries (Lightning, sacreBLEU) attnlab still relies on, each name
listed once with why.

No public API offers these; `get` / `put` are the only way the rest of the code touches one, and
fail with one clear line (the installed version, the one these were read in) once an upgrade
removes it. tests/test_private_api.py checks every entry against the installed libraries, and
that no private name of another library is reached outside this module.
"""
from __future__ import annotations

from importlib.metadata import version

from attnlab.errors import AttnlabError

# the release (major.minor) of each library whose source these names were read in
READ_IN = {"lightning": "2.6", "sacrebleu": "2.6"}

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
    ("ModelCheckpoint", "_should_save_on_train_epoch_end"): "last.ckpt after a validation is written where "
                                                            "ModelCheckpoint saves: train epoch end or validation end",
    ("ModelCheckpoint", "_save_last_checkpoint"): "writes last.ckpt as Lightning's own save does, after a "
                                                 "validation and when a fit is preempted",
    ("ModelCheckpoint", "_monitor_candidates"): "the metrics that last.ckpt records, gathered as Lightning gathers them",
    ("Trainer", "_accelerator_connector"): "its cluster environment decides, as Lightning's signal connector does, "
                                          "whether SLURM's requeue owns SIGUSR1 and SIGTERM (one GPU included)",
    ("CHRF", "_extract_corpus_statistics"): "chrF's per-sentence statistics: summed, they sync exactly over DDP "
                                           "ranks, and give stats.seed_test each seed's corpus chrF",
    ("CHRF", "_compute_score_from_stats"): "the corpus chrF of those summed statistics, as sacreBLEU computes it",
}


def lightning_version() -> str:
    return version("lightning")


def _listed_in(obj, name: str) -> str:
    """The library (top-level package) of the listed class that `obj.<name>` belongs to."""
    classes = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
    for cls in classes:
        if (cls.__name__, name) in USED:
            return cls.__module__.split(".")[0]
    raise AssertionError(f"{type(obj).__name__}.{name} is private API not listed in attnlab.compat.private_api.USED")


def _gone(obj, name: str) -> AttnlabError:
    library = _listed_in(obj, name)
    return AttnlabError(
        f"the installed {library} {version(library)} has no {type(obj).__name__}.{name}, which attnlab "
        f"uses (read in {library} {READ_IN[library]}): install {library} {READ_IN[library]}.* or a release "
        "that still has it"
    )


def get(obj, name: str):
    """obj.<name>, a listed private attribute or method."""
    _listed_in(obj, name)
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _gone(obj, name) from None


def put(obj, name: str, value) -> None:
    """Set a listed private attribute that the object already has."""
    _listed_in(obj, name)
    if not hasattr(obj, name):
        raise _gone(obj, name)
    setattr(obj, name, value)
