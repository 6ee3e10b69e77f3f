"""Checks made before anything is built or written: the accelerator the config asks for
exists, the run folder's root can be created, and `fit` has steps or epochs to train."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

from attnlab.errors import ConfigError


def check_accelerator(accelerator, devices=None) -> None:
    """`--trainer.accelerator gpu` (cuda, mps) on a machine without one, or more GPUs than it has."""
    if not isinstance(accelerator, str):
        return  # auto, cpu, or an Accelerator instance: Lightning decides
    name = accelerator.lower()
    has_cuda, has_mps = CUDAAccelerator.is_available(), MPSAccelerator.is_available()
    missing = (name == "cuda" and not has_cuda) or (name == "mps" and not has_mps) or (
        name == "gpu" and not (has_cuda or has_mps))
    if missing:
        why = "this torch was built without CUDA" if torch.version.cuda is None else "torch.cuda.is_available() is False"
        raise ConfigError(f"trainer.accelerator={accelerator}: this machine has no {name.upper()} that torch can use "
                          f"({why}): use --trainer.accelerator cpu (or auto, which picks what there is)")
    if name in ("gpu", "cuda") and has_cuda and isinstance(devices, int) and not isinstance(devices, bool):
        count = CUDAAccelerator.auto_device_count()
        if devices > count:
            raise ConfigError(f"trainer.devices={devices} but this machine has {count} GPU(s): "
                              f"use --trainer.devices {count} (or auto)")


def check_run_root(root: str | os.PathLike, name: str = "run.root") -> None:
    """The run root (or another output folder, `name`) must exist as a writable folder or be
    creatable. Permission bits do not tell (root may write anywhere, /proc refuses everyone, a
    read-only mount, a name too long), so the missing part of the path is made for real inside a
    temporary folder next to it, then removed: nothing is left behind."""
    flag = f"--{name.removeprefix('--')}"
    path = Path(os.path.abspath(Path(root).expanduser()))
    existing, missing = path, []
    while not os.path.lexists(existing) and existing != existing.parent:  # lexists: False on any error
        existing, missing = existing.parent, [existing.name, *missing]
    if not existing.is_dir():
        what = "a link to nothing" if existing.is_symlink() and not existing.exists() else "a file, not a folder"
        raise ConfigError(f"{name}={root} cannot be created: {existing} is {what}; choose another {flag}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={root} cannot be written: {existing} is not writable by this user; "
                          f"choose another {flag}")
    probe = None
    try:
        probe = tempfile.mkdtemp(prefix=".attnlab-probe-", dir=existing)
        if missing:
            os.makedirs(os.path.join(probe, *missing))
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        verb = "created" if missing else "written"
        raise ConfigError(f"{name}={root} cannot be {verb}: making a folder in {existing} fails "
                          f"({reason}); choose another {flag}") from err
    finally:
        if probe is not None:
            shutil.rmtree(probe, ignore_errors=True)


def check_training_budget(trainer_config, fit: bool = True) -> None:
    """trainer.max_steps / max_epochs that Lightning refuses only after the run folder is written
    (below -1: a traceback) or that train nothing (0, for `fit`: exit 0 and a run folder without
    a trained model), and a limit_train_batches of 0 (Lightning skips training without a word)."""
    for field, unit, other in (("max_steps", "steps", "max_epochs"), ("max_epochs", "epochs", "max_steps")):
        value = trainer_config.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value > 0 or value == -1:
            continue  # None (Lightning's default) and non-integers are left to Lightning and jsonargparse
        if value < -1 or fit:
            what = "trains nothing" if value == 0 else "is not a limit Lightning accepts"
            raise ConfigError(f"trainer.{field}={value} {what}: give a positive number of {unit}, or -1 for no "
                              f"limit (with --trainer.{other} N), e.g. --trainer.{field} 1000")
    batches = trainer_config.get("limit_train_batches")
    if fit and not isinstance(batches, bool) and isinstance(batches, (int, float)) and batches <= 0:
        raise ConfigError(f"trainer.limit_train_batches={batches} trains nothing: give a number of batches per "
                          "epoch (an integer) or a fraction of the epoch (0 to 1.0], e.g. --trainer.limit_train_batches 1.0")
