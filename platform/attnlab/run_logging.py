"""Where a run's logs go: CSV always, wandb by default (offline without credentials), TensorBoard optional.

wandb must never prompt or block: without credentials it runs offline and we say where the
run went and how to upload it.
"""
from __future__ import annotations

import netrc
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger

from attnlab.errors import ConfigError

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class RunOptions:
    """Run folder `<root>/<name>/<version>/` and the dashboards that see the run."""

    root: str = "runs"
    name: str | None = None  # default: the experiment config's file name
    version: str | None = None  # default: a timestamp
    wandb: str = "auto"  # auto: online with credentials, else offline; online; offline; disabled
    project: str = "attnlab"
    group: str | None = None
    tensorboard: bool = False

    def __post_init__(self):
        if self.wandb not in WANDB_MODES:
            raise ConfigError(f"run.wandb={self.wandb!r} is not one of {', '.join(WANDB_MODES)}")


def wandb_credentials_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_wandb_mode(requested: str) -> str:
    """'auto' becomes online only when credentials exist; WANDB_MODE from the environment wins."""
    env = os.environ.get("WANDB_MODE")
    if env in ("offline", "disabled", "online") and requested == "auto":
        return env
    if requested == "auto":
        return "online" if wandb_credentials_present() else "offline"
    return requested


def run_version(options: RunOptions, name: str) -> str:
    """A new timestamp per run (suffixed if taken); DDP workers inherit rank zero's via the environment."""
    if options.version:
        return options.version
    inherited = os.environ.get("ATTNLAB_RUN_VERSION")
    if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return inherited
    stamp = time.strftime("%Y%m%d-%H%M%S")
    version, n = stamp, 1
    while (Path(options.root) / name / version).exists():
        version, n = f"{stamp}-{n}", n + 1
    os.environ["ATTNLAB_RUN_VERSION"] = version
    return version


def build_loggers(options: RunOptions, name: str, config: dict | None = None) -> list[Logger]:
    mode = resolve_wandb_mode(options.wandb)
    if mode == "online" and not wandb_credentials_present():
        raise ConfigError(
            "run.wandb=online but no wandb credentials were found: run `wandb login` or set "
            "WANDB_API_KEY, or use --run.wandb auto (offline without credentials) / offline / disabled"
        )
    version = run_version(options, name)
    loggers: list[Logger] = [CSVLogger(options.root, name=name, version=version)]
    run_dir = Path(options.root) / name / version
    if options.tensorboard:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(str(run_dir), name="tensorboard", version=""))
    if mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        run_dir.mkdir(parents=True, exist_ok=True)
        loggers.append(
            WandbLogger(
                project=options.project, name=f"{name}/{version}", group=options.group,
                save_dir=str(run_dir), offline=mode == "offline", mode=mode, config=config,
                settings=quiet_wandb_settings(),
            )
        )
    return loggers


def quiet_wandb_settings():
    import wandb

    # No console capture (it fights the progress bar) and never ask anything on stdin.
    return wandb.Settings(console="off", silent=True)


def describe_run(loggers: list[Logger]) -> list[str]:
    """Lines telling the user where each logger wrote."""
    lines = []
    for logger in loggers:
        kind = type(logger).__name__
        if kind == "CSVLogger":
            lines.append(f"run folder: {logger.log_dir} (metrics.csv, config.yaml, checkpoints/)")
        elif kind == "TensorBoardLogger":
            lines.append(f"tensorboard: tensorboard --logdir {logger.log_dir}")
        elif kind == "WandbLogger":
            run = logger.experiment
            folder = Path(run.dir).parent if getattr(run, "dir", None) else logger.save_dir
            if getattr(run, "settings", None) is not None and run.settings.mode == "offline":
                lines.append(f"wandb (offline): {folder}; upload with `wandb sync {folder}`")
            elif getattr(run, "url", None):
                lines.append(f"wandb: {run.url}")
    return lines
