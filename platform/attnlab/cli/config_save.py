"""A run's config.yaml written whole or not at all.

Lightning's SaveConfigCallback writes it in place through the parser, so a kill or a full disk at
that moment left a truncated config beside a run that resumes from it. Here the text goes through
the atomic writer (a temporary file beside it, renamed over) by the callback's public
`save_config` hook, on rank zero only.
"""
from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import SaveConfigCallback

from attnlab.checkpoints.atomic import atomic_write_text


class AtomicConfigSave(SaveConfigCallback):
    """SaveConfigCallback with its own write (its in-place one is switched off)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "save_to_log_dir": False})

    def save_config(self, trainer, pl_module, stage) -> None:
        # the first logger's folder is the run folder (trainer.log_dir would broadcast, and only rank zero is here)
        folder = trainer.loggers[0].log_dir if trainer.loggers else trainer.default_root_dir
        atomic_write_text(Path(folder) / self.config_filename, self.parser.dump(self.config, skip_none=False))
