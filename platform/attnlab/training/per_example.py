"""Per-example values of `attnlab test` / `validate`: examples.jsonl in the run folder.

The test of two single systems (one shared seed) compares them example by example: sacreBLEU's
paired bootstrap for BLEU / chrF and a paired permutation test for NLL, bits per byte and exact
match; `stats.seed_test` scores each seed's corpus from the same statistics. So every evaluation
keeps, for each example of the split: its index, source, reference, hypothesis, NLL in nats and
in bits (a bound for block diffusion), target tokens, reference bytes and whether it matched
exactly. Under DDP every rank's share is gathered and rank zero writes one
file in split order.
"""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from attnlab.training.examples_file import FILE, write_examples


class PerExampleWriter(Callback):
    """Writes the module's `example_records` at the end of a test or validate run (not in `fit`)."""

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._write(trainer, pl_module)

    def _write(self, trainer, pl_module) -> None:
        records = gather_rows(trainer, list(getattr(pl_module, "example_records", [])))
        log_dir = trainer.log_dir  # a collective under DDP: every rank asks
        if trainer.is_global_zero and log_dir and records:
            write_examples(Path(log_dir) / FILE, records)


def gather_rows(trainer, rows: list) -> list:
    """Every rank's rows on every rank (a collective under DDP: all ranks call it), in rank order."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized() and trainer.world_size > 1):
        return rows
    shares: list = [None] * trainer.world_size
    torch.distributed.all_gather_object(shares, rows)
    return [row for share in shares for row in share]
