"""Sharded checkpoints as a folder of step folders, each complete or absent, the last two kept.

A sharded checkpoint (LayerWiseFSDP with state_dict_type "sharded") is a folder of per-rank
shards, `.metadata` (torch.distributed.checkpoint's index) and `meta.pt` (Lightning's loop and
callback state). Written in place, a fault mid-save leaves a mix of two steps that loads as
neither. As torchtitan does, every save goes to a folder of its own instead:

    checkpoints/last.ckpt/            the name every attnlab path and message uses
        step-40/                      complete: .metadata, meta.pt, the shards
        step-50/                      the newest complete one: what a resume loads
        .step-60.partial/             being written (or left by a killed save): never loaded

A save writes `.step-N.partial/`, every rank's shards and rank zero's meta.pt, then rank zero
renames it to `step-N/` (the commit: one rename, atomic), drops all but the newest two complete
steps and any partial folder left by a killed save. The same command then resumes from the
newest complete step, whatever moment the previous process died at.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from attnlab.checkpoints.atomic import sync_folder

KEEP = 2
META = "meta.pt"  # Lightning's name for the non-tensor state of a sharded checkpoint
_STEP = re.compile(r"step-(\d+)")


def pending(folder: Path, step: int) -> Path:
    return Path(folder) / f".step-{step}.partial"


def complete_steps(folder: Path) -> list[Path]:
    """The committed step folders of a sharded checkpoint, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _STEP.fullmatch(p.name))]
    return [p for _, p in sorted(steps) if (p / ".metadata").is_file() and (p / META).is_file()]


def newest(folder: Path) -> Path | None:
    """What loading `folder` means: its newest complete step, or the folder itself when it is a
    sharded checkpoint written in place (by Lightning, or an earlier attnlab); None if neither."""
    steps = complete_steps(folder)
    if steps:
        return steps[-1]
    folder = Path(folder)
    return folder if (folder / ".metadata").is_file() and (folder / META).is_file() else None


def commit(folder: Path, step: int) -> Path:
    """Rename `.step-N.partial` to `step-N` (replacing a step-N saved before at the same step),
    then keep the newest KEEP complete steps and no partial folder. Rank zero only, once every
    rank has written its shards."""
    folder = Path(folder)
    final, written = folder / f"step-{step}", pending(folder, step)
    if final.exists():  # saved again at the same step (after a validation): the newer one wins
        replaced = folder / f".step-{step}.replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
    written.rename(final)
    sync_folder(folder)
    for old in complete_steps(folder)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in folder.glob(".step-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for name in (".metadata", META):  # an in-place checkpoint of an earlier attnlab, now superseded
        (folder / name).unlink(missing_ok=True)
    for shard in folder.glob("*.distcp"):
        shard.unlink(missing_ok=True)
    return final
