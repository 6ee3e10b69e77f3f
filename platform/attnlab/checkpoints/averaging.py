"""Checkpoint averaging (the paper averages the last 5 / 20 checkpoints): a callback and a function."""
from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

import lightning as L
import torch

from attnlab.checkpoints.atomic import atomic_torch_save
from attnlab.errors import AttnlabError

# Segments that FSDP's and activation checkpointing's wrappers add to parameter names (not to a
# full state_dict's keys); torch.compile's OptimizedModule adds the last.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def parameter_names(module: torch.nn.Module) -> set[str]:
    """The state_dict keys of `module` that hold its parameters (a tied one under each of its names)."""
    names = set()
    for name, _ in module.named_parameters(remove_duplicate=False):
        for segment in _WRAPPER_SEGMENTS:
            name = name.replace(segment, "")
        names.add(name)
    return names


def average_state_dicts(state_dicts: list[dict], parameters: Collection[str], newest: int = -1) -> dict:
    """The element-wise mean of the `parameters` (state_dict keys); every other entry is the
    `newest` state's: a buffer is a record (block diffusion's chosen noise range), not a weight,
    and a mean of two records is neither."""
    if not state_dicts:
        raise AttnlabError("nothing to average: no checkpoints given")
    reference = state_dicts[newest]
    keys = reference.keys()
    missing = sorted(set(parameters) - set(keys))
    if missing:
        raise AttnlabError(f"the checkpoints lack parameters of their model ({', '.join(missing[:5])}): "
                           "average checkpoints of this model only")
    for i, sd in enumerate(state_dicts):
        if sd.keys() != keys:
            raise AttnlabError(f"checkpoint {i + 1} has different parameters than the newest one: average runs of one model only")
        for key, value in sd.items():
            last = reference[key]
            if torch.is_tensor(value) and torch.is_tensor(last) and value.shape != last.shape:
                raise AttnlabError(
                    f"checkpoint {i + 1}'s {key} has shape {tuple(value.shape)} but the newest one's has "
                    f"{tuple(last.shape)}: average checkpoints of one model configuration only"
                )
    out = {}
    for key, last in reference.items():
        if key in parameters and torch.is_floating_point(last):
            out[key] = torch.stack([sd[key].float() for sd in state_dicts]).mean(0).to(last.dtype)
        else:
            out[key] = last
    return out


def _checkpoint_parameter_names(checkpoint: dict) -> set[str]:
    """The parameter names of the model a checkpoint holds, from its family and hyper-parameters
    (built on the meta device: no memory, no initialisation)."""
    from attnlab.families import FAMILIES

    with torch.device("meta"):
        module = FAMILIES[checkpoint["attnlab"]["family"]](**checkpoint["hyper_parameters"])
    return parameter_names(module)


SNAPSHOTS = "averaging"  # CheckpointAveraging's folder of weight snapshots, inside checkpoints/


def _snapshot_as_checkpoint(path: Path, runs: dict[Path, dict]) -> dict:
    """A CheckpointAveraging snapshot (`checkpoints/averaging/step=N.pt`, weights only) inside its
    run's last.ckpt (read once per run into `runs`), so a finished run's snapshots still on disk
    (its last `last_k`) can be averaged in smaller windows afterwards: how many to average is a
    choice to make on validation, not before training."""
    from attnlab.checkpoints.reading import not_a_checkpoint, read_checkpoint

    if not path.is_file():
        raise AttnlabError(f"snapshot {path} does not exist; list the files in {path.parent}")
    last = path.parent.parent / "last.ckpt"
    if not last.is_file():
        raise AttnlabError(f"{path} is a CheckpointAveraging snapshot (weights only); averaging it needs its run's "
                           f"{last} for the rest of a checkpoint, and that file does not exist")
    if last not in runs:
        runs[last] = read_checkpoint(last)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets one line naming it
        raise not_a_checkpoint(path, str(err) or type(err).__name__, what="snapshot") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise AttnlabError(f"{path} is not a CheckpointAveraging snapshot (a mapping of parameter names to tensors)")
    return {**runs[last], "state_dict": state}


def average_checkpoints(paths: list[str | Path], output: str | Path) -> Path:
    """Write a checkpoint like the newest of `paths` whose parameters are the mean of all of them
    (checkpoints, or CheckpointAveraging snapshots of one run)."""
    from attnlab.checkpoints.reading import read_checkpoint

    output = Path(output)
    if output.exists():  # before reading anything: nothing of the user's is ever replaced
        raise AttnlabError(f"--output {output} exists already; choose another --output (nothing was overwritten)")
    paths, runs = [Path(p) for p in paths], {}
    checkpoints, steps = [], []
    for p in paths:
        snapshot = p.parent.name == SNAPSHOTS and re.fullmatch(r"step=(\d+)\.pt", p.name)
        checkpoints.append(_snapshot_as_checkpoint(p, runs) if snapshot else read_checkpoint(p))
        steps.append(int(snapshot.group(1)) if snapshot else int(checkpoints[-1].get("global_step", -1)))
    families = {(c.get("attnlab") or {}).get("family") for c in checkpoints}
    if len(families) != 1:
        named = ", ".join(f"{p} ({c['attnlab']['family']})" for p, c in zip(paths, checkpoints))
        raise AttnlabError(f"cannot average checkpoints of different families: {named}")
    # The newest by step, not the last named (a shell sorts step=10.pt before step=9.pt), gives
    # everything but the parameters; of equal steps, the last named.
    newest = max(range(len(paths)), key=lambda i: (steps[i], i))
    merged = dict(checkpoints[newest])
    try:
        merged["state_dict"] = average_state_dicts([c["state_dict"] for c in checkpoints],
                                                   _checkpoint_parameter_names(merged), newest)
    except AttnlabError as err:  # it counts checkpoints; name the files
        raise AttnlabError(f"{err} (checkpoints in order: {', '.join(map(str, paths))})") from None
    atomic_torch_save(merged, output)
    return output


class CheckpointAveraging(L.Callback):
    """At the end of fit write `averaged.ckpt`, the mean of the weights at the last `last_k`
    epoch ends, or, with `every_n_steps`, at the last `last_k` multiples of that many optimizer
    steps (the small-model recipes average by update count).

    The snapshots are files (`checkpoints/averaging/step=N.pt`, weights only), and the list of the
    current window is this callback's state in every checkpoint, so a run killed and resumed from
    last.ckpt averages the same snapshots as an uninterrupted one; in memory they would be lost with
    the process. A snapshot leaves the disk only when neither the window nor the one the last saved
    checkpoint holds names it (a resume may go back to that one); the window stays after fit, so a
    finished run resumed to train longer still averages its last snapshots."""

    FOLDER = SNAPSHOTS

    def __init__(self, last_k: int = 5, every_n_steps: int | None = None):
        if not _positive_int(last_k):
            raise AttnlabError(f"CheckpointAveraging last_k={last_k!r} must be an integer >= 1")
        if every_n_steps is not None and not _positive_int(every_n_steps):
            raise AttnlabError(f"CheckpointAveraging every_n_steps={every_n_steps!r} must be an integer >= 1, "
                               "or null to average the last epochs")
        self.last_k, self.every_n_steps = last_k, every_n_steps
        self.steps: list[int] = []  # the window: the global steps of the snapshots to average, oldest first
        self._saved: list[int] = []  # the window as the last written checkpoint holds it
        self.path: Path | None = None

    @property
    def state_key(self) -> str:
        return f"CheckpointAveraging{{'last_k': {self.last_k}, 'every_n_steps': {self.every_n_steps}}}"

    def state_dict(self) -> dict:
        self._saved = list(self.steps)
        return {"steps": list(self.steps)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.steps = [int(s) for s in state_dict.get("steps", [])]
        self._saved = list(self.steps)

    def on_fit_start(self, trainer, pl_module):
        if _fully_sharded(trainer) and _state_dict_type(trainer.strategy) != "full":
            raise AttnlabError("CheckpointAveraging under FSDP needs single-file checkpoints: "
                               "set the strategy's state_dict_type to full")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step not in self.steps:
            self._snapshot(trainer, pl_module)  # (step not yet in: gradient accumulation repeats a step)

    def on_train_epoch_end(self, trainer, pl_module):
        if not self.every_n_steps:
            self._snapshot(trainer, pl_module)

    def _folder(self, trainer) -> Path | None:
        dirpath = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else None
        return Path(dirpath) / self.FOLDER if dirpath else None

    def _snapshot(self, trainer, pl_module) -> None:
        folder = self._folder(trainer)
        if folder is None:
            return
        if _fully_sharded(trainer):
            # Under FSDP the module's own state_dict holds shards (FSDP2) or misses the root unit's
            # weights (FSDP1); the strategy's is complete, on rank zero (a collective: every rank asks).
            state = trainer.strategy.lightning_module_state_dict()
        else:
            state = pl_module.state_dict()
        step = trainer.global_step
        if trainer.is_global_zero:
            atomic_torch_save({k: v.detach().to("cpu") for k, v in state.items()}, folder / f"step={step}.pt")
        self.steps = [*[s for s in self.steps if s != step], step][-self.last_k:]
        if trainer.is_global_zero:
            self._forget(folder)

    def _forget(self, folder: Path) -> None:
        """Remove the snapshots neither the window nor the last saved checkpoint's window names."""
        keep = {f"step={s}.pt" for s in (*self.steps, *self._saved)}
        for path in folder.glob("step=*.pt"):
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def _snapshots(self, folder: Path) -> list[dict]:
        missing = [s for s in self.steps if not (folder / f"step={s}.pt").is_file()]
        if missing:
            raise AttnlabError(f"{folder} lacks the snapshots of steps {missing} that averaged.ckpt needs: resume "
                               "from last.ckpt (an older checkpoint's window may be gone), or average with `attnlab average`")
        return [torch.load(folder / f"step={s}.pt", map_location="cpu", weights_only=True) for s in self.steps]

    def on_fit_end(self, trainer, pl_module):
        folder = self._folder(trainer)
        if not self.steps or folder is None:
            return
        if _fully_sharded(trainer):
            self._write_sharded_average(trainer, folder)
            return
        # Only rank zero writes the checkpoint, and only its disk is sure to hold the snapshots.
        current = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        if trainer.is_global_zero:
            pl_module.load_state_dict(average_state_dicts(self._snapshots(folder), parameter_names(pl_module)))
        self.path = folder.parent / "averaged.ckpt"
        trainer.save_checkpoint(self.path)  # every rank calls it (a barrier); atomic_torch_save under attnlab's CLI
        pl_module.load_state_dict(current)

    def _write_sharded_average(self, trainer, folder: Path) -> None:
        """FSDP: write the ordinary checkpoint (a collective), then put the average in it on rank zero."""
        self.path = folder.parent / "averaged.ckpt"
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            checkpoint = torch.load(self.path, map_location="cpu", weights_only=True)
            checkpoint["state_dict"] = average_state_dicts(self._snapshots(folder), parameter_names(trainer.lightning_module))
            atomic_torch_save(checkpoint, self.path)
        trainer.strategy.barrier()


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _fully_sharded(trainer) -> bool:
    """FSDP: attnlab's LayerWiseFSDP (FSDP2) or Lightning's FSDPStrategy (FSDP1)."""
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.distributed.fsdp import LayerWiseFSDP

    return isinstance(trainer.strategy, (LayerWiseFSDP, FSDPStrategy))


def _state_dict_type(strategy) -> str:
    """"full" (single-file checkpoints) or "sharded" (LayerWiseFSDP's option; Lightning's FSDPStrategy keeps it private)."""
    return getattr(strategy, "state_dict_type", "full")
