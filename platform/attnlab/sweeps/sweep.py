"""`attnlab sweep`: run every point of a sweep file, skip the finished ones, then report.

Each point is `attnlab fit` in a subprocess (a clean process per run, and the natural unit to
pin to one GPU), then `attnlab test` of a checkpoint (the best by run.monitor unless the entry
says `checkpoint: last | averaged`) once per `evaluate` entry. With seeds (`seeds:` in the file
or `--seeds N`) every point runs once per seed, in its own folder. The layout is fixed so a
rerun can tell what is done:

    runs/<sweep>/<point>[/seed<k>]/fit/        metrics.csv, config.yaml, summary.json, checkpoints/
    runs/<sweep>/<point>[/seed<k>]/test/       the evaluation (one folder per entry), examples.jsonl
                                               (a frontier's: <decoding>@b<batch>/)
    runs/<sweep>/<point>[/seed<k>]/done.json   written last; a rerun skips runs that have it, resumes
                                               a fit that left a last.ckpt, sets other unfinished runs aside
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml

from attnlab.checkpoints.atomic import atomic_write_text
from attnlab.errors import EXIT_INTERRUPTED, EXIT_NO_ROOM, AttnlabError, ConfigError, NoRoom, Preempted
from attnlab.reports.provenance import write_sweep_record
from attnlab.reports.runs import is_number
from attnlab.sweeps.arguments import as_cli_args
from attnlab.sweeps.spec import (
    BUDGET,
    SweepPoint,
    SweepSpec,
    evaluation_checkpoint,
    load_sweep,
    wandb_sweep_config,
)
from attnlab.training.run_folder import RunFolderLock, in_use_under

DESCRIPTION = "run a grid of experiments (skipping finished ones) and print their comparison table"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab sweep", description=DESCRIPTION,
        epilog="Any other --flag is passed to every run, e.g. --trainer.max_epochs 1 --run.wandb disabled.",
    )
    parser.add_argument("sweep_file", help="a sweep YAML (base, grid, fixed, evaluate), e.g. experiments/compare_families.yaml")
    parser.add_argument("--root", default="runs", help="where run folders go (default: runs)")
    parser.add_argument("--seeds", type=int, metavar="N",
                        help="run every point with seeds 0..N-1 (replaces the sweep file's `seeds:`), "
                             "each in <point>/seed<k>/; the report shows mean +- std and intervals over them")
    parser.add_argument("--devices", help="GPU ids to spread runs over, one run per GPU at a time, e.g. 0,1,2,3 "
                                          "(default: every visible GPU when there are several, else one run at a time)")
    parser.add_argument("--export-wandb", metavar="FILE", help="write the grid as a wandb sweep config for `wandb agent` and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the runs' commands and exit")
    return parser


def point_commands(spec: SweepSpec, point: SweepPoint, root: str, passthrough: list[str]) -> dict[str, list[str]]:
    """The fit command, then one test command per evaluation (its --ckpt_path is added at run time)."""
    configs = [arg for config in point.configs for arg in ("--config", str(config))]
    seed = [] if point.seed is None else [f"--seed_everything={point.seed}"]
    common = configs + as_cli_args(point.overrides) + seed + passthrough
    run = ["--run.root", root, "--run.name", f"{spec.name}/{point.folder}", "--run.group", spec.name]
    commands = {"fit": ["fit", *common, *run, "--run.version", "fit", *snapshot_args(spec.snapshot_steps(point))]}
    start = spec.start_of(point)
    if start is not None:
        commands["fit"] += ["--run.init_from", str(Path(root) / spec.name / start)]
    for name, entry in spec.evaluations_for(point).items():
        _, overrides = evaluation_checkpoint(entry)
        commands[name] = ["test", *common, *as_cli_args(overrides), *run, "--run.version", name]
    return commands


def snapshot_args(steps: list[int]) -> list[str]:
    """Lightning's ModelCheckpoint saving checkpoints/step=<k>.ckpt at each of `steps` (one
    callback per step: every_n_train_steps also saves the step's multiples, which a later
    point's start never needs but costs little)."""
    args = []
    for step in steps:
        args += ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                 f"--trainer.callbacks.every_n_train_steps={step}", "--trainer.callbacks.save_top_k=-1",
                 "--trainer.callbacks.filename={step}"]  # Lightning names it step=<k>
    return args


def checkpoint_to_test(fit_dir: Path, which: str = "best", entry: str = "test") -> Path:
    """best: what the best-by-run.monitor ModelCheckpoint kept (else last.ckpt); last; averaged
    (CheckpointAveraging's, which the fit must have written)."""
    folder = fit_dir / "checkpoints"
    if which == "averaged":
        averaged = folder / "averaged.ckpt"
        if not averaged.is_file():
            raise AttnlabError(f"evaluate.{entry}.checkpoint is averaged but {averaged} does not exist: add "
                               "--trainer.callbacks+=attnlab.checkpoints.averaging.CheckpointAveraging to the fit")
        return averaged
    last = folder / "last.ckpt"
    if which == "best":
        recorded = recorded_best(last) if last.is_file() else None
        if recorded is not None:
            best = folder / Path(recorded).name  # the run folder may have moved since (another machine, .incomplete/)
            if not best.is_file():
                raise AttnlabError(f"{last} records {Path(recorded).name} as the best checkpoint by its monitor, "
                                   f"but {best} does not exist: restore it, or evaluate `checkpoint: last`")
            return best
        # no record (last.ckpt missing, or written before any validation): the newest best-*.ckpt
        found = sorted(folder.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    if last.is_file():
        return last
    raise AttnlabError(f"{fit_dir} has no checkpoint to evaluate")


def recorded_best(last: Path) -> str | None:
    """The best_model_path that the monitoring ModelCheckpoint recorded in last.ckpt (None: no record).

    This, not the newest best-*.ckpt by mtime: copying or restoring a folder changes mtimes, and a
    resumed run may leave an older, better file beside newer ones. LastCheckpoint (monitor None,
    save_top_k=0) records no best. A user's extra monitoring ModelCheckpoint writes other names
    than attnlab's best-{epoch}-{step}.ckpt, which breaks a tie.
    """
    from attnlab.checkpoints.reading import read_checkpoint

    states = read_checkpoint(last, arg="last.ckpt", mmap=True).get("callbacks") or {}
    paths = {state["best_model_path"] for state in states.values()
             if isinstance(state, dict) and state.get("monitor") is not None and state.get("best_model_path")}
    if len(paths) > 1:
        paths = {p for p in paths if Path(p).name.startswith("best-")} or paths
    if len(paths) > 1:
        raise AttnlabError(f"{last} records several best checkpoints ({', '.join(sorted(paths))}); "
                           "pass the one to evaluate with `attnlab test --ckpt_path`")
    return paths.pop() if paths else None


def set_aside(point_dir: Path, sweep_dir: Path) -> Path | None:
    """Move an unfinished run's folder to <sweep>/.incomplete/ so the rerun starts clean and nothing
    is lost (a seed folder goes there as <point>,seed<k>-<n>). A folder a live command holds (a fit
    started by hand, another machine's sweep) is never moved: InUse says who holds it."""
    if not point_dir.exists():
        return None
    holder = in_use_under(point_dir)
    if holder is not None:
        raise InUse(f"{point_dir} is in use by {holder}; left as it is (rerun the sweep once that run has ended)")
    parked = sweep_dir / ".incomplete"
    stem = ",".join(point_dir.relative_to(sweep_dir).parts)
    n = 1
    while (parked / f"{stem}-{n}").exists():
        n += 1
    parked.mkdir(exist_ok=True)
    return Path(shutil.move(str(point_dir), parked / f"{stem}-{n}"))


def child_environment() -> dict[str, str]:
    """This process's environment for a run it starts, without wandb's WANDB_SERVICE: a child would
    join this process's wandb service, and one killed mid-run would leave its run id "in use" there."""
    return {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}


class InUse(AttnlabError):
    """A point's folder is held by a live command, so this sweep leaves it alone."""


class SweepRunner:
    def __init__(self, spec: SweepSpec, root: str, passthrough: list[str], devices: list[str]):
        self.spec, self.root, self.passthrough = spec, root, passthrough
        self.sweep_dir = Path(root) / spec.name
        self.devices = devices
        self.no_room: str | None = None  # set by the first run that found no room to write: no other stage starts

    def point_dir(self, point: SweepPoint) -> Path:
        return self.sweep_dir / point.folder

    def is_done(self, point: SweepPoint) -> bool:
        return (self.point_dir(point) / "done.json").is_file()

    def run(self) -> list[str]:
        """Run the unfinished points; returns the names of those that failed."""
        points = self.spec.points()
        todo = [p for p in points if not self.is_done(p)]
        for p in points:
            if p not in todo:
                print(f"[sweep] {p.folder}: finished before, skipped")
        untuned: list[str] = []
        if self.spec.tune is not None and todo:  # the same search for every point, before its seeds
            todo, untuned = self.tuned(todo)
        if len(self.devices) > 1:
            results = self.run_in_parallel(todo)
        else:
            results = [self.run_point(p, self.devices[0] if self.devices else None) for p in todo]
        return untuned + [p.folder for p, ok in zip(todo, results) if not ok]

    def tuned(self, todo: list[SweepPoint]) -> tuple[list[SweepPoint], list[str]]:
        """`todo` with each point's tuned values among its overrides, and the folders of the points
        whose every trial failed (they do not run)."""
        from attnlab.sweeps.tune import Tuner

        env = child_environment()
        if self.devices:
            env["CUDA_VISIBLE_DEVICES"] = self.devices[0]  # trials run one after another

        def fit(args: list[str]) -> int:
            status = EXIT_INTERRUPTED if STOP.requested else self._call(args, env, None)
            if status == EXIT_INTERRUPTED:
                message = "[tune] a trial was interrupted; the same sweep command resumes it"
                print(message, file=sys.stderr, flush=True)
                raise Preempted(message)
            return status

        tuner = Tuner(self.spec, self.sweep_dir, self.root, self.passthrough, fit)
        chosen: dict[str, dict | None] = {}
        for point in self.spec.grid_points():
            if any(p.name == point.name for p in todo):
                chosen[point.name] = tuner.best_params(point) if self.spec.tune.tunes(point.name) else {}
        ready = [replace(p, overrides={**p.overrides, **chosen[p.name]}) for p in todo if chosen[p.name] is not None]
        failed = [p.folder for p in todo if chosen[p.name] is None]
        for name in sorted({p.name for p in todo if chosen[p.name] is None}):
            print(f"[sweep] {name}: every tuning trial failed (see {tuner.folder / name}); its seeds do not run",
                  file=sys.stderr, flush=True)
        return ready, failed

    def run_in_parallel(self, todo: list[SweepPoint]) -> list[bool]:
        """One point per device at a time; a point that starts from another point's checkpoint
        (`init_from`) waits, before it takes a device, until that point of its seed has finished."""
        free: queue.Queue = queue.Queue()
        for device in self.devices:
            free.put(device)
        finished = {p.folder: threading.Event() for p in todo}

        def run_when_ready(point: SweepPoint) -> bool:
            try:
                if point.name in self.spec.init_from:
                    source = replace(point, name=self.spec.init_from[point.name][0]).folder
                    if source in finished:  # else it finished in an earlier sweep command
                        finished[source].wait()
                device = free.get()
                try:
                    return self.run_point(point, device)
                finally:
                    free.put(device)
            finally:
                finished[point.folder].set()

        with ThreadPoolExecutor(len(todo) or 1) as pool:  # a thread per point: waiting ones hold no device
            return list(pool.map(run_when_ready, todo))

    def run_point(self, point: SweepPoint, device: str | None) -> bool:
        folder, label = self.point_dir(point), point.folder
        last = folder / "fit" / "checkpoints" / "last.ckpt"
        if last.exists():  # (a folder when sharded) the fit command (same --run.version) resumes from it; evaluations rerun
            print(f"[sweep] {label}: resuming the unfinished earlier attempt from {last}")
        else:
            try:
                parked = set_aside(folder, self.sweep_dir)
            except InUse as err:
                print(f"[sweep] {label}: skipped: {err}", flush=True)
                return False
            if parked:
                print(f"[sweep] {label}: an unfinished earlier attempt was moved to {parked}")
        folder.mkdir(parents=True, exist_ok=True)
        env = child_environment()
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        log = folder / "log.txt" if len(self.devices) > 1 else None
        seconds = {}
        for stage, args in point_commands(self.spec, point, self.root, self.passthrough).items():
            if stage != "fit":
                which, _ = evaluation_checkpoint(self.spec.evaluate[stage])
                try:
                    args = [*args, "--ckpt_path", str(checkpoint_to_test(folder / "fit", which, stage))]
                except AttnlabError as err:
                    print(f"[sweep] {label}: {stage} failed: {err}", flush=True)
                    return False
            if self.no_room is not None:  # another device's run filled the disk
                return False
            where = f" on GPU {device}" if device is not None else ""
            print(f"[sweep] {label}: {stage}{where}" + (f" (log: {log})" if log else ""), flush=True)
            started = time.perf_counter()
            status = EXIT_INTERRUPTED if STOP.requested else self._call(args, env, log)
            if status == EXIT_INTERRUPTED:  # preempted: unfinished, not failed; the same sweep command resumes it
                message = f"[sweep] {label}: {stage} was interrupted; the same sweep command resumes it"
                print(message, file=sys.stderr, flush=True)
                raise Preempted(message)
            if status == EXIT_NO_ROOM:  # every later run would fail the same way: stop once, here
                self.no_room = (f"[sweep] {label}: {stage} found no room to write" + (f" (see {log})" if log else "")
                                + f"; the sweep stops: free some space under {self.sweep_dir} (or give another "
                                "--root) and run the same sweep command, which resumes")
                raise NoRoom(self.no_room)
            if status != 0:
                print(f"[sweep] {label}: {stage} failed" + (f"; see {log}" if log else ""), flush=True)
                return False
            seconds[stage] = round(time.perf_counter() - started, 1)
        config = folder / "fit" / "config.yaml"
        resolved = yaml.safe_load(config.read_text()) if config.is_file() else None  # read once, not per key
        swept = {key: point.overrides[key] if key in point.overrides else config_value(resolved, key)
                 for key in self.spec.swept_keys}
        done = {"point": point.name, "index": point.index, "seed": point.seed, "configs": [str(c) for c in point.configs],
                "swept": swept, "overrides": point.overrides, "seconds": seconds,
                "checkpoints": {name: evaluation_checkpoint(entry)[0] for name, entry in self.spec.evaluations_for(point).items()}}
        if self.spec.tune is not None:  # the values the tune stage chose for this point
            done["tuned"] = {key: point.overrides[key] for key in self.spec.tune.space if key in point.overrides}
        done["reference"] = self.spec.reference_of(point)  # what the report's tests compare this point with
        if point.facet is not None:
            done["facet"] = point.facet  # tests never cross facets
        if self.spec.frontier is not None:  # what the report's frontier section reads
            done["frontier"] = {name: {"decoding": decoding, "batch_size": batch}
                                for name, (decoding, batch) in self.spec.frontier.evaluations.items()
                                if name in seconds}  # the ones this point ran
            done["frontier_reference"] = self.spec.frontier.reference
        atomic_write_text(folder / "done.json", json.dumps(done, indent=1) + "\n")  # written last, whole
        return True

    @staticmethod
    def _call(args: list[str], env: dict, log: Path | None) -> int:
        command = [sys.executable, "-m", "attnlab", *args]
        with log.open("a") if log is not None else contextlib.nullcontext() as out:
            child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
            STOP.children.add(child)
            try:
                return child.wait()
            finally:
                STOP.children.discard(child)


class _Stop:
    """A sweep asked to stop (SIGTERM, Ctrl-C): the running fits get SIGTERM (a terminal's Ctrl-C has
    reached them already), save last.ckpt and exit EXIT_INTERRUPTED; no further run starts."""

    def __init__(self):
        self.requested = False
        self.children: set[subprocess.Popen] = set()

    def __call__(self, signum, frame) -> None:
        self.requested = True
        if signum == signal.SIGTERM:  # a scheduler may signal this process alone
            for child in list(self.children):
                child.send_signal(signal.SIGTERM)

    @contextlib.contextmanager
    def installed(self):
        """These handlers while the sweep runs its points (the previous ones after)."""
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {signum: signal.signal(signum, self) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


STOP = _Stop()


def config_value(value, key: str):
    """The value of a dotted key (model.init_args.backbone.n_heads) in a run's resolved config
    (config.yaml, parsed), so a named point that leaves a key at the base config's value still
    shows it (None if absent)."""
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` among pass-through arguments."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def check_run_options(spec: SweepSpec, passthrough: list[str]) -> None:
    """The checkpoint-selection options every run gets (fixed, grid, named points or pass-through), checked once
    before the first run instead of failing in every one: run.monitor must be a metric attnlab
    logs in validation, run.patience an integer >= 1, run.monitor_mode min or max."""
    from attnlab.families.block_diffusion import NOISE_SEARCH_METRICS
    from attnlab.families.metric_keys import GENERATION_METRICS, LIKELIHOOD_METRICS
    from attnlab.loggers.run_loggers import RunOptions

    known = {f"val/{m}" for m in LIKELIHOOD_METRICS + GENERATION_METRICS} | set(NOISE_SEARCH_METRICS)
    values: dict[str, list] = {}
    for key in ("monitor", "monitor_mode", "patience"):
        # Every point's overrides hold fixed, grid and named-point values alike.
        given = [p.overrides[f"run.{key}"] for p in spec.grid_points() if f"run.{key}" in p.overrides]
        flag = flag_value(passthrough, f"--run.{key}")
        if flag is not None:
            given = [int(flag) if key == "patience" and flag.lstrip("-").isdigit() else flag]
        values[key] = given or [getattr(RunOptions, key)]
    for monitor, mode, patience in itertools.product(*values.values()):
        RunOptions(monitor=monitor, monitor_mode=mode, patience=patience)  # ConfigError naming the field
        if monitor not in known:
            raise ConfigError(f"run.monitor={monitor!r} is never logged: choose one of {', '.join(sorted(known))}")


OPTIMIZER = "model.init_args.optimizer"


def evaluation_seeds(spec: SweepSpec, passthrough: list[str]) -> list[int]:
    """The seeds the compared runs train with: the sweep's seeds, else each base config's
    seed_everything (or the --seed_everything every run is given)."""
    if spec.seeds is not None:
        return list(spec.seeds)
    flag = flag_value(passthrough, "--seed_everything")
    if flag is not None:
        return [int(flag)] if flag.lstrip("-").isdigit() else []
    seeds = [(yaml.safe_load(config.read_text()) or {}).get("seed_everything") for config in spec.bases]
    return sorted({s for s in seeds if isinstance(s, int) and not isinstance(s, bool)})


def check_warmups(spec: SweepSpec, passthrough: list[str]) -> None:
    """Every budgeted point's warmup (from the pass-through flags, else its overrides, else its base
    configs, later ones winning, else the default), refused before the first run when a budget (given
    the same ways) derives the steps and the warmup is a count (training.budget.check_budget_warmup)."""
    from attnlab.families.optim import OptimizerConfig
    from attnlab.training.budget import check_budget_warmup, parse_budget

    keys = ("warmup_steps", "warmup_ratio")
    flag = flag_value(passthrough, f"--{BUDGET}")
    for point in spec.grid_points():
        values = {"warmup_steps": OptimizerConfig.warmup_steps, "warmup_ratio": None, "budget": None}
        for config in point.configs:
            resolved = yaml.safe_load(config.read_text()) or {}
            optimizer = config_value(resolved, OPTIMIZER) or {}
            values.update({k: optimizer[k] for k in keys if k in optimizer})
            values["budget"] = config_value(resolved, BUDGET) or values["budget"]
        values.update({k: point.overrides[f"{OPTIMIZER}.{k}"] for k in keys if f"{OPTIMIZER}.{k}" in point.overrides})
        values["budget"] = yaml.safe_load(flag) if flag is not None else point.overrides.get(BUDGET, values["budget"])
        for key in keys:
            given = flag_value(passthrough, f"--{OPTIMIZER}.{key}")
            if given is not None:
                values[key] = yaml.safe_load(given)
        if values["budget"] is not None:
            check_budget_warmup(parse_budget(values["budget"]), values["warmup_steps"], values["warmup_ratio"],
                                where=f"{spec.path}: point {point.name}: ")


def check_trainer_limits(spec: SweepSpec, passthrough: list[str]) -> None:
    """Every point's trainer.max_steps, max_epochs and limit_train_batches (pass-through flags, else
    its overrides, else its base configs), refused once before the first run when one trains
    nothing (cli.preflight.check_training_budget), instead of failing in every point."""
    from attnlab.cli.preflight import check_training_budget

    keys = ("max_steps", "max_epochs", "limit_train_batches")
    for point in spec.grid_points():
        trainer: dict = {}
        for config in point.configs:
            resolved = yaml.safe_load(config.read_text()) or {}
            trainer.update({k: v for k, v in (config_value(resolved, "trainer") or {}).items() if k in keys})
        trainer.update({k: point.overrides[f"trainer.{k}"] for k in keys if f"trainer.{k}" in point.overrides})
        for key in keys:
            given = flag_value(passthrough, f"--trainer.{key}")
            if given is not None:
                trainer[key] = yaml.safe_load(given)
        try:
            check_training_budget(trainer)
        except ConfigError as err:
            raise ConfigError(f"{spec.path}: point {point.name}: {err}") from None


def visible_gpus() -> list[str]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [str(i) for i in range(count)] if count > 1 else []


def sweep_main(argv: list[str]) -> int:
    from attnlab.reports.report import report_main

    args, passthrough = build_parser().parse_known_args(argv)
    stray = [a for a in passthrough if a.startswith("-") and not a.startswith("--") and not is_number(a)]
    if stray:
        raise AttnlabError(f"unknown option {stray[0]} (attnlab sweep --help lists the options)")
    spec = load_sweep(args.sweep_file)
    if args.seeds is not None:
        if args.seeds < 1:
            raise ConfigError(f"--seeds {args.seeds}: must be at least 1 (the number of seeds, 0..N-1)")
        spec.seeds = list(range(args.seeds))
    check_run_options(spec, passthrough)
    check_trainer_limits(spec, passthrough)
    check_warmups(spec, passthrough)
    if spec.tune is not None:
        from attnlab.sweeps.tune import check_space_keys, check_tune_seed

        check_tune_seed(spec, evaluation_seeds(spec, passthrough))
        check_space_keys(spec, passthrough)
    if args.export_wandb:
        Path(args.export_wandb).write_text(yaml.safe_dump(wandb_sweep_config(spec), sort_keys=False))
        print(f"wrote {args.export_wandb}; start it with `wandb sweep {args.export_wandb}` and then `wandb agent <sweep id>`")
        if spec.init_from:
            print(f"left out: {', '.join(spec.init_from)} (each starts from another point's checkpoint, which wandb "
                  "agents cannot order); run those with attnlab sweep")
        return 0
    devices = args.devices.split(",") if args.devices else visible_gpus()
    runner = SweepRunner(spec, args.root, passthrough, devices)
    if args.dry_run:
        if spec.tune is not None:
            print(f"tune: {spec.tune.trials} trial(s) of `attnlab fit` per point ({spec.tune.sampler}, best "
                  f"{spec.tune.metric}), each in {runner.sweep_dir / 'tune' / '<point>'}, before the runs below")
        for point in spec.points():
            for stage, command in point_commands(spec, point, args.root, passthrough).items():
                print(f"{point.folder} [{stage}]: attnlab {' '.join(command)}")
        return 0
    # One sweep command at a time on a sweep folder: a second is refused here, before it prints,
    # moves or trains anything (spreading one sweep over machines: --devices, or one file each).
    lock = RunFolderLock(runner.sweep_dir, kind="sweep folder",
                         fix="another attnlab sweep is running it; wait for it to end (or stop it), or give this one "
                             "another --root").acquire()
    try:
        to_run = [p for p in spec.points() if not runner.is_done(p)]
        with STOP.installed():
            failed = runner.run()
        if to_run or not (runner.sweep_dir / "sweep.json").is_file():  # a rerun that only reports keeps the record
            write_sweep_record(runner.sweep_dir, "attnlab sweep " + shlex.join(argv), args.sweep_file, spec.name)
        if any(runner.is_done(p) for p in spec.points()):
            report_main([str(runner.sweep_dir), "--wandb", flag_value(passthrough, "--run.wandb") or "auto"])
    finally:
        lock.release()
    if failed:
        print(f"[sweep] {len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0
