"""What a sweep file says: base config(s), a grid of overrides, fixed overrides, evaluations.

    base: decoder_only.yaml            # or a list: one family per point (compare_families)
    grid:
      model.init_args.backbone.n_heads: [1, 2, 4, 8, 16]
    seeds: [0, 1, 2]                   # every point once per seed (seed_everything), in <point>/seed<k>/
    fixed:
      trainer.max_epochs: 3
    evaluate:                          # after fit, test a checkpoint once per entry
      test: {}                         # the best by run.monitor (default val/nll)
      len2x: {data.init_args.eval_length_factor: 2}
      avg: {checkpoint: averaged}      # best, last or averaged (CheckpointAveraging's averaged.ckpt)

Paths in `base` are relative to the sweep file. Every mistake names the field and the fix,
before any run starts.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from attnlab.errors import ConfigError

KNOWN_KEYS = {"base", "grid", "fixed", "evaluate", "name", "seeds"}
CHECKPOINTS = ("best", "last", "averaged")  # what an evaluate entry's `checkpoint` may name


@dataclass
class SweepPoint:
    """One run of the sweep: its grid point's name, configs, the overrides that make it differ and
    its seed (None: the config's own seed_everything, and no seed folder)."""

    name: str
    configs: list[Path]
    overrides: dict[str, Any]
    index: int = 0  # place in the sweep file, so reports list points in that order
    seed: int | None = None

    @property
    def folder(self) -> str:
        """Where the run goes under the sweep folder: <point> or <point>/seed<k>."""
        return self.name if self.seed is None else f"{self.name}/seed{self.seed}"


@dataclass
class SweepSpec:
    path: Path
    name: str
    bases: list[Path]
    grid: dict[str, list]
    fixed: dict[str, Any] = field(default_factory=dict)
    evaluate: dict[str, dict[str, Any]] = field(default_factory=lambda: {"test": {}})
    seeds: list[int] | None = None

    def grid_points(self) -> list[SweepPoint]:
        """One point per base and grid combination, without seeds."""
        keys = list(self.grid)
        short = _short_names(keys)
        out = []
        for base in self.bases:
            for values in itertools.product(*(self.grid[k] for k in keys)):
                parts = [base.stem] if len(self.bases) > 1 else []
                parts += [f"{short[k]}={_format(v)}" for k, v in zip(keys, values)]
                overrides = {**self.fixed, **dict(zip(keys, values))}
                out.append(SweepPoint(",".join(parts) or base.stem, [base], overrides, len(out)))
        return out

    def points(self) -> list[SweepPoint]:
        """Every run: each grid point once per seed (seeds outer, so a partial sweep covers all points)."""
        points = self.grid_points()
        if self.seeds is None:
            return points
        return [replace(p, seed=seed) for seed in self.seeds for p in points]


def _format(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _short_names(keys: list[str]) -> dict[str, str]:
    """The last dotted part of each key (n_heads), or the whole key where two would clash."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(raw, dict) or "base" not in raw:
        raise ConfigError(f"{path}: a sweep needs `base:` (an experiment config or a list of them) and `grid:`")
    unknown = set(raw) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; a sweep has {', '.join(sorted(KNOWN_KEYS))}")
    bases = raw["base"] if isinstance(raw["base"], list) else [raw["base"]]
    base_paths = [(path.parent / str(b)) for b in bases]
    for given, resolved in zip(bases, base_paths):
        if not resolved.is_file():
            raise ConfigError(f"{path}: base {given!r} is not a file (looked for {resolved}; paths are relative to the sweep file)")
    grid = _mapping(raw.get("grid"), path, "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list of values, e.g. [1, 2, 4]")
    if not grid and len(base_paths) < 2:
        raise ConfigError(f"{path}: the grid is empty and there is one base, so there is nothing to sweep")
    evaluate = raw.get("evaluate", {"test": {}})
    evaluate = _mapping(evaluate, path, "evaluate")
    for name, overrides in evaluate.items():
        _mapping(overrides, path, f"evaluate.{name}")
        if name == "fit" or "/" in name or name.startswith("seed"):
            raise ConfigError(f"{path}: evaluate.{name}: pick another name (not 'fit', no '/', not starting with 'seed')")
        checkpoint = (overrides or {}).get("checkpoint", "best")
        if checkpoint not in CHECKPOINTS:
            raise ConfigError(f"{path}: evaluate.{name}.checkpoint={checkpoint!r} must be one of {', '.join(CHECKPOINTS)}")
    seeds = check_seeds(raw["seeds"], f"{path}: seeds") if "seeds" in raw else None
    spec = SweepSpec(path, str(raw.get("name") or name_under_experiments(path)), base_paths, grid, _mapping(raw.get("fixed"), path, "fixed"),
                     {k: dict(v or {}) for k, v in evaluate.items()}, seeds)
    names = [p.name for p in spec.grid_points()]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: two grid points get the same folder name; give the bases different file names")
    return spec


def check_seeds(value, where: str) -> list[int]:
    """A non-empty list of distinct integers (bools are not integers here)."""
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"{where} must be a non-empty list of distinct integers, e.g. [0, 1, 2] (got {value!r})")
    if len(set(value)) != len(value):
        repeated = sorted({v for v in value if value.count(v) > 1})
        raise ConfigError(f"{where} lists {', '.join(map(str, repeated))} more than once: each seed must be distinct")
    return list(value)


def evaluation_checkpoint(overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(which checkpoint an evaluate entry tests, its config overrides without that key)."""
    rest = {k: v for k, v in overrides.items() if k != "checkpoint"}
    return overrides.get("checkpoint", "best"), rest


def _mapping(value, path: Path, field_name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: `{field_name}` must be a mapping of dotted config keys to values")
    return value


def as_cli_args(overrides: dict[str, Any]) -> list[str]:
    """`--key=value` flags (values as JSON, so null, lists and strings survive jsonargparse)."""
    return [f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in overrides.items()]


def wandb_sweep_config(spec: SweepSpec) -> dict:
    """The same grid as a wandb sweep, for users who launch runs with `wandb agent`."""
    parameters: dict[str, dict] = {}
    configs = [str(b) for b in spec.bases]
    parameters["config"] = {"values": configs} if len(configs) > 1 else {"value": configs[0]}
    for key, value in spec.fixed.items():
        parameters[key] = {"value": value}
    for key, values in spec.grid.items():
        parameters[key] = {"values": values}
    if spec.seeds is not None:
        parameters["seed_everything"] = {"values": spec.seeds}
    parameters["run.group"] = {"value": spec.name}
    return {
        "name": spec.name,
        "method": "grid",
        "metric": {"name": "val/nll", "goal": "minimize"},
        "parameters": parameters,
        "command": ["attnlab", "fit", "${args}"],
    }


def name_under_experiments(config: Path) -> str:
    """A config's path under the nearest experiments/ folder, without .yaml (multi30k/compare_families),
    else its file name: the run folder's name, so configs of one name in two folders never share one."""
    path = Path(config).resolve().with_suffix("")
    parts = path.parts
    if "experiments" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("experiments"):])
    return path.name
