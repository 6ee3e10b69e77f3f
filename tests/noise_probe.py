"""A callback for the distributed tests (`--trainer.callbacks+=noise_probe.NoiseProbe`, with tests/ on
PYTHONPATH): before every training batch each rank appends to noise_rank<R>.jsonl, in the working
folder, the first uniforms that batch will draw from torch's global generator (a copy of its
state, so the run itself is untouched). Block diffusion draws its block times from there first."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class NoiseProbe(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        copy = torch.Generator()
        copy.set_state(torch.get_rng_state())
        line = {"step": trainer.global_step, "uniforms": torch.rand(8, generator=copy).tolist()}
        with (Path.cwd() / f"noise_rank{trainer.global_rank}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
