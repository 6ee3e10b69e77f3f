"""AtomicCheckpointIO: Lightning's checkpoint writer through `atomic_torch_save`.

Apart from checkpoints/atomic.py so that the atomic writes of text (sweeps, reports) import
neither torch nor Lightning.
"""
from __future__ import annotations

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from attnlab.checkpoints.atomic import atomic_torch_save


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, through `atomic_torch_save` (see attnlab.checkpoints.atomic)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)
