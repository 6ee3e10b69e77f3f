"""Equal tuning: every point of a sweep gets the same search (space, number of trials, metric)
before its seeds run, so a comparison measures the families and not the care each one got.

Wen et al. 2025 found claimed 1.4-2x optimizer speed-ups fall to ~1.1x once every contender is
tuned alike. Optuna does the search (TPE, or a grid); its study lives in `<sweep>/tune/tune.db`
(SQLite), one study per point, so a rerun of the same sweep command resumes the tuning without
repeating a finished trial, and a trial cut short resumes its own fit from last.ckpt.

    tune:
      trials: 8                    # per point, the same for every point
      metric: val/nll              # chosen on validation data (default: the sweep's run.monitor)
      sampler: tpe                 # or grid (every space entry a list; trials default to the grid's size)
      seed: 1000                   # the sampler's seed and every trial's seed_everything: never one of
                                   # the evaluation seeds (a point's best trial would count again as a seed)
      points: [ar_regularised]     # only these points (default: every point; an ablation that asks
                                   # "does tuning X close the gap?" tunes some points and not others,
                                   # and its report then claims nothing across tuned and untuned rows)
      space:
        model.init_args.optimizer.lr: {low: 1.0e-4, high: 3.0e-3, log: true}   # always searched
        model.init_args.backbone.dropout: [0.0, 0.1, 0.3]
        model.init_args.optimizer.warmup_ratio: {low: 0.0, high: 0.3}

Each trial is `attnlab fit` in `<sweep>/tune/<point>/trial<k>/`; its value is the best `metric`
that trial validated. The best trial's values then join the point's overrides for its seeds. The
learning rate is always in the space: it is the setting whose best value differs most between
families, and a contender run at another's rate is not tuned alike. The report flags a chosen
value at the edge of its range, where the best may lie beyond it.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from attnlab.checkpoints.atomic import atomic_write_text
from attnlab.errors import ConfigError
from attnlab.reports.tuning import FOLDER, number, short

TUNE_KEYS = ("space", "trials", "metric", "sampler", "seed", "points")
SAMPLERS = ("tpe", "grid")
LR = "model.init_args.optimizer.lr"
SEED = 1000  # the default tune seed: outside the 0, 1, 2, ... of evaluation seeds


@dataclass(frozen=True)
class Param:
    """One searched config value: a list of choices, or a range (log scale on request)."""

    key: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choices is not None:
            return CategoricalDistribution(self.choices)
        if isinstance(self.low, int) and isinstance(self.high, int) and not self.log:
            return IntDistribution(self.low, self.high)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)


@dataclass(frozen=True)
class TuneSpec:
    space: dict[str, Param]
    trials: int
    metric: str
    sampler: str = "tpe"
    seed: int = SEED
    points: tuple[str, ...] | None = None  # the points tuned (None: every point)

    def tunes(self, point_name: str) -> bool:
        return self.points is None or point_name in self.points

    @property
    def direction(self) -> str:
        from attnlab.loggers.run_loggers import RunOptions

        return "maximize" if RunOptions(monitor=self.metric).mode == "max" else "minimize"

    def make_sampler(self):
        import optuna

        if self.sampler == "grid":
            return ask_tell_grid_sampler()({k: list(p.choices) for k, p in self.space.items()}, seed=self.seed)
        return optuna.samplers.TPESampler(seed=self.seed)


def ask_tell_grid_sampler():
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its stop at the last grid cell: it calls Study.stop(), which
        only works inside Study.optimize, and the Tuner asks and tells (so a trial cut short can be
        resumed) and stops by counting trials itself."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return AskTellGridSampler


def _param(key: str, raw, where: str) -> Param:
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(f"{where}: an empty list of choices; give at least one value")
        return Param(key, choices=tuple(raw))
    if not isinstance(raw, dict) or set(raw) - {"low", "high", "log"} or not {"low", "high"} <= set(raw):
        raise ConfigError(f"{where}: give a list of choices, e.g. [0.0, 0.1], or a range "
                          "{low: 1.0e-4, high: 3.0e-3, log: true}")
    low, high, log = raw["low"], raw["high"], raw.get("log", False)
    if not (number(low) and number(high)) or low >= high:
        raise ConfigError(f"{where}: low={low!r} and high={high!r} must be numbers with low < high")
    if not isinstance(log, bool) or (log and low <= 0):
        raise ConfigError(f"{where}: log={log!r} must be true or false, and a log range needs low > 0")
    return Param(key, low=low, high=high, log=log)


def parse_tune(raw, path: Path, swept_keys: list[str], monitor: str, point_names: list[str] | None = None) -> TuneSpec:
    """The `tune:` block of a sweep file; every mistake names the field and the fix."""
    where = f"{path}: tune"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with space: and trials: (see attnlab.sweeps.tune)")
    unknown = set(raw) - set(TUNE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; tune has {', '.join(TUNE_KEYS)}")
    space_raw = raw.get("space")
    if not isinstance(space_raw, dict) or not space_raw:
        raise ConfigError(f"{where}.space must map config keys to choices or ranges, e.g. "
                          "model.init_args.optimizer.lr: {low: 1.0e-4, high: 3.0e-3, log: true}")
    space = {str(k): _param(str(k), v, f"{where}.space.{k}") for k, v in space_raw.items()}
    if LR not in space:
        raise ConfigError(f"{where}.space must search the learning rate, {LR} (e.g. {{low: 1.0e-4, high: 1.0e-2, "
                          "log: true}): its best value differs between contenders, so one left fixed is not tuned alike")
    clash = [k for k in space if k in swept_keys]
    if clash:
        raise ConfigError(f"{where}.space.{clash[0]} is also set by grid, points or fixed: tune it or set it, not both")
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise ConfigError(f"{where}.sampler={sampler!r} must be one of {', '.join(SAMPLERS)}")
    if sampler == "grid":
        ranged = [k for k, p in space.items() if p.choices is None]
        if ranged:
            raise ConfigError(f"{where}.space.{ranged[0]}: the grid sampler needs a list of choices, not a range")
    grid_size = math.prod(len(p.choices) for p in space.values()) if sampler == "grid" else None
    trials = raw.get("trials", grid_size)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"{where}.trials={trials!r} must be an integer >= 1 (trials per point)")
    if grid_size is not None and trials > grid_size:
        raise ConfigError(f"{where}.trials={trials} is more than the grid's {grid_size} combinations")
    seed = raw.get("seed", SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"{where}.seed={seed!r} must be an integer >= 0")
    metric = raw.get("metric", monitor)
    from attnlab.loggers.run_loggers import RunOptions

    try:
        RunOptions(monitor=metric)  # a validation metric: tuning on test data would select on the test
    except ConfigError as err:
        raise ConfigError(f"{where}.metric: {err}") from None
    points = raw.get("points")
    if points is not None:
        if not isinstance(points, list) or not points or not all(isinstance(p, str) for p in points):
            raise ConfigError(f"{where}.points must be a non-empty list of point names (or left out: every point)")
        unknown = [p for p in points if point_names is not None and p not in point_names]
        if unknown:
            raise ConfigError(f"{where}.points: {unknown[0]!r} is not a point; the points are {', '.join(point_names)}")
        points = tuple(points)
    return TuneSpec(space, trials, metric, sampler, seed, points)


def check_tune_seed(spec, evaluation_seeds: list[int]) -> None:
    """The tune seed is none of the evaluation seeds: a point's trial with seed k is a fit of that point
    with seed k, so its best-of-N trial would be one of the runs the report compares."""
    if spec.tune.seed in evaluation_seeds:
        raise ConfigError(f"{spec.path}: tune.seed={spec.tune.seed} is also an evaluation seed "
                          f"({', '.join(map(str, evaluation_seeds))}): a point's best trial would count again as that "
                          f"seed's run; give tune.seed a value outside them, e.g. {SEED}")


def check_space_keys(spec, passthrough: list[str]) -> None:
    """Every tune.space key is an option `attnlab fit` knows, checked once per base config with the
    space's first values before any trial runs (the fit's own parser says which key is wrong)."""
    from attnlab.sweeps.arguments import as_cli_args

    values = {k: (p.choices[0] if p.choices is not None else p.low) for k, p in spec.tune.space.items()}
    for point in {tuple(p.configs): p for p in spec.grid_points()}.values():
        configs = [arg for config in point.configs for arg in ("--config", str(config))]
        command = [sys.executable, "-m", "attnlab", "fit", *configs, *as_cli_args({**point.overrides, **values}),
                   *passthrough, "--print_config"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            said = [line.removeprefix("attnlab: error: ") for line in done.stderr.splitlines()
                    if line.startswith("attnlab: error: ")]
            raise ConfigError(f"{spec.path}: tune.space does not fit point {point.name}: "
                              f"{said[-1] if said else 'attnlab fit refused it'} (tune.space keys are options of attnlab fit)")


def best_value(history: list[dict[str, float]], metric: str, direction: str) -> float | None:
    """The best validation value of `metric` a trial logged (what its best checkpoint holds)."""
    values = [row[metric] for row in history if metric in row and math.isfinite(row[metric])]
    if not values:
        return None
    return max(values) if direction == "maximize" else min(values)


class Tuner:
    """Runs the missing trials of each point's study and says which values won.

    `fit(args) -> exit status` runs one `attnlab fit` (the sweep's own runner, so that preemption,
    devices and logs behave as for any run); a status of EXIT_INTERRUPTED leaves the trial
    running in the study, and the next sweep resumes it in its folder."""

    def __init__(self, spec, sweep_dir: Path, root: str, passthrough: list[str], fit: Callable[[list[str]], int]):
        self.spec, self.tune = spec, spec.tune
        self.folder = sweep_dir / FOLDER
        self.root, self.passthrough, self.fit = root, passthrough, fit

    def study(self, point):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours, below
        self.folder.mkdir(parents=True, exist_ok=True)
        return optuna.create_study(storage=f"sqlite:///{(self.folder / 'tune.db').resolve()}", study_name=point.name,
                                   direction=self.tune.direction, sampler=self.tune.make_sampler(),
                                   load_if_exists=True)

    def best_params(self, point) -> dict[str, Any] | None:
        """Tune `point` (a grid point, no seed) to its number of trials; its best trial's values, or
        None when every trial failed."""
        from optuna.trial import TrialState

        study = self.study(point)
        distributions = {k: p.distribution() for k, p in self.tune.space.items()}
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._run(study, point, trial.number, trial.params)  # cut short earlier: resumes from its last.ckpt
        while len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))) < self.tune.trials:
            trial = study.ask(distributions)
            self._run(study, point, trial.number, trial.params)
        self._write_record(point, study)
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return study.best_trial.params if done else None

    def trial_dir(self, point, number: int) -> Path:
        return self.folder / point.name / f"trial{number}"

    def _run(self, study, point, number: int, params: dict[str, Any]) -> None:
        from attnlab.reports.runs import read_metrics
        from attnlab.sweeps.arguments import as_cli_args
        from optuna.trial import TrialState

        configs = [arg for config in point.configs for arg in ("--config", str(config))]
        args = ["fit", *configs, *as_cli_args({**point.overrides, **params}), f"--seed_everything={self.tune.seed}",
                *self.passthrough, "--run.root", self.root, "--run.name", f"{self.spec.name}/{FOLDER}/{point.name}",
                "--run.group", self.spec.name, "--run.version", f"trial{number}"]
        shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={short(v)}" for k, v in params.items())
        print(f"[tune] {point.name}: trial {number + 1}/{self.tune.trials} ({shown})", flush=True)
        status = self.fit(args)  # raises Preempted on EXIT_INTERRUPTED: the trial stays RUNNING
        metrics = self.trial_dir(point, number) / "metrics.csv"
        value = best_value(read_metrics(metrics), self.tune.metric, self.tune.direction) \
            if status == 0 and metrics.is_file() else None
        if value is None:
            study.tell(number, state=TrialState.FAIL)
            print(f"[tune] {point.name}: trial {number + 1} failed (exit status {status}); it counts as one of "
                  f"the {self.tune.trials} trials and is not chosen", flush=True)
            return
        study.tell(number, value)
        print(f"[tune] {point.name}: trial {number + 1}: {self.tune.metric} {value:.4f} "
              f"(best so far {study.best_value:.4f})", flush=True)

    def _write_record(self, point, study) -> None:
        """tune.json: every point's trials and choice, for the report (rewritten whole after each point)."""
        record_file = self.folder / "tune.json"
        record = json.loads(record_file.read_text()) if record_file.is_file() else {}
        trials = [{"number": t.number, "params": t.params, "value": t.value, "state": t.state.name,
                   "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                   if t.datetime_complete and t.datetime_start else None}
                  for t in study.get_trials(deepcopy=False)]
        complete = [t for t in trials if t["state"] == "COMPLETE"]
        record[point.name] = {"metric": self.tune.metric, "direction": self.tune.direction, "sampler": self.tune.sampler,
                              "seed": self.tune.seed, "trials": trials, "chosen": study.best_trial.params if complete else None,
                              "space": {k: vars(p) for k, p in self.tune.space.items()}}
        atomic_write_text(record_file, json.dumps(record, indent=1, default=list) + "\n")
