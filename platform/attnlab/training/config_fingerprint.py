"""What a resumed fit must share with the run it continues: the resolved settings that change what
training computes, saved in every checkpoint (`checkpoint["attnlab"]["config"]`).

A run folder is found again by its name (`--run.version`, a job id), and a name says nothing of
the config: a fit with another learning rate under the same job id would otherwise resume the
first run's weights and optimizer state and log into its metrics. Only the model, the data, the
seed and the trainer settings that change the arithmetic count; how long to train (max_steps,
budgets), where (devices, strategy) and how to evaluate or log may change between segments.
"""
from __future__ import annotations

from typing import Any

# Trainer settings that change what a step computes; the rest say how long, where and how to log.
TRAINER_KEYS = ("precision", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm")
# Settings under model/data that only change how fast, or how evaluation runs, not the training.
FREE_LEAVES = ("num_workers", "cache_dir", "eval_batch_size", "compile")


def fingerprint(config: dict) -> dict[str, Any]:
    """The settings of a fit's resolved config (as config.yaml holds it) that a resume must keep,
    flattened to dotted keys as the command line spells them."""
    flat: dict[str, Any] = {}
    for section in ("model", "data"):
        _flatten(config.get(section), section, flat)
    flat["seed_everything"] = config.get("seed_everything")
    trainer = config.get("trainer") or {}
    for key in TRAINER_KEYS:
        flat[f"trainer.{key}"] = trainer.get(key)
    return flat


def _flatten(value, prefix: str, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key not in FREE_LEAVES:
                _flatten(inner, f"{prefix}.{key}", out)
    else:
        out[prefix] = value


def differences(saved: dict, current: dict) -> list[str]:
    """`key: saved -> current` for each setting that differs (a key only one side has included)."""
    missing = object()
    lines = []
    for key in sorted(set(saved) | set(current)):
        before, after = saved.get(key, missing), current.get(key, missing)
        if before != after:
            lines.append(f"{key}: {_shown(before, missing)} there, {_shown(after, missing)} now")
    return lines


def _shown(value, missing) -> str:
    return "unset" if value is missing else repr(value)
