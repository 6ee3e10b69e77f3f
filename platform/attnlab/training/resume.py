"""Resuming a run: last.ckpt written during the epoch, RNG states in it, and a CSV log that continues.

A run killed at any point (SIGKILL included) and started again with the same command and
`--run.version` continues from `checkpoints/last.ckpt` exactly as if it had not stopped:

- `LastCheckpoint` writes last.ckpt every `run.checkpoint_every_n_steps` optimizer steps and after
  every validation (Lightning's saves are atomic: a kill while writing leaves the previous file).
- Lightning restores weights, optimizer, LR schedule and loop progress; `RngStates` restores the
  global torch / python / numpy RNGs (dropout, block-diffusion noise) at the first batch after it.
  (Training noise is per rank: `RngStates` seeds each rank's torch generator by (seed, rank).)
- The training batch order is fixed by (seed, epoch) and the data module skips the batches of the
  interrupted epoch that were already trained (`TokenizedDataModule.state_dict`).
- `EpochEndResume` makes a checkpoint from an epoch's end resume the next epoch when max_steps
  bounds the run, as Lightning does when epochs bound it.
- `ResumableCSVLogger` keeps the run's metrics.csv and drops the rows that the resumed run logs
  again (those written after the checkpoint), so every step appears exactly once.
"""
from __future__ import annotations

import csv
import io
import os
import random
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from attnlab.checkpoints.atomic import atomic_write_text, complete_lines
from attnlab.compat import private_api as private

DEFAULT_CHECKPOINT_EVERY_N_STEPS = 200


class LastCheckpoint(ModelCheckpoint):
    """Only `last.ckpt`: every `every_n_train_steps` optimizer steps (mid-epoch, so a killed run loses
    at most that many steps) and after each validation. The best-by-val/nll checkpoint is another
    ModelCheckpoint; only this one writes last.ckpt."""

    def __init__(self, every_n_train_steps: int = DEFAULT_CHECKPOINT_EVERY_N_STEPS):
        super().__init__(save_top_k=0, save_last=True, every_n_train_steps=every_n_train_steps)

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # A user's own ModelCheckpoint(save_last=True) (--trainer.callbacks+=...) owns last.ckpt:
        # two writers would make Lightning version the name (last-v1.ckpt).
        if any(c is not self and c.save_last for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)):
            self.save_last = False

    # After a validation, also at the step last.ckpt was just written: the file then holds the
    # finished validation and the best checkpoint's updated record, so a resume repeats neither.
    # Where ModelCheckpoint saves (train epoch end when validation runs once per epoch, else
    # validation end), and after it: this callback comes later in trainer.callbacks.
    # (ModelCheckpoint's methods used here are private: see attnlab.compat.private_api.)
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if private.get(self, "_should_save_on_train_epoch_end")(trainer):
            self._save_last_after_validation(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not private.get(self, "_should_save_on_train_epoch_end")(trainer):
            self._save_last_after_validation(trainer)

    def _save_last_after_validation(self, trainer) -> None:
        if trainer.fast_dev_run or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        private.get(self, "_save_last_checkpoint")(trainer, private.get(self, "_monitor_candidates")(trainer))


class EpochEndResume(Callback):
    """A fit resumed from a checkpoint written at an epoch's end starts the next epoch as
    Lightning does for epoch-bound runs, also when max_steps bounds the run (a run.budget sets it).

    Lightning's fit loop treats a finished epoch as "not actually restarting" unless the training
    is iteration-based (`max_steps` set), where it forces a restart of that epoch: its end runs
    again, which moves the sampler one epoch ahead and the logged step one step late (seen: from
    step 8 of 8-step epochs, the resumed run trained epoch 2's order as epoch 1, logged from step 9).
    So the loop's progress is restored with max_steps unset, as for an epoch-bound run, and
    max_steps is put back before the first training step. A checkpoint from the middle of an epoch
    restarts that epoch either way.
    """

    def __init__(self):
        self._max_steps: int | None = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if trainer.state.fn == "fit" and trainer.max_steps != -1:  # the loops are restored next
            self._max_steps = trainer.max_steps
            trainer.fit_loop.epoch_loop.max_steps = -1

    def on_train_start(self, trainer, pl_module) -> None:
        self._put_back(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._put_back(trainer)

    def _put_back(self, trainer) -> None:
        if self._max_steps is not None:
            trainer.fit_loop.epoch_loop.max_steps, self._max_steps = self._max_steps, None


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The torch seed of one rank's training noise, mixed from (seed, global rank, step) by
    numpy's SeedSequence, so nearby seeds and ranks give unrelated streams."""
    import numpy as np

    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


class RngStates(Callback):
    """Per-rank training noise, and exact resume of it on one process.

    At the start of training each rank seeds torch's global generator (dropout, block-diffusion
    masks and times) by (seed, global rank): under DDP every rank draws its own noise, as N
    processes of batch B should (Lightning seeds every rank alike). The states go into every
    checkpoint and are restored at the first training batch after a resume on one process (so
    whatever ran in between, e.g. building loaders, does not matter). A checkpoint holds rank
    zero's states only, so a resume on N > 1 ranks reseeds each by (seed, rank, step): the same
    on every such resume, but not the stream the interrupted run would have drawn.

    Stored as tensors and plain tuples only, so checkpoints still load with weights_only=True.
    """

    def __init__(self):
        self._pending: dict | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        if self._pending is not None and trainer.world_size == 1:
            return  # restored exactly at the first batch
        self._pending = None
        seed = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed() % 2**32))
        torch.manual_seed(rank_seed(seed, trainer.global_rank, trainer.global_step))

    def state_dict(self) -> dict:
        state = {"torch": torch.get_rng_state(), "python": random.getstate()}
        try:
            import numpy as np

            kind, keys, pos, has_gauss, gauss = np.random.get_state()
            state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
        except ImportError:
            pass
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self._pending = dict(state_dict)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        state, self._pending = self._pending, None
        if not state:
            return
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        if "numpy" in state:
            import numpy as np

            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        if state.get("cuda") and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])


class _SafeWriter(ExperimentWriter):
    """Lightning's writer, safe against a crash: rows are appended, so a kill or a full disk damages
    at most the last line (which a resume and the report drop); where the whole file must be written
    again (a new metric's column, a resume's trim) it is written beside and renamed over the old one,
    where Lightning rewrites it in place and a kill there lost every row."""

    _on_disk: list[str] | None = None  # the header the file has
    _trim = None  # a filter of the earlier rows for the next save, which then rewrites the file

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        private.get(self, "_record_new_keys")()
        if path.is_file() and (self._on_disk != self.metrics_keys or self._trim is not None):
            complete, _ = complete_lines(path.read_text(encoding="utf-8"))
            rows = [row for row in csv.DictReader(io.StringIO(complete, newline=""))
                    if self._trim is None or self._trim(row)]
            out = io.StringIO(newline="")
            writer = csv.DictWriter(out, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows + self.metrics)
            atomic_write_text(path, out.getvalue())
        else:
            with open(path, "a" if path.is_file() else "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                if f.tell() == 0:
                    writer.writeheader()
                writer.writerows(self.metrics)
        self._on_disk = list(self.metrics_keys)
        self._trim = None
        self.metrics = []


class _ContinuingWriter(_SafeWriter):
    """A writer that keeps an existing metrics.csv (Lightning's deletes it).

    At the first write, rows the resumed run is about to log again are dropped: rows at a later
    step than the first new row, and rows at the same step that share a metric with it (a
    validation repeated after the resume), and a partial last line. Everything before is kept.
    """

    def __init__(self, log_dir: str) -> None:
        path = Path(log_dir) / self.NAME_METRICS_FILE
        header: list[str] = []
        self._resuming = path.is_file()
        if self._resuming:
            complete, _ = complete_lines(path.read_text(encoding="utf-8"))
            header = list(csv.DictReader(io.StringIO(complete, newline="")).fieldnames or [])
        super().__init__(log_dir)
        self.metrics_keys = sorted(header)
        self._on_disk = header

    def _check_log_dir_exists(self) -> None:  # listed in attnlab.compat.private_api
        """Lightning's deletes metrics.csv and warns: here the file is continued."""

    def save(self) -> None:
        if self._resuming and self.metrics:
            self._resuming = False
            first = self.metrics[0]
            step, keys = int(first["step"]), set(first) - {"step", "epoch"}

            def kept(row: dict) -> bool:
                if row.get("step") in (None, ""):
                    return True
                row_step = int(float(row["step"]))
                if row_step != step:
                    return row_step < step
                return not (keys & {k for k, v in row.items() if v not in (None, "") and k not in ("step", "epoch")})

            self._trim = kept
        super().save()


class _FreshWriter(_SafeWriter):
    """Lightning's writer, without its warning that the run folder is not empty: the folder holds this
    run's own config.yaml and wandb/ by then. An earlier run's metrics.csv is still replaced, said once."""

    def _check_log_dir_exists(self) -> None:  # listed in attnlab.compat.private_api
        path = Path(self.log_dir) / self.NAME_METRICS_FILE
        if path.is_file():
            rank_zero_info(f"replacing the metrics.csv of an earlier run in {self.log_dir}")
            path.unlink()


class ResumableCSVLogger(CSVLogger):
    """CSVLogger that, with `resume=True`, continues the run folder's metrics.csv (see _ContinuingWriter),
    and otherwise starts it afresh without warning about the run's own files (_FreshWriter)."""

    def __init__(self, *args, resume: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._resume = resume

    @property
    def experiment(self):
        if private.get(self, "_experiment") is None and rank_zero_only.rank == 0:
            private.get(self, "_fs").makedirs(self.root_dir, exist_ok=True)
            writer = _ContinuingWriter if self._resume else _FreshWriter
            private.put(self, "_experiment", writer(log_dir=self.log_dir))
        return super().experiment


def last_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a fit of this run folder resumes from: checkpoints/last.ckpt (a file, or a
    sharded folder with a complete step), or the newest hpc_ckpt_N.ckpt that Lightning's SLURM requeue wrote into the folder (the run folder is the
    trainer's default_root_dir) when it holds a later step."""
    from attnlab.checkpoints import sharded_steps

    run_dir = Path(run_dir)
    path = run_dir / "checkpoints" / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
    if path.is_dir():  # sharded (LayerWiseFSDP): resumable once one step folder is complete
        return path if sharded_steps.newest(path) is not None else None
    candidates = [path] if path.is_file() else []
    requeued = sorted(run_dir.glob("hpc_ckpt_*.ckpt"), key=lambda p: int(p.stem.rpartition("_")[2] or 0))
    candidates += requeued[-1:]
    if len(candidates) < 2:
        return candidates[0] if candidates else None
    return max(candidates, key=_global_step)  # a tie keeps last.ckpt


def _global_step(checkpoint: Path) -> int:
    try:
        return int(torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # noqa: BLE001 - a damaged file is refused when it is read for the resume
        return -1
