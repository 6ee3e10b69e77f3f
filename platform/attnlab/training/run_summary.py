"""`summary.json` in every fit run folder: what a report needs and metrics.csv lacks."""
from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L

from attnlab.checkpoints.atomic import atomic_write_text
from attnlab.training.ledger import BudgetLedger


class RunSummary(L.Callback):
    """Family, parameter count, wall time of fit, epochs, steps and the metric that picks the best
    checkpoint ("monitor"), written when fit ends; with a
    BudgetLedger among the callbacks its totals ("ledger") and, under run.budget, what the budget
    derived ("budget": the budget itself, max_steps and the cost per step it came from)."""

    def setup(self, trainer, pl_module, stage):
        # Counted before the strategy wraps the model: FSDP leaves each rank only its shard.
        self._params = sum(p.numel() for p in pl_module.parameters())

    def on_fit_start(self, trainer, pl_module):
        self._started = time.perf_counter()

    def on_fit_end(self, trainer, pl_module):
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask, rank zero writes
        if not log_dir or not trainer.is_global_zero:
            return
        summary = {
            "family": pl_module.family,
            # what the family says it is, so a report reads it without importing the class (and torch)
            "traits": pl_module.traits(),
            "params": self._params,
            "fit_seconds": round(time.perf_counter() - self._started, 2),
            "epochs": trainer.current_epoch,
            "steps": trainer.global_step,
        }
        selection = next((c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None)), None)
        if selection is not None:  # what "best" means for this run's checkpoints (the report's best columns)
            summary["monitor"] = {"metric": selection.monitor, "mode": selection.mode}
        for ledger in (c for c in trainer.callbacks if isinstance(c, BudgetLedger)):
            summary["ledger"] = ledger.totals()
            summary["steps"] += ledger.inherited_steps  # the network's steps, the run.init_from it started from included
            if ledger.plan is not None:
                summary["budget"] = ledger.plan
        atomic_write_text(Path(log_dir) / "summary.json", json.dumps(summary, indent=1) + "\n")
