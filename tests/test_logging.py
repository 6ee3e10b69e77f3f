"""Where a run's logs go: CSV always, wandb offline without credentials (never a prompt), TensorBoard."""
from __future__ import annotations

import math
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from conftest import ORACLE_RUN, debug_fit_args, read_metrics, run_main, run_process

VAL_KEYS = ("val/loss", "val/nll", "val/ppl", "val/bpb", "val/exact_match", "val/bleu", "val/chrf", "val/gen_tokens_per_s",
            "val/nfe_per_token")


def test_wandb_auto_without_credentials_runs_offline_and_never_prompts(tmp_path):
    home = tmp_path / "home"  # no ~/.netrc, no wandb settings
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC", "ATTNLAB_RUN_VERSION")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"))
    root = tmp_path / "runs"
    args = debug_fit_args(root, version="wb")
    args[args.index("--run.wandb") + 1] = "auto"
    # stdin is closed and a timeout bounds the run: an interactive login prompt fails the test.
    proc = run_process(args, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    run_dir = root / "debug" / "wb"
    assert read_metrics(run_dir)["train/loss"]  # CSV is written alongside wandb
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, f"expected one offline wandb run in {run_dir / 'wandb'}, found {offline}"
    assert list(offline[0].glob("run-*.wandb")), "the offline run holds no logged data"

    line = next((l for l in proc.stdout.splitlines() if "wandb sync" in l), None)
    assert line is not None and "offline" in line, proc.stdout[-2000:]
    synced = re.search(r"wandb sync (\S+?)`?$", line).group(1)
    assert os.path.samefile(synced, offline[0]), f"stdout points at {synced}, the run is in {offline[0]}"
    assert not (home / ".netrc").exists()


def test_wandb_online_without_credentials_is_a_clear_error(cli, tmp_path, monkeypatch):
    """Refused by attnlab before wandb starts, so this process's environment is enough."""
    home = tmp_path / "home"
    home.mkdir()
    for name in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in (("HOME", home), ("XDG_CONFIG_HOME", home / ".config"), ("XDG_CACHE_HOME", home / ".cache")):
        monkeypatch.setenv(name, str(value))
    args = debug_fit_args(tmp_path / "runs", version="online")
    args[args.index("--run.wandb") + 1] = "online"
    result = cli(*args)
    assert result.code == 2, result.err[-2000:]
    assert "Traceback" not in result.err
    assert "run.wandb" in result.err and "wandb login" in result.err


def test_wandb_mode_from_the_environment_wins_over_auto(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = debug_fit_args(tmp_path, version="env")
    args[args.index("--run.wandb") + 1] = "auto"
    result = cli(*args)
    assert result.code == 0, result.err[-3000:]
    run_dir = tmp_path / "debug" / "env"
    assert (run_dir / "metrics.csv").is_file()
    assert not (run_dir / "wandb").exists()
    assert not re.search(r"^wandb", result.out, re.M)  # no "wandb (offline): ..." or "wandb: <url>" line


# ---- a short fit that validates (and generates) at the end of its one epoch ----------------------

@pytest.fixture(scope="module")
def short_fit(trained_run):
    """One epoch of two steps with TensorBoard on; conftest.Oracle is right on every second example
    (exact match 50 %)."""
    return trained_run(*ORACLE_RUN)


def test_csv_has_every_evaluation_key(short_fit):
    _, run_dir = short_fit
    metrics = read_metrics(run_dir)
    for key in (*VAL_KEYS, "train/loss", "train/tokens_per_s"):
        assert key in metrics, f"{key} missing from metrics.csv (has {sorted(metrics)})"
        assert all(math.isfinite(v) for v in metrics[key]), key
    nll, ppl = metrics["val/nll"][-1], metrics["val/ppl"][-1]
    assert ppl == pytest.approx(math.exp(nll), rel=1e-4)
    assert metrics["val/loss"][-1] == pytest.approx(nll, rel=1e-5)  # debug.yaml has no label smoothing
    assert metrics["val/exact_match"][-1] == pytest.approx(50.0)  # a percentage, of the 8 val pairs
    assert 0.0 < metrics["val/chrf"][-1] < 100.0
    assert metrics["val/gen_tokens_per_s"][-1] > 0 and min(metrics["train/tokens_per_s"]) > 0
    assert len(metrics["train/loss"]) == 2  # log_every_n_steps 1, two steps


def test_tensorboard_writes_event_files(short_fit):
    result, run_dir = short_fit
    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert events, f"no tfevents file under {run_dir}"
    assert "tensorboard --logdir" in result.out
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(events[0].parent))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "val/nll", "val/exact_match"} <= scalars, scalars


def test_two_runs_in_one_process_get_two_folders(tmp_path, monkeypatch):
    """Both runs start in the same second (the clock is frozen, not slept past): the default
    version is the timestamp, and the second run gets it suffixed instead of the first's folder."""
    from attnlab.training import run_folder

    monkeypatch.setattr(run_folder, "time", SimpleNamespace(strftime=lambda fmt: "20260101-120000"))
    args = debug_fit_args(tmp_path, "--trainer.max_steps", "1")
    version_at = args.index("--run.version")
    del args[version_at : version_at + 2]  # the default: a timestamp
    first = run_main(args, cwd=tmp_path)
    assert first.code == 0, first.err[-3000:]
    second = run_main(args, cwd=tmp_path)
    assert second.code == 0, second.err[-3000:]
    folders = sorted(p.name for p in (tmp_path / "debug").iterdir() if p.is_dir())
    assert folders == ["20260101-120000", "20260101-120000-1"], f"the runs went to {folders}"
