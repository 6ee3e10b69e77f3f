"""What a sweep file says: base config(s), a grid of overrides, fixed overrides, evaluations.

    base: decoder_only.yaml            # or a list: one family per point (compare_families)
    grid:
      model.init_args.backbone.n_heads: [1, 2, 4, 8, 16]
    points:                            # instead of a grid: named points, each its own overrides (an
      base: {}                         # ablation table changes one thing at a time, not all combinations)
      h=1: {model.init_args.backbone.n_heads: 1}
    reference: base                    # test every row against this point (default: the first point); with
                                       # several bases and a grid, a base: each grid cell (a facet, e.g. one
                                       # budget) is tested against that base's point in it, never across cells
    seeds: [0, 1, 2]                   # every point once per seed (seed_everything), in <point>/seed<k>/
    fixed:
      trainer.max_epochs: 3
    budget: {flops: 2.0e13}            # every point trains until it has spent this (run.budget: flops, tokens,
                                       # epochs or time; see attnlab.training.budget); a named point's own
                                       # `budget:` wins, e.g. points: {long: {budget: {epochs: 4}}}, and a
                                       # grid may list several: grid: {budget: [{flops: 1.0e12}, {flops: 4.0e12}]}
    evaluate:                          # after fit, test a checkpoint once per entry
      test: {}                         # the best by run.monitor (default val/nll)
      len2x: {data.init_args.eval_length_factor: 2}
      avg: {checkpoint: averaged}      # best, last or averaged (CheckpointAveraging's averaged.ckpt)
      b1: {points: [decoder_only], data.init_args.eval_batch_size: 1}  # only for these grid points
    frontier:                          # speed against quality: each decoding at each batch size
      batch_sizes: [1, 16, 256]
      decodings:                       # grid point -> decoding name -> its test overrides
        decoder_only: {greedy: {}}
        block_diffusion: {"tau=0.9": {model.init_args.unmasking: threshold, model.init_args.threshold: 0.9}}
      reference: decoder_only/greedy   # what the others are compared with (default: the first listed)
    init_from:                         # a point starts from another point's network at one of its steps,
      block_diffusion_from_ar: {point: decoder_only, step: 500}   # seed by seed (that point runs first,
                                       # saving checkpoints/step=500.ckpt); its ledger counts that network's cost
    tune:                              # the same search for every point before its seeds (Optuna; see
      trials: 8                        # attnlab.sweeps.tune): trials per point, chosen on validation
      space: {model.init_args.optimizer.lr: {low: 1.0e-4, high: 3.0e-3, log: true}}

A frontier becomes one evaluate entry per (decoding, batch size), named `<decoding>@b<batch>` and
run only for its point; with a frontier and no `evaluate:`, nothing else is tested.

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

KNOWN_KEYS = {"base", "grid", "points", "reference", "fixed", "evaluate", "frontier", "name", "seeds", "tune", "budget",
              "init_from"}
BUDGET = "run.budget"  # what a sweep's `budget:` sets (attnlab.training.budget)
ENTRY_KEYS = ("checkpoint", "points")  # keys of an evaluate entry that are not config overrides
EVAL_BATCH = "data.init_args.eval_batch_size"
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
    base: str = ""  # the stem of its base config (several bases: the contender)
    facet: str | None = None  # several bases and a grid: its grid values, the cell its tests stay within

    @property
    def folder(self) -> str:
        """Where the run goes under the sweep folder: <point> or <point>/seed<k>."""
        return self.name if self.seed is None else f"{self.name}/seed{self.seed}"


@dataclass
class Frontier:
    """Decodings to time at several batch sizes, as the evaluate entries they become (`entries`,
    each with its `points`) and what each entry is (`evaluations`: name -> (decoding, batch size),
    which done.json keeps for the report)."""

    reference: str  # <point>/<decoding>
    entries: dict[str, dict[str, Any]]
    evaluations: dict[str, tuple[str, int]]


@dataclass
class SweepSpec:
    path: Path
    name: str
    bases: list[Path]
    grid: dict[str, list]
    fixed: dict[str, Any] = field(default_factory=dict)
    evaluate: dict[str, dict[str, Any]] = field(default_factory=lambda: {"test": {}})
    seeds: list[int] | None = None
    frontier: Frontier | None = None
    named: dict[str, dict[str, Any]] | None = None  # `points:` (name -> overrides), instead of a grid
    reference: str | None = None  # the point (or, facetted, the base) rows are tested against (None: the first)
    tune: Any = None  # attnlab.sweeps.tune.TuneSpec: the same search for every point, before its seeds
    init_from: dict[str, tuple[str, int]] = field(default_factory=dict)  # point -> (source point, step)

    def reference_of(self, point: SweepPoint) -> str:
        """The name of the point `point` is tested against: in a facetted sweep (several bases and a
        grid) the reference base's point of its own facet, else the reference point; the first
        base or point by default (chosen before any result is seen)."""
        points = self.grid_points()
        if point.facet is None:
            return self.reference or points[0].name
        base = self.reference or points[0].base
        return next(p.name for p in points if p.facet == point.facet and p.base == base)

    def snapshot_steps(self, point: SweepPoint) -> list[int]:
        """The steps at which `point` saves checkpoints/step=<k>.ckpt for a point that starts from it."""
        return sorted({step for source, step in self.init_from.values() if source == point.name})

    def start_of(self, point: SweepPoint) -> str | None:
        """The checkpoint `point` starts from, relative to the sweep folder (None: a fresh start)."""
        if point.name not in self.init_from:
            return None
        source, step = self.init_from[point.name]
        folder = source if point.seed is None else f"{source}/seed{point.seed}"
        return f"{folder}/fit/checkpoints/step={step}.ckpt"

    @property
    def swept_keys(self) -> list[str]:
        """The keys that differ between points: the grid's, or every key a named point sets."""
        if self.named is None:
            return list(self.grid)
        return list(dict.fromkeys(key for overrides in self.named.values() for key in overrides))

    def evaluations_for(self, point: SweepPoint) -> dict[str, dict[str, Any]]:
        """The evaluate entries that run for `point` (an entry with `points:` only for those)."""
        return {name: entry for name, entry in self.evaluate.items()
                if "points" not in entry or point.name in entry["points"]}

    def grid_points(self) -> list[SweepPoint]:
        """One point per base and grid combination (or per named point), without seeds."""
        if self.named is not None:
            return [SweepPoint(name, list(self.bases), {**self.fixed, **overrides}, i, base=self.bases[0].stem)
                    for i, (name, overrides) in enumerate(self.named.items())]
        keys = list(self.grid)
        short = _short_names(keys)
        out = []
        for base in self.bases:
            for values in itertools.product(*(self.grid[k] for k in keys)):
                cell = [_part(k, short[k], v) for k, v in zip(keys, values)]
                parts = ([base.stem] if len(self.bases) > 1 else []) + cell
                overrides = {**self.fixed, **dict(zip(keys, values))}
                facet = ",".join(cell) if len(self.bases) > 1 and cell else None
                out.append(SweepPoint(",".join(parts) or base.stem, [base], overrides, len(out), base=base.stem,
                                      facet=facet))
        return out

    def points(self) -> list[SweepPoint]:
        """Every run: each grid point once per seed (seeds outer, so a partial sweep covers all points)."""
        points = self.grid_points()
        if self.seeds is None:
            return points
        return [replace(p, seed=seed) for seed in self.seeds for p in points]


def _format(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _part(key: str, short: str, value) -> str:
    """A grid point's name part: `n_heads=4`; a budget by its kind, `flops=2.5e12` (a folder name
    without braces or quotes)."""
    if key == BUDGET:
        from attnlab.training.budget import parse_budget

        return parse_budget(value).describe().replace(" ", "=", 1)
    return f"{short}={_format(value)}"


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
    # A grid's `budget:` is run.budget, as a point's is: a ladder of budgets, e.g. a compute frontier.
    grid = {BUDGET if key == "budget" else key: values for key, values in _mapping(raw.get("grid"), path, "grid").items()}
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list of values, e.g. [1, 2, 4]")
    named = _named_points(raw, path, len(base_paths)) if "points" in raw else None
    if named is not None and grid:
        raise ConfigError(f"{path}: give either `grid:` (every combination) or `points:` (named points), not both")
    if not grid and named is None and len(base_paths) < 2:
        raise ConfigError(f"{path}: the grid is empty and there is one base, so there is nothing to sweep")
    evaluate = raw.get("evaluate", {} if "frontier" in raw else {"test": {}})
    evaluate = {k: dict(_mapping(v, path, f"evaluate.{k}")) for k, v in _mapping(evaluate, path, "evaluate").items()}
    seeds = check_seeds(raw["seeds"], f"{path}: seeds") if "seeds" in raw else None
    fixed = dict(_mapping(raw.get("fixed"), path, "fixed"))
    if "budget" in raw:
        fixed[BUDGET] = raw["budget"]
    _check_budgets(path, fixed, grid, named)
    spec = SweepSpec(path, str(raw.get("name") or name_under_experiments(path)), base_paths, grid, fixed,
                     evaluate, seeds, named=named)
    names = [p.name for p in spec.grid_points()]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: two grid points get the same folder name; give the bases different file names")
    if "reference" in raw:
        facetted = any(p.facet is not None for p in spec.grid_points())
        allowed = list(dict.fromkeys(b.stem for b in base_paths)) if facetted else names
        if raw["reference"] not in allowed:
            kind = "a base (each grid cell is tested against its point of that base)" if facetted else "a point"
            raise ConfigError(f"{path}: reference={raw['reference']!r} must name {kind}: one of {', '.join(allowed)}")
        spec.reference = raw["reference"]
        for name, entry in evaluate.items():
            left_out = sorted({spec.reference_of(p) for p in spec.grid_points()} - set(entry.get("points", names)))
            if left_out:
                raise ConfigError(f"{path}: evaluate.{name}.points leaves out the reference point {left_out[0]!r}, "
                                  "so nothing could be tested against it: add it to that list")
    if "init_from" in raw:
        spec.init_from = _init_from(raw["init_from"], path, names)
    if "tune" in raw:
        from attnlab.sweeps.tune import parse_tune

        monitor = spec.fixed.get("run.monitor", "val/nll")
        spec.tune = parse_tune(raw["tune"], path, spec.swept_keys + list(spec.fixed), monitor, names)
    if "frontier" in raw:
        spec.frontier = _frontier(raw["frontier"], path, names)
        for name, entry in spec.frontier.entries.items():
            if name in evaluate:
                raise ConfigError(f"{path}: evaluate.{name} is also a frontier evaluation; rename one of them")
            evaluate[name] = entry
        untested = [p.name for p in spec.grid_points() if not spec.evaluations_for(p)]
        if untested:
            raise ConfigError(f"{path}: grid point(s) {', '.join(untested)} would train and never be tested: "
                              "list decodings for them under frontier.decodings, or add an `evaluate:` entry")
    for name, overrides in evaluate.items():
        if name == "fit" or "/" in name or name.startswith("seed"):
            raise ConfigError(f"{path}: evaluate.{name}: pick another name (not 'fit', no '/', not starting with 'seed')")
        checkpoint = overrides.get("checkpoint", "best")
        if checkpoint not in CHECKPOINTS:
            raise ConfigError(f"{path}: evaluate.{name}.checkpoint={checkpoint!r} must be one of {', '.join(CHECKPOINTS)}")
        if "points" in overrides:
            _point_names(overrides["points"], path, f"evaluate.{name}.points", names)
    return spec


def _init_from(raw, path: Path, names: list[str]) -> dict[str, tuple[str, int]]:
    """`init_from: {point: {point: source, step: k}}`, each source a point listed before its
    target (points run in file order within a seed, so the source's checkpoint exists)."""
    out = {}
    for target, entry in _mapping(raw, path, "init_from").items():
        where = f"{path}: init_from.{target}"
        if target not in names:
            raise ConfigError(f"{where}: no such point; points are {', '.join(names)}")
        entry = _mapping(entry, path, f"init_from.{target}")
        source, step = entry.get("point"), entry.get("step")
        if set(entry) != {"point", "step"} or source not in names or names.index(source) >= names.index(target):
            raise ConfigError(f"{where} must be {{point: <a point listed before {target}>, step: <k>}}, e.g. "
                              f"{{point: {names[0]}, step: 500}}; got {dict(entry)}")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigError(f"{where}.step={step!r} must be an optimizer step >= 1 of {source}'s fit")
        out[target] = (source, step)
    return out


def _named_points(raw: dict, path: Path, bases: int) -> dict[str, dict[str, Any]]:
    """`points:`: a mapping of point names (each a folder name) to their overrides, with one base."""
    points = _mapping(raw["points"], path, "points", of="point names to their overrides, e.g. {base: {}, h=1: {...}}")
    if not points:
        raise ConfigError(f"{path}: points is empty; name at least one point, e.g. {{base: {{}}}}")
    if bases != 1:
        raise ConfigError(f"{path}: named points need one base config (got {bases}); put each family's change in a point")
    for name, overrides in points.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: points.{name}: YAML reads this name as a {type(name).__name__}; quote it "
                              f"(\"{name}\": ...) to make it a folder name")
        if (not name or name in ("report", "fit") or name[0] in ".-"
                or name.startswith("seed") or any(c in name for c in "/,\\")):
            raise ConfigError(f"{path}: points.{name}: a point name is a folder name: no '/', ',' or '\\', "
                              "not 'report' or 'fit', not starting with '.', '-' or 'seed'")
        _mapping(overrides, path, f"points.{name}")
    # A point's `budget:` is its run.budget (the one key of a point that is not a config path).
    return {name: {BUDGET if key == "budget" else key: value for key, value in (overrides or {}).items()}
            for name, overrides in points.items()}


def _check_budgets(path: Path, fixed: dict, grid: dict, named: dict | None) -> None:
    """Every run.budget of the sweep (top level or fixed, a grid's values, named points), checked
    and written as numbers (PyYAML reads 2.0e13 as a string) before any run starts."""
    from attnlab.training.budget import parse_budget

    if BUDGET in fixed:
        fixed[BUDGET] = parse_budget(fixed[BUDGET], f"{path}: budget").as_dict()
    if BUDGET in grid:
        grid[BUDGET] = [parse_budget(v, f"{path}: grid.{BUDGET}").as_dict() for v in grid[BUDGET]]
    for name, overrides in (named or {}).items():
        if BUDGET in overrides:
            overrides[BUDGET] = parse_budget(overrides[BUDGET], f"{path}: points.{name}.budget").as_dict()


def _point_names(value, path: Path, where: str, names: list[str]) -> list[str]:
    if not isinstance(value, list) or not value or any(v not in names for v in value):
        raise ConfigError(f"{path}: {where} must be a non-empty list of the sweep's points ({', '.join(names)}); got {value!r}")
    return value


def _frontier(raw, path: Path, names: list[str]) -> Frontier:
    """Check a `frontier:` block (see the module docstring) and make it a Frontier."""
    raw = _mapping(raw, path, "frontier", of="batch_sizes, decodings and reference")
    unknown = set(raw) - {"batch_sizes", "decodings", "reference"}
    if unknown:
        raise ConfigError(f"{path}: frontier has unknown key(s) {', '.join(sorted(unknown))}; "
                          "it has batch_sizes, decodings and reference")
    batches = raw.get("batch_sizes")
    if not isinstance(batches, list) or not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                           for b in batches) or len(set(batches)) != len(batches):
        raise ConfigError(f"{path}: frontier.batch_sizes must be a list of distinct positive integers, e.g. [1, 16, 256]")
    decodings = _mapping(raw.get("decodings"), path, "frontier.decodings", of="grid points to their decodings")
    if not decodings or any(point not in names for point in decodings):
        raise ConfigError(f"{path}: frontier.decodings must map grid points ({', '.join(names)}) to their decodings, "
                          f"e.g. {{{names[0]}: {{greedy: {{}}}}}}; got {', '.join(map(str, decodings)) or 'none'}")
    for point, by_name in decodings.items():
        by_name = _mapping(by_name, path, f"frontier.decodings.{point}", of="decoding names to test-time overrides")
        if not by_name:
            raise ConfigError(f"{path}: frontier.decodings.{point} names no decoding; give at least one, e.g. greedy: {{}}")
        for decoding, overrides in by_name.items():
            if not isinstance(decoding, str) or not decoding or any(c in decoding for c in "/@,") or decoding.startswith("seed"):
                raise ConfigError(f"{path}: frontier.decodings.{point}.{decoding}: a decoding name has no '/', '@' "
                                  "or ',' and does not start with 'seed'")
            overrides = _mapping(overrides, path, f"frontier.decodings.{point}.{decoding}")
            if EVAL_BATCH in overrides or "points" in overrides:
                raise ConfigError(f"{path}: frontier.decodings.{point}.{decoding} sets {EVAL_BATCH if EVAL_BATCH in overrides else 'points'}, "
                                  "which the frontier sets itself (batch_sizes; the point it is listed under)")
            by_name[decoding] = dict(overrides)
        decodings[point] = by_name
    first = next(iter(decodings))
    reference = raw.get("reference", f"{first}/{next(iter(decodings[first]))}")
    point, _, decoding = str(reference).rpartition("/")  # a point's name may hold '/', a decoding's not
    if decoding not in decodings.get(point, {}):
        raise ConfigError(f"{path}: frontier.reference={reference!r} must be <point>/<decoding> of a listed decoding, "
                          f"e.g. {first}/{next(iter(decodings[first]))}")
    # One entry per decoding and batch size; a decoding name two points share with the same
    # overrides is one entry for both.
    entries: dict[str, dict[str, Any]] = {}
    evaluations: dict[str, tuple[str, int]] = {}
    for point, by_name in decodings.items():
        for decoding, overrides in by_name.items():
            for batch in batches:
                name, entry = f"{decoding}@b{batch}", {**overrides, EVAL_BATCH: batch}
                if name in entries and {k: v for k, v in entries[name].items() if k != "points"} != entry:
                    raise ConfigError(f"{path}: frontier decoding {decoding} differs between two points; "
                                      "give them different names")
                entries.setdefault(name, {**entry, "points": []})["points"].append(point)
                evaluations[name] = (decoding, batch)
    return Frontier(str(reference), entries, evaluations)


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
    rest = {k: v for k, v in overrides.items() if k not in ENTRY_KEYS}
    return overrides.get("checkpoint", "best"), rest


def _mapping(value, path: Path, field_name: str, of: str = "dotted config keys to values") -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: `{field_name}` must be a mapping of {of}")
    return value


def wandb_sweep_config(spec: SweepSpec) -> dict:
    """The same grid as a wandb sweep, for users who launch runs with `wandb agent`."""
    if spec.named is not None:
        raise ConfigError(f"{spec.path}: --export-wandb needs a grid; a sweep of named points (`points:`) has no "
                          "wandb equivalent: run it with `attnlab sweep`")
    if spec.init_from and spec.grid:
        raise ConfigError(f"{spec.path}: --export-wandb: points that start from another point's checkpoint "
                          "(init_from) have no wandb equivalent: run the sweep with `attnlab sweep`")
    parameters: dict[str, dict] = {}
    # wandb agents run points independently: a point that starts from another's checkpoint is left out
    configs = [str(b) for b in spec.bases if b.stem not in spec.init_from]
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
