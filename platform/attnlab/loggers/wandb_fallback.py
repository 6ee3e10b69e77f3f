"""A WandbLogger that falls back to offline when wandb cannot start online, instead of failing the run.

wandb.init in online mode talks to the server (WANDB_BASE_URL, api.wandb.ai by default) and
raises wandb.errors.CommError after `init_timeout` seconds when it is unreachable, or
CommError / UsageError when the key, entity or project is refused. Losing the dashboard must not
cost the run: we log offline into the same run folder and say so once, with the upload command.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from attnlab.compat import private_api as private

# Seconds wandb.init may take online before we give up and go offline (wandb's own default: 90).
# WANDB_INIT_TIMEOUT in the environment overrides it.
DEFAULT_INIT_TIMEOUT = 30.0


def init_timeout() -> float:
    try:
        return float(os.environ.get("WANDB_INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT))
    except ValueError:
        return DEFAULT_INIT_TIMEOUT


class FallbackWandbLogger(WandbLogger):
    """WandbLogger whose online start-up failure switches it to offline with one line on stderr."""

    fell_back = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Lightning passes `anonymous=None` on to wandb.init, and wandb >= 0.19 warns about any value
        # of that retired setting; leaving it out changes nothing else.
        settings = private.get(self, "_wandb_init")
        if settings.get("anonymous") is None:
            settings.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self):
        if (private.get(self, "_experiment") is None and not private.get(self, "_offline")
                and private.get(self, "_wandb_init").get("mode") != "disabled"):
            try:
                return super().experiment
            except Exception as err:  # noqa: BLE001 - any failure to start online: go offline
                self._go_offline(err)
        return super().experiment

    def _go_offline(self, err: BaseException) -> None:
        import wandb

        try:  # a half-started online run must not be reused by the offline one
            if wandb.run is not None:
                wandb.finish(exit_code=1, quiet=True)
        except Exception:  # noqa: BLE001
            pass
        # wandb's service process still holds the failed run's id ("run ID ... is in use"), and the
        # offline run keeps that id (a resumed run continues it): start a fresh service.
        try:
            wandb.teardown()
        except Exception:  # noqa: BLE001
            pass
        private.put(self, "_experiment", None)
        private.put(self, "_offline", True)
        settings = private.get(self, "_wandb_init")
        settings["mode"] = "offline"
        try:
            run = super().experiment
        except Exception:  # noqa: BLE001 - still in use: a new id, offline all the same
            if "id" not in settings:
                raise
            settings.pop("id")
            private.put(self, "_experiment", None)
            run = super().experiment
        self.fell_back = True
        folder = Path(run.dir).parent if getattr(run, "dir", None) else Path(self.save_dir or ".")
        reason = (str(err).strip().splitlines() or [""])[0]
        reason = (reason[:200] + "...") if len(reason) > 200 else reason
        print(f"attnlab: wandb could not start online ({type(err).__name__}: {reason}); logging offline to "
              f"{folder} instead; upload it later with `wandb sync {folder}`", file=sys.stderr, flush=True)
