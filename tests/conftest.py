"""Shared fixtures for the end-to-end tests: an isolated environment and ways to run `attnlab`.

Nothing here downloads or writes outside pytest's temporary folders: tokenizers go to a
session-wide $ATTNLAB_CACHE, HOME points at an empty folder (no ~/.netrc, no ~/.cache), and
every run is written under a test's tmp_path through `--run.root`.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Under pytest-xdist (the README's `-n 2`) each worker takes its share of the cores, set before torch
# loads so that processes the tests start inherit it: two workers with every core's threads each
# would slow each other several-fold.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Import Lightning (through attnlab) now, while pytest's session-wide capture owns sys.stderr:
# Lightning's logging handlers keep the stream they find at import, and one bound to a single
# test's capsys stream would be closed for every later test ("--- Logging error ---").
import attnlab.cli.lightning_cli  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
DEBUG_YAML = EXPERIMENTS / "debug.yaml"
MULTI30K_DIR = REPO.parent / "shared" / "data" / "multi30k"
MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")]

# Overrides that keep a run to seconds on a CPU. Note: `limit_val_batches 1` is parsed as the
# float 1.0 (= 100% of batches) by LightningCLI, so the eval splits are cut with
# max_eval_examples instead, which leaves one evaluation batch.
FAST_TRAINER = [
    "--trainer.max_steps", "2",
    "--trainer.limit_val_batches", "1",
    "--trainer.log_every_n_steps", "1",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--trainer.accelerator", "cpu",
    "--trainer.devices", "1",
]
# debug.yaml cut to 64 training pairs (two batches: one epoch is two steps) and 8 eval pairs.
# Every test uses the same data arguments so the tokenizer is trained once per session.
DEBUG_DATA = ["--data.init_args.n_train", "64", "--data.init_args.max_eval_examples", "8"]


# ---- a model whose generation metrics are known in advance ----------------------------------------

from attnlab import DecoderOnly  # noqa: E402


class Oracle(DecoderOnly):
    """A DecoderOnly that "generates" the reference of every example whose split index is a
    multiple of `every` (1 in `every` of them; `every` may change per epoch) and nothing for the
    others, so exact match, BLEU and chrF are known without training. `--model.class_path conftest.Oracle`."""

    schedule = {}  # epoch -> every (default 2: half of the examples)

    def generate_ids(self, batch):
        every = self.schedule.get(self.current_epoch, 2) if self._trainer else 2
        targets, lengths = batch["target"].tolist(), batch["target_lengths"].tolist()
        index = batch["index"].tolist() if "index" in batch else range(len(targets))
        return [t[:n] if i % every == 0 else [] for i, t, n in zip(index, targets, lengths)]


class PeakingOracle(Oracle):
    """Correct on a third, all, a half, then a quarter of the examples in epochs 0, 1, 2, 3, 4: its
    generation scores peak after epoch 1, while its val/nll (a real model's) keeps falling."""

    schedule = {0: 3, 1: 1, 2: 2, 3: 4, 4: 4}


# ---- environment -------------------------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def isolated_env(tmp_path_factory):
    """Tokenizer cache, HOME and wandb settings pointed away from the user's own, for the session."""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("attnlab_cache")
    home = tmp_path_factory.mktemp("home")
    mp.setenv("ATTNLAB_CACHE", str(cache))
    mp.setenv("HOME", str(home))  # no ~/.netrc: wandb can never find credentials
    mp.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    mp.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_BASE_URL", "ATTNLAB_RUN_VERSION"):
        mp.delenv(name, raising=False)
    yield {"cache": cache, "home": home}
    mp.undo()


@pytest.fixture(autouse=True)
def _fresh_run_version():
    """An in-process run stores its timestamp in $ATTNLAB_RUN_VERSION (for DDP workers); clear it
    so one test's run folder never leaks into the next test or its subprocesses."""
    os.environ.pop("ATTNLAB_RUN_VERSION", None)
    yield
    os.environ.pop("ATTNLAB_RUN_VERSION", None)


@pytest.fixture(autouse=True)
def no_shared_wandb_service():
    """wandb exports WANDB_SERVICE once this process starts its service, and a child process a test
    starts then joins it: a child killed mid-run left its run id "in use" for this process's resume
    of that run (seen under xdist, in whichever worker had run an in-process wandb test before)."""
    os.environ.pop("WANDB_SERVICE", None)
    yield
    os.environ.pop("WANDB_SERVICE", None)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The shared Multi30k folder (never downloaded by the tests)."""
    missing = [name for name in MULTI30K_FILES if not (MULTI30K_DIR / name).is_file()]
    if missing:
        pytest.skip(f"Multi30k data not found in {MULTI30K_DIR} (missing {', '.join(missing)}); "
                    "copy the task-1 raw files there to run the Multi30k experiments")
    return MULTI30K_DIR


@pytest.fixture(scope="session")
def text_folder_dir(tmp_path_factory) -> Path:
    """A small corpus folder (train / val / test .txt) for configs of TextFolderDataModule."""
    import random

    words = "we the people of the united states in order to form a more perfect union".split()
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("text_corpus")
    for split, n in (("train", 200), ("val", 30), ("test", 30)):
        lines = (" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(n))
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# ---- running attnlab ---------------------------------------------------------------------------

@dataclass
class CliResult:
    code: int
    out: str
    err: str


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def run_main(argv: list[str], cwd: Path | None = None) -> CliResult:
    """`attnlab.cli.main(argv)` in this process from `cwd`, capturing stdout / stderr by redirection.

    For fixtures wider than a function, where capsys is not available. A run stores its timestamp
    in $ATTNLAB_RUN_VERSION (for DDP workers): cleared before and after, so no run inherits another's.
    """
    from attnlab.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    os.environ.pop("ATTNLAB_RUN_VERSION", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:
                code = _exit_code(exc)
    finally:
        os.environ.pop("ATTNLAB_RUN_VERSION", None)
        os.chdir(previous)
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(capsys, tmp_path, monkeypatch):
    """Run `attnlab.cli.main(argv)` in-process from tmp_path; returns CliResult(code, out, err).

    Exceptions other than SystemExit propagate: for a user mistake main must return 2 itself.
    """
    from attnlab.cli.main import main

    monkeypatch.chdir(tmp_path)  # anything written relative to the cwd lands in the test's folder

    def run(*argv) -> CliResult:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = _exit_code(exc)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def run_sweep(args, cwd: Path) -> subprocess.CompletedProcess:
    """`attnlab sweep ARGS` from `cwd` with every run in this process (see in_process_runs), as
    run_process returns it. One test (test_main_job_is_quiet) runs a real sweep in real processes."""
    with in_process_runs():
        result = run_main(["sweep", *args], cwd=cwd)
    return subprocess.CompletedProcess(["sweep", *args], result.code, result.out, result.err)


@contextlib.contextmanager
def in_process_runs():
    """A sweep's `attnlab fit / test` calls as main(args) here instead of subprocesses: the same
    commands and folders, without a Python and torch start-up per run. Runs spread over "GPUs"
    (--devices) take turns, each with its CUDA_VISIBLE_DEVICES and log file."""
    import threading

    from attnlab.sweeps.sweep import SweepRunner

    turn = threading.Lock()
    run_point = SweepRunner.run_point

    def one_at_a_time(self, point, device):  # the runner's own lines must not land in another run's log
        with turn:
            return run_point(self, point, device)

    def call(args, env, log):
        changed = {key: value for key, value in env.items() if os.environ.get(key) != value}
        saved = {key: os.environ.get(key) for key in changed}
        os.environ.update(changed)
        try:
            result = run_main(args)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if log is None:
            sys.stdout.write(result.out)
            sys.stderr.write(result.err)
        else:
            with log.open("a") as out:
                out.write(result.out + result.err)
        return result.code

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SweepRunner, "_call", staticmethod(call))
        mp.setattr(SweepRunner, "run_point", one_at_a_time)
        yield


def run_process(args, cwd, env=None, timeout=180, **kwargs) -> subprocess.CompletedProcess:
    """`python -m attnlab ARGS` in a real process (text mode, output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *[str(a) for a in args]],
        cwd=cwd, env=env if env is not None else dict(os.environ), timeout=timeout,
        capture_output=True, text=True, encoding="utf-8", errors="replace", **kwargs,
    )


def parallel_config_text(train_source, train_target, val_source=None, val_target=None, extra: str = "") -> str:
    """A tiny DecoderOnly config over ParallelTextDataModule files (val defaults to the train pair)."""
    return (
        "model:\n"
        "  class_path: attnlab.DecoderOnly\n"
        "  init_args:\n"
        "    backbone: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}\n"
        "data:\n"
        "  class_path: data_modules.ParallelTextDataModule\n"
        "  init_args:\n"
        f"    train_source: {train_source}\n"
        f"    train_target: {train_target}\n"
        f"    val_source: {val_source or train_source}\n"
        f"    val_target: {val_target or train_target}\n"
        "    vocab_size: 300\n" + extra
    )


def debug_fit_args(root: Path, *extra, version: str = "v1") -> list[str]:
    """`fit` of experiments/debug.yaml, shrunk, writing to <root>/debug/<version>."""
    return ["fit", "--config", DEBUG_YAML, "--run.root", root, "--run.version", version,
            "--run.wandb", "disabled", *FAST_TRAINER, *DEBUG_DATA, *extra]


# The session's shared tiny runs (see trained_run): each fits once, and tests only read them.
MAPS_RUN = ("--trainer.callbacks+=attnlab.probes.attention_maps.AttentionMaps", "--run.tensorboard", "true")
ORACLE_RUN = ("--model.class_path", "conftest.Oracle", "--run.tensorboard", "true")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A factory of tiny trained runs shared by the whole session: `trained_run(*extra)` fits
    experiments/debug.yaml (debug_fit_args) once per distinct `extra` and returns (the fit's
    CliResult, its run folder). Tests read these folders; one that writes beside them writes
    only into a name of its own."""
    root = tmp_path_factory.mktemp("trained_runs")
    runs: dict[tuple, tuple[CliResult, Path]] = {}

    def get(*extra) -> tuple[CliResult, Path]:
        key = tuple(map(str, extra))
        if key not in runs:
            version = f"run{len(runs)}"
            result = run_main(debug_fit_args(root, *extra, version=version), cwd=root)
            assert result.code == 0, result.err[-3000:]
            runs[key] = (result, root / "debug" / version)
        return runs[key]

    return get


def assert_trained_on_the_lowest_variance_candidate(run_dir: Path, candidates) -> None:
    """BlockDiffusion's noise search chose, at its last validation, the candidate range whose
    per-sequence loss had the lowest logged variance (not merely one of them, and the variances
    differ), and saved it as the range it trains on (the `train_noise` buffer of last.ckpt)."""
    import torch

    metrics = read_metrics(run_dir)
    variances = [metrics[f"val/noise_var_{i}"][-1] for i in range(len(candidates))]
    assert len(set(variances)) == len(variances), variances
    lowest = candidates[variances.index(min(variances))]
    chosen = [metrics["val/noise_low"][-1], metrics["val/noise_high"][-1]]
    assert chosen == pytest.approx(lowest)
    assert metrics["val/noise_loss_var"][-1] == pytest.approx(min(variances))
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert state["train_noise"].tolist() == pytest.approx(chosen)


def read_metrics(run_dir: Path) -> dict[str, list[float]]:
    """Every non-empty value of each column of a run's metrics.csv, in row order."""
    import csv

    values: dict[str, list[float]] = {}
    with (run_dir / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if value not in (None, ""):
                    values.setdefault(key, []).append(float(value))
    return values


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, after checking its signature (fails on anything else)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    import struct

    return struct.unpack(">II", data[16:24])  # the IHDR chunk
