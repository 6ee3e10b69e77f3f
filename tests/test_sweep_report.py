"""`attnlab sweep` and `attnlab report` end to end on a two-point grid of the debug experiment."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import DEBUG_DATA, DEBUG_YAML, EXPERIMENTS, FAST_TRAINER, png_size, run_process

@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """Run a 2-point sweep once, then the same command again (which must skip both points)."""
    folder = tmp_path_factory.mktemp("sweep")
    sweep_file = folder / "heads.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": str(DEBUG_YAML),
        "grid": {"model.init_args.backbone.n_heads": [1, 2]},
        "evaluate": {"test": {}},
    }))
    args = ["sweep", sweep_file, "--root", folder / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    # The first run takes the one-run-per-GPU path (two "GPUs": CUDA_VISIBLE_DEVICES is harmless
    # on a CPU run), the rerun the sequential one.
    first = run_process([*args, "--devices", "0,1"], cwd=folder, timeout=600)
    second = run_process(args, cwd=folder, timeout=600)
    return folder / "runs" / "heads", first, second


def test_sweep_runs_every_point_and_tests_its_best_checkpoint(sweep_run):
    sweep_dir, first, _ = sweep_run
    assert first.returncode == 0, first.stderr[-3000:]
    for point in ("n_heads=1", "n_heads=2"):
        done = json.loads((sweep_dir / point / "done.json").read_text())
        assert done["swept"] == {"model.init_args.backbone.n_heads": int(point[-1])}
        config = yaml.safe_load((sweep_dir / point / "fit" / "config.yaml").read_text())
        assert config["model"]["init_args"]["backbone"]["n_heads"] == int(point[-1])
        assert config["run"]["group"] == "heads"
        summary = json.loads((sweep_dir / point / "fit" / "summary.json").read_text())
        assert summary["family"] == "decoder_only" and summary["params"] > 0
        assert "test/exact_match" in (sweep_dir / point / "test" / "metrics.csv").read_text()
        assert "run folder:" in (sweep_dir / point / "log.txt").read_text()  # parallel runs log to files
    assert "fit on GPU 0" in first.stdout and "fit on GPU 1" in first.stdout


def test_report_table_has_one_row_per_run_and_the_right_columns(sweep_run):
    sweep_dir, first, _ = sweep_run
    table = (sweep_dir / "report" / "report.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["run", "family", "n_heads", "params"]
    for column in ("val nll", "test exact_match", "test chrf", "train tok/s", "gen tok/s", "fit wall"):
        assert column in header
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["n_heads=1", "n_heads=2"]
    assert [r[2] for r in rows] == ["1", "2"]
    # Same width, different heads: the parameter count does not change (d_k = d_model / h).
    assert rows[0][3] == rows[1][3]
    data = json.loads((sweep_dir / "report" / "report.json").read_text())
    assert data[0]["test exact_match"] is not None and 0 <= data[0]["test exact_match"] <= 100
    assert "| n_heads=1 |" in first.stdout  # the sweep prints the table when it ends


def test_report_writes_valid_pngs(sweep_run):
    sweep_dir, _, _ = sweep_run
    for name in ("quality_vs_params.png", "throughput.png", "curves.png"):
        width, height = png_size(sweep_dir / "report" / name)
        assert width > 100 and height > 100


def test_rerun_skips_finished_points(sweep_run):
    sweep_dir, _, second = sweep_run
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("finished before, skipped") == 2
    assert "[sweep] n_heads=1: fit" not in second.stdout
    assert not (sweep_dir / ".incomplete").exists()


def test_a_point_interrupted_after_its_fit_resumes_instead_of_starting_over(sweep_run):
    """No done.json but a last.ckpt: the rerun resumes the fit (same --run.version, so the run
    folder and its metrics stay, no step repeated) and redoes the evaluation."""
    sweep_dir, _, _ = sweep_run
    point = sweep_dir / "n_heads=2"
    metrics_before = (point / "fit" / "metrics.csv").read_text()
    (point / "done.json").unlink()
    folder = sweep_dir.parent.parent
    args = ["sweep", folder / "heads.yaml", "--root", folder / "runs", *FAST_TRAINER, *DEBUG_DATA,
            "--run.wandb", "disabled"]
    rerun = run_process(args, cwd=folder, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "n_heads=2: resuming the unfinished earlier attempt" in rerun.stdout
    assert re.search(r"resuming \S+ from \S+last\.ckpt \(epoch", rerun.stdout + rerun.stderr)  # the fit itself
    assert "n_heads=1: finished before, skipped" in rerun.stdout
    assert not (sweep_dir / ".incomplete").exists()
    assert (point / "done.json").is_file()
    assert (point / "fit" / "metrics.csv").read_text() == metrics_before  # nothing retrained or repeated
    assert "test/exact_match" in (point / "test" / "metrics.csv").read_text()


def test_shipped_sweeps_load_and_export_to_wandb(tmp_path):
    from attnlab.experiment.spec import load_sweep, wandb_sweep_config

    spec = load_sweep(EXPERIMENTS / "compare_families.yaml")
    assert [p.name for p in spec.points()] == ["decoder_only", "encoder_decoder", "block_diffusion"]
    exported = wandb_sweep_config(load_sweep(EXPERIMENTS / "block_size_sweep.yaml"))
    assert exported["method"] == "grid"
    assert exported["parameters"]["model.init_args.block_size"] == {"values": [1, 2, 4, 8, 16]}
    assert exported["command"] == ["attnlab", "fit", "${args}"]


@pytest.mark.parametrize("content, expected", [
    ({"grid": {"a": [1]}}, "needs `base:`"),
    ({"base": "missing.yaml", "grid": {"a": [1]}}, "base 'missing.yaml' is not a file"),
    ({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": 2}}, "grid.model.init_args.backbone.n_heads must be a non-empty list"),
    ({"base": str(DEBUG_YAML), "grid": {"a": [1]}, "grdi": {}}, "unknown key(s) grdi"),
    ({"base": str(DEBUG_YAML)}, "nothing to sweep"),
    ({"base": str(DEBUG_YAML), "grid": {"a": [1]}, "evaluate": {"fit": {}}}, "evaluate.fit"),
])
def test_bad_sweep_files_name_the_field(tmp_path, content, expected):
    from attnlab.errors import ConfigError
    from attnlab.experiment.spec import load_sweep

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_a_failed_point_is_reported_and_set_aside_on_rerun(tmp_path):
    sweep_file = tmp_path / "bad_heads.yaml"
    # d_model 32 is not divisible by 3: the run fails with a config error before training.
    sweep_file.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": [3]}}))
    args = ["sweep", sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    first = run_process(args, cwd=tmp_path)
    assert first.returncode == 1
    assert "1 run(s) failed: n_heads=3" in first.stderr and "n_heads=3 does not divide" in first.stderr
    second = run_process(args, cwd=tmp_path)
    assert second.returncode == 1
    assert (tmp_path / "runs" / "bad_heads" / ".incomplete" / "n_heads=3-1").is_dir()
    assert "moved to" in second.stdout
