"""Checks of the environment a run needs, made before anything is built or written: the
accelerator the config asks for exists, and the run folder's root can be created."""
from __future__ import annotations

import os
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
    creatable (nothing is created here)."""
    path = Path(root).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{name}={root} cannot be created: {existing} is a file, not a folder; "
                          f"choose another --{name.removeprefix('--')}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={root} cannot be written: {existing} is not writable by this user; "
                          f"choose another --{name.removeprefix('--')}")
