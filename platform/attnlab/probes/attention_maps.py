"""Per-layer, per-head attention maps of one fixed example, as PNG grids (rows = layers, cols = heads).

Each family says what its attention looks like through `FamilyModule.attention_weights(example)`,
so the callback and `render_checkpoint` work for every family. Colour is the probability on a
fixed [0, 1] scale, so heads and epochs compare.
"""
from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from attnlab.errors import ConfigError
from attnlab.reports.plots import pyplot

MAX_LABELS = 40  # longer sequences get no tick labels: they would be unreadable
@contextlib.contextmanager
def evaluating(module):
    """Eval mode (no dropout) without gradients, restoring the module's mode afterwards."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        module.train(was_training)


def render_map(amap, path: Path, title: str = "") -> np.ndarray:
    """Write one AttentionMap as a PNG grid; returns the image as HWC uint8 RGB (for TensorBoard)."""
    plt = pyplot()
    n_layers, n_heads, n_q, n_k = amap.weights.shape
    labelled = max(n_q, n_k) <= MAX_LABELS
    width, height = (min(max(0.16 * n, 1.6), 4.0) for n in (n_k, n_q))
    margin = 1.0 if labelled else 0.3
    fig, axes = plt.subplots(n_layers, n_heads, squeeze=False,
                             figsize=(n_heads * width + margin, n_layers * height + margin + 0.4))
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(amap.weights[layer, head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis",
                      aspect="auto", interpolation="nearest")
            ax.set_xticks(range(n_k) if labelled and layer == n_layers - 1 else [])
            ax.set_yticks(range(n_q) if labelled and head == 0 else [])
            if labelled and layer == n_layers - 1:
                ax.set_xticklabels(amap.keys, rotation=90, fontsize=6)
            if labelled and head == 0:
                ax.set_yticklabels(amap.queries, fontsize=6)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    characters_per_line = int(fig.get_figwidth() * 14)  # about 14 characters per inch at this font size
    fig.suptitle(textwrap.fill(title or amap.kind, characters_per_line), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


class AttentionMaps(Callback):
    """Render the attention of validation example `example_index` every `every_n_epochs` epochs.

    PNGs go to `<log_dir>/attention/epoch=<e>-<kind>.png` and to any wandb / TensorBoard logger.
    Add with `trainer.callbacks: [{class_path: attnlab.probes.attention_maps.AttentionMaps}]`.
    """

    def __init__(self, every_n_epochs: int = 1, example_index: int = 0):
        if every_n_epochs < 1:
            raise ConfigError(f"AttentionMaps every_n_epochs={every_n_epochs} must be >= 1")
        if example_index < 0:
            raise ConfigError(f"AttentionMaps example_index={example_index} must be >= 0")
        self.every_n_epochs, self.example_index = every_n_epochs, example_index
        self.written: list[Path] = []

    def _example(self, trainer):
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "examples"):
            examples = datamodule.examples("val")
        else:  # a bare dataloader over Examples
            loader = trainer.val_dataloaders
            examples = (loader[0] if isinstance(loader, (list, tuple)) else loader).dataset
        if self.example_index >= len(examples):
            raise ConfigError(
                f"AttentionMaps example_index={self.example_index} but the val split has {len(examples)} "
                "examples: choose a smaller example_index"
            )
        return examples[self.example_index]

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch
        if trainer.sanity_checking or (epoch + 1) % self.every_n_epochs:
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask, rank zero draws
        if not trainer.is_global_zero:
            return
        with evaluating(pl_module):
            maps = pl_module.attention_weights(self._example(trainer))
        folder = Path(log_dir or trainer.default_root_dir) / "attention"
        for amap in maps:
            path = folder / f"epoch={epoch}-{amap.kind}.png"
            image = render_map(amap, path, f"{pl_module.family} {amap.kind} attention, epoch {epoch}")
            self.written.append(path)
            _log_image(trainer, f"attention/{amap.kind}", path, image)


def _log_image(trainer, key: str, path: Path, image: np.ndarray) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[str(path)], step=trainer.global_step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, trainer.global_step, dataformats="HWC")


def render_checkpoint(ckpt_path, source: str, target: str | None, out_dir) -> list[Path]:
    """Write `<out_dir>/<kind>.png` for one source string (and its target; None: the model's own
    greedy output), teacher-forced through a checkpoint's model. Returns the paths."""
    from attnlab.checkpoints.reading import load_checkpoint
    from data_modules.batch import Example

    module, _ = load_checkpoint(ckpt_path)
    if module.tokenizer is None:
        raise ConfigError(f"checkpoint {ckpt_path} holds no tokenizer: attention maps need one to read the text")
    if target is None:
        target = module.translate([source])[0]
    example = Example(module.tokenizer.encode(source), module.tokenizer.encode(target), source, target)
    with evaluating(module):
        maps = module.attention_weights(example)
    out_dir = Path(out_dir)
    paths = []
    for amap in maps:
        path = out_dir / f"{amap.kind}.png"
        render_map(amap, path, f"{module.family} {amap.kind} attention: {source!r} → {target!r}")
        paths.append(path)
    return paths


def attention_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="attnlab attention",
        description="Draw the per-layer, per-head attention of a checkpoint for one input, teacher-forced "
                    "on its target (default: the model's own greedy output); one PNG per attention kind.",
    )
    parser.add_argument("checkpoint", help="a .ckpt written by attnlab fit")
    parser.add_argument("source", help="the input text, e.g. 'seven hundred sixty three'")
    parser.add_argument("--target", help="the output to attend over (default: what the model generates)")
    parser.add_argument("--output", default="attention_maps", help="folder for the PNGs (default: attention_maps)")
    args = parser.parse_args(argv)
    if not Path(args.checkpoint).is_file():
        raise ConfigError(f"checkpoint {args.checkpoint} does not exist")
    for path in render_checkpoint(args.checkpoint, args.source, args.target, args.output):
        print(f"wrote {path}")
    return 0
