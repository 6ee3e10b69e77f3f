"""Checkpoint averaging (the paper averages the last 5 / 20 checkpoints): a callback and a function."""
from __future__ import annotations

from collections import deque
from pathlib import Path

import lightning as L
import torch

from attnlab.errors import AttnlabError


def average_state_dicts(state_dicts: list[dict]) -> dict:
    """Element-wise mean of floating-point tensors; other entries are taken from the last."""
    if not state_dicts:
        raise AttnlabError("nothing to average: no checkpoints given")
    keys = state_dicts[-1].keys()
    for i, sd in enumerate(state_dicts):
        if sd.keys() != keys:
            raise AttnlabError(f"checkpoint {i + 1} has different parameters than the last one: average runs of one model only")
        for key, value in sd.items():
            last = state_dicts[-1][key]
            if torch.is_tensor(value) and torch.is_tensor(last) and value.shape != last.shape:
                raise AttnlabError(
                    f"checkpoint {i + 1}'s {key} has shape {tuple(value.shape)} but the last one's has "
                    f"{tuple(last.shape)}: average checkpoints of one model configuration only"
                )
    out = {}
    for key, last in state_dicts[-1].items():
        if torch.is_floating_point(last):
            out[key] = torch.stack([sd[key].float() for sd in state_dicts]).mean(0).to(last.dtype)
        else:
            out[key] = last
    return out


def average_checkpoints(paths: list[str | Path], output: str | Path) -> Path:
    """Write a checkpoint like the last of `paths` whose weights are the mean of all of them."""
    from attnlab.checkpoints.reading import read_checkpoint

    output = Path(output)
    if output.exists():  # before reading anything: nothing of the user's is ever replaced
        raise AttnlabError(f"--output {output} exists already; choose another --output (nothing was overwritten)")
    checkpoints = [read_checkpoint(path) for path in paths]
    families = {(c.get("attnlab") or {}).get("family") for c in checkpoints}
    if len(families) != 1:
        named = ", ".join(f"{p} ({c['attnlab']['family']})" for p, c in zip(paths, checkpoints))
        raise AttnlabError(f"cannot average checkpoints of different families: {named}")
    merged = dict(checkpoints[-1])
    try:
        merged["state_dict"] = average_state_dicts([c["state_dict"] for c in checkpoints])
    except AttnlabError as err:  # it counts checkpoints; name the files
        raise AttnlabError(f"{err} (checkpoints in order: {', '.join(map(str, paths))})") from None
    torch.save(merged, output)
    return output


class CheckpointAveraging(L.Callback):
    """Keep the weights of the last `last_k` epochs in memory; at the end of fit write
    `averaged.ckpt` (their mean) next to the other checkpoints."""

    def __init__(self, last_k: int = 5):
        if last_k < 1:
            raise AttnlabError(f"CheckpointAveraging last_k={last_k} must be >= 1")
        self.last_k = last_k
        self.snapshots: deque = deque(maxlen=last_k)
        self.path: Path | None = None

    def on_fit_start(self, trainer, pl_module):
        if _fully_sharded(trainer) and _state_dict_type(trainer.strategy) != "full":
            raise AttnlabError("CheckpointAveraging under FSDP needs single-file checkpoints: "
                               "set the strategy's state_dict_type to full")

    def on_train_epoch_end(self, trainer, pl_module):
        if _fully_sharded(trainer):
            # Under FSDP the module's own state_dict holds shards (FSDP2) or misses the root unit's
            # weights (FSDP1); the strategy's is complete, on rank zero (a collective: every rank asks).
            state = trainer.strategy.lightning_module_state_dict()
            self.snapshots.append({k: v.detach().to("cpu", copy=True) for k, v in state.items()})
            return
        self.snapshots.append({k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()})

    def on_fit_end(self, trainer, pl_module):
        if not self.snapshots or trainer.checkpoint_callback is None or not trainer.checkpoint_callback.dirpath:
            return
        if _fully_sharded(trainer):
            self._write_sharded_average(trainer)
            return
        current = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        pl_module.load_state_dict(average_state_dicts(list(self.snapshots)))
        self.path = Path(trainer.checkpoint_callback.dirpath) / "averaged.ckpt"
        trainer.save_checkpoint(self.path)
        pl_module.load_state_dict(current)

    def _write_sharded_average(self, trainer) -> None:
        """FSDP: write the ordinary checkpoint (a collective), then put the average in it on rank zero."""
        self.path = Path(trainer.checkpoint_callback.dirpath) / "averaged.ckpt"
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            checkpoint = torch.load(self.path, map_location="cpu", weights_only=True)
            checkpoint["state_dict"] = average_state_dicts(list(self.snapshots))
            torch.save(checkpoint, self.path)
        trainer.strategy.barrier()


def _fully_sharded(trainer) -> bool:
    """FSDP: attnlab's LayerWiseFSDP (FSDP2) or Lightning's FSDPStrategy (FSDP1)."""
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.distributed.fsdp import LayerWiseFSDP

    return isinstance(trainer.strategy, (LayerWiseFSDP, FSDPStrategy))


def _state_dict_type(strategy) -> str:
    """"full" (single-file checkpoints) or "sharded" (LayerWiseFSDP's option; Lightning's FSDPStrategy keeps it private)."""
    return getattr(strategy, "state_dict_type", "full")
