"""Where a run's logs go: CSV always, wandb by default (offline without credentials), TensorBoard optional.

wandb must never prompt or block: without credentials it runs offline and we say where the
run went and how to upload it.
"""
from __future__ import annotations

import netrc
import os
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.loggers import Logger

from attnlab.checkpoints.atomic import atomic_write_text
from attnlab.errors import ConfigError
from attnlab.training.resume import ResumableCSVLogger

WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_ID_FILE = "wandb_id.txt"  # in the run folder: the id a resumed run continues


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
    checkpoint_every_n_steps: int = 200  # last.ckpt this often (optimizer steps) and after each validation
    monitor: str = "val/nll"  # the validation metric that picks checkpoints/best-*.ckpt (and stops early)
    monitor_mode: str | None = None  # min or max; default: max for bleu, bleu_lc, chrf, exact_match, else min
    patience: int | None = None  # stop after this many validations without improvement of `monitor`
    init_from: str | None = None  # fit: start from this checkpoint's network weights (any family whose network fits)
    budget: dict | None = None  # fit: one of {flops: F}, {tokens: T}, {epochs: E}, {time: DD:HH:MM:SS} sets the run's
    # length (trainer.max_steps, or max_time), replacing the config's: see attnlab.training.budget

    def __post_init__(self):
        if self.wandb not in WANDB_MODES:
            raise ConfigError(f"run.wandb={self.wandb!r} is not one of {', '.join(WANDB_MODES)}")
        if isinstance(self.checkpoint_every_n_steps, bool) or not isinstance(self.checkpoint_every_n_steps, int) \
                or self.checkpoint_every_n_steps < 1:
            raise ConfigError(f"run.checkpoint_every_n_steps={self.checkpoint_every_n_steps!r} must be an integer >= 1")
        if not isinstance(self.monitor, str) or not self.monitor.startswith("val/"):
            raise ConfigError(f"run.monitor={self.monitor!r} must be a validation metric such as val/nll or val/bleu "
                              "(checkpoints are chosen on validation data)")
        if self.monitor_mode not in (None, "min", "max"):
            raise ConfigError(f"run.monitor_mode={self.monitor_mode!r} must be min or max (or left unset)")
        from attnlab.training.budget import parse_budget

        self.budget = None if self.budget is None else parse_budget(self.budget, "run.budget").as_dict()
        if self.patience is not None and (isinstance(self.patience, bool) or not isinstance(self.patience, int)
                                          or self.patience < 1):
            raise ConfigError(f"run.patience={self.patience!r} must be an integer >= 1 (validations without "
                              "improvement before stopping), or left unset for no early stopping")

    @property
    def mode(self) -> str:
        """min or max for `monitor`: higher is better for the generation scores and speed."""
        if self.monitor_mode:
            return self.monitor_mode
        from attnlab.families.metric_keys import GENERATION_METRICS, LOWER_IS_BETTER

        name = self.monitor.rsplit("/", 1)[-1]
        return "max" if name in GENERATION_METRICS and name not in LOWER_IS_BETTER else "min"


def wandb_credentials_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


# What wandb itself accepts in WANDB_MODE (wandb.Settings.mode); anything else fails wandb.init.
WANDB_ENV_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def resolve_wandb_mode(requested: str) -> str:
    """'auto' becomes online only when credentials exist; WANDB_MODE from the environment wins."""
    env = os.environ.get("WANDB_MODE")
    if env and env not in WANDB_ENV_MODES and requested != "disabled":
        raise ConfigError(
            f"WANDB_MODE={env!r} in the environment is not a wandb mode (online, offline or disabled): "
            "unset it or fix it, or turn wandb off with --run.wandb disabled"
        )
    if env in ("offline", "disabled", "online") and requested == "auto":
        return env
    if requested == "auto":
        return "online" if wandb_credentials_present() else "offline"
    return requested


def build_loggers(options: RunOptions, name: str, version: str, config: dict | None = None,
                  resume: bool = False) -> list[Logger]:
    """Loggers of run folder `<root>/<name>/<version>` (attnlab.training.run_folder picks the version).
    resume: the run continues from its last.ckpt, so metrics.csv and the wandb run continue too."""
    mode = resolve_wandb_mode(options.wandb)
    if mode == "online" and not wandb_credentials_present():
        raise ConfigError(
            "run.wandb=online but no wandb credentials were found: run `wandb login` or set "
            "WANDB_API_KEY, or use --run.wandb auto (offline without credentials) / offline / disabled"
        )
    loggers: list[Logger] = [ResumableCSVLogger(options.root, name=name, version=version, resume=resume)]
    run_dir = Path(options.root) / name / version
    if options.tensorboard:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(str(run_dir), name="tensorboard", version=""))
    if mode != "disabled":
        from attnlab.loggers.wandb_fallback import (
            FallbackWandbLogger,  # offline, with one line, if online fails
        )

        run_dir.mkdir(parents=True, exist_ok=True)
        loggers.append(
            FallbackWandbLogger(
                project=options.project, name=f"{name}/{version}", group=options.group,
                save_dir=str(run_dir), offline=mode == "offline", mode=mode, config=config,
                settings=quiet_wandb_settings(), **wandb_run_id(run_dir, resume),
            )
        )
    return loggers


def wandb_run_id(run_dir: Path, resume: bool) -> dict:
    """The run folder's wandb id (written at its first start), so a resumed run continues the same
    wandb run. A fresh run in a reused folder gets a new id."""
    path = run_dir / WANDB_ID_FILE
    if resume and path.is_file() and path.read_text().strip():
        return {"id": path.read_text().strip(), "resume": "allow"}
    if int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return {}
    import secrets
    import string

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # wandb's id format
    atomic_write_text(path, run_id + "\n")
    return {"id": run_id}


def quiet_wandb_settings():
    import wandb

    from attnlab.loggers.wandb_fallback import init_timeout

    # No console capture (it fights the progress bar) and never ask anything on stdin; an
    # unreachable server costs init_timeout seconds (30, WANDB_INIT_TIMEOUT), then we go offline.
    return wandb.Settings(console="off", silent=True, init_timeout=init_timeout())


def describe_run(loggers: list[Logger]) -> list[str]:
    """Lines telling the user where each logger wrote."""
    lines = []
    for logger in loggers:
        kind = type(logger).__name__
        if kind.endswith("CSVLogger"):  # ResumableCSVLogger too
            lines.append(f"run folder: {logger.log_dir} (metrics.csv, config.yaml, checkpoints/)")
        elif kind == "TensorBoardLogger":
            lines.append(f"tensorboard: tensorboard --logdir {logger.log_dir}")
        elif kind.endswith("WandbLogger"):  # FallbackWandbLogger too
            run = logger.experiment
            folder = Path(run.dir).parent if getattr(run, "dir", None) else logger.save_dir
            if getattr(run, "settings", None) is not None and run.settings.mode == "offline":
                lines.append(_offline_sync_line(folder, getattr(run, "id", None)))
            elif getattr(run, "url", None):
                lines.append(f"wandb: {run.url}")
    return lines


def _offline_sync_line(folder: Path, run_id: str | None) -> str:
    """How to upload an offline run: a resumed run is one wandb run in several segments
    (offline-run-<time>-<id>), which `wandb sync` keeps as one only when given all of them in one
    command (it then syncs them in order of start time); synced one by one, the last replaces them."""
    segments = sorted(Path(folder).parent.glob(f"offline-run-*-{run_id}")) if run_id else []
    if len(segments) < 2:
        return f"wandb (offline): {folder}; upload with `wandb sync {folder}`"
    return (f"wandb (offline): {len(segments)} segments of one resumed run in {Path(folder).parent}; upload them "
            f"together, in one command: `wandb sync {' '.join(map(str, segments))}`")
