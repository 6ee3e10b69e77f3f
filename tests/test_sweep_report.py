"""`attnlab sweep` and `attnlab report` end to end on a two-point grid of the debug experiment."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import DEBUG_DATA, DEBUG_YAML, EXPERIMENTS, FAST_TRAINER, png_size, run_sweep

POINTS = ("n_heads=1", "n_heads=2")
SEEDS = (0, 1)
RUNS = [f"{point}/seed{seed}" for seed in SEEDS for point in POINTS]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """Run a 2-point sweep with 2 seeds once, then the same command again (which must skip all four runs)."""
    folder = tmp_path_factory.mktemp("sweep")
    sweep_file = folder / "heads.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": str(DEBUG_YAML),
        "grid": {"model.init_args.backbone.n_heads": [1, 2]},
        "seeds": list(SEEDS),
        "evaluate": {"test": {}},
    }))
    args = [sweep_file, "--root", folder / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    # The first run takes the one-run-per-GPU path (two "GPUs": CUDA_VISIBLE_DEVICES is harmless
    # on a CPU run), the rerun the sequential one.
    first = run_sweep([*args, "--devices", "0,1"], cwd=folder)
    second = run_sweep(args, cwd=folder)
    return folder / "runs" / "heads", first, second


def test_sweep_runs_every_point_once_per_seed_and_tests_its_best_checkpoint(sweep_run):
    sweep_dir, first, _ = sweep_run
    assert first.returncode == 0, first.stderr[-3000:]
    for run in RUNS:
        point, seed = run.split("/")
        done = json.loads((sweep_dir / run / "done.json").read_text())
        assert done["point"] == point and done["seed"] == int(seed[4:])
        assert done["swept"] == {"model.init_args.backbone.n_heads": int(point[-1])}
        config = yaml.safe_load((sweep_dir / run / "fit" / "config.yaml").read_text())
        assert config["model"]["init_args"]["backbone"]["n_heads"] == int(point[-1])
        assert config["seed_everything"] == int(seed[4:])
        assert config["run"]["group"] == "heads"
        summary = json.loads((sweep_dir / run / "fit" / "summary.json").read_text())
        assert summary["family"] == "decoder_only" and summary["params"] > 0
        assert "test/exact_match" in (sweep_dir / run / "test" / "metrics.csv").read_text()
        assert len((sweep_dir / run / "test" / "examples.jsonl").read_text().splitlines()) == 8
        assert "run folder:" in (sweep_dir / run / "log.txt").read_text()  # parallel runs log to files
    assert "fit on GPU 0" in first.stdout and "fit on GPU 1" in first.stdout
    # Seeds change the initialisation: the two seeds of a point train differently.
    losses = [(sweep_dir / "n_heads=1" / f"seed{s}" / "fit" / "metrics.csv").read_text() for s in SEEDS]
    assert losses[0] != losses[1]


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in text.split("95 % intervals")[0].splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return header, [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_report_has_one_row_per_point_with_intervals_over_seeds(sweep_run):
    sweep_dir, first, _ = sweep_run
    text = (sweep_dir / "report" / "report.md").read_text()
    header, rows = _table(text)
    assert header[:5] == ["run", "n", "family", "n_heads", "params"]
    for column in ("val nll (best)", "val bpb (best)", "test nll (best)", "test bpb (best)", "test exact_match (best)",
                   "test chrf (best)", "train tok/s", "gen tok/s", "fit wall"):
        assert column in header
    assert [r[0] for r in rows] == list(POINTS)
    assert [r[1] for r in rows] == ["2", "2"]  # n: two seeds per point
    assert [r[3] for r in rows] == ["1", "2"]
    # Same width, different heads: the parameter count does not change (d_k = d_model / h).
    assert rows[0][4] == rows[1][4]
    nll = rows[0][header.index("test nll (best)")]
    assert "±" in nll.strip("*")
    data = json.loads((sweep_dir / "report" / "report.json").read_text())["rows"]
    entry = data[0]["test nll (best)"]
    assert data[0]["seeds"] == list(SEEDS) and len(entry["values"]) == 2 and entry["n"] == 2
    low, high = entry["ci95"]
    assert low < entry["mean"] < high
    assert re.search(r"^\| n_heads=1 \| 2 \| \[", text, re.M)  # the interval table
    # two seeds: the rows are compared (difference and why not tested), never marked
    assert "not tested: n_heads=2 " in text and "(2 shared seeds; a test over training runs needs 3)" in text
    assert data[1]["test nll (best)"]["test"] == "none" and data[0]["reference"] == data[1]["reference"] == "n_heads=1"
    assert "| n_heads=1 | 2 |" in first.stdout  # the sweep prints the table when it ends


def test_the_report_of_a_sweep_runs_without_torch(sweep_run, tmp_path):
    """`attnlab report` reads files only: in a fresh interpreter it imports neither torch nor
    Lightning, and writes the report the sweep wrote (its per-example tests included)."""
    import subprocess
    import sys

    sweep_dir = sweep_run[0]
    code = ("import sys; from attnlab.cli.main import main; "
            f"code = main(['report', {str(sweep_dir)!r}, '--output', {str(tmp_path)!r}, '--wandb', 'disabled']); "
            "print(code, sorted({'torch', 'lightning'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.splitlines()[-1:] == ["0 []"], proc.stdout[-2000:] + proc.stderr[-3000:]
    again, first = (tmp_path / "report.md").read_text(), (sweep_dir / "report" / "report.md").read_text()
    assert _table(again) == _table(first)
    assert json.loads((tmp_path / "report.json").read_text())["tests"] == \
        json.loads((sweep_dir / "report" / "report.json").read_text())["tests"]


def test_report_writes_valid_pngs(sweep_run):
    sweep_dir, _, _ = sweep_run
    for name in ("quality_vs_params.png", "throughput.png", "curves.png"):
        width, height = png_size(sweep_dir / "report" / name)
        assert width > 100 and height > 100


def test_rerun_skips_finished_runs(sweep_run):
    sweep_dir, _, second = sweep_run
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("finished before, skipped") == 4
    assert "[sweep] n_heads=1/seed0: fit" not in second.stdout
    assert not (sweep_dir / ".incomplete").exists()


def test_a_run_interrupted_after_its_fit_resumes_instead_of_starting_over(sweep_run):
    """No done.json but a last.ckpt: the rerun resumes that (point, seed)'s fit (same --run.version,
    so the run folder and its metrics stay, no step repeated) and redoes the evaluation."""
    sweep_dir, _, _ = sweep_run
    run = sweep_dir / "n_heads=2" / "seed1"
    metrics_before = (run / "fit" / "metrics.csv").read_text()
    (run / "done.json").unlink()
    folder = sweep_dir.parent.parent
    args = [folder / "heads.yaml", "--root", folder / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    rerun = run_sweep(args, cwd=folder)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "n_heads=2/seed1: resuming the unfinished earlier attempt" in rerun.stdout
    assert re.search(r"resuming \S+ from \S+last\.ckpt \(epoch", rerun.stdout + rerun.stderr)  # the fit itself
    assert rerun.stdout.count("finished before, skipped") == 3
    assert not (sweep_dir / ".incomplete").exists()
    assert (run / "done.json").is_file()
    assert (run / "fit" / "metrics.csv").read_text() == metrics_before  # nothing retrained or repeated
    assert "test/exact_match" in (run / "test" / "metrics.csv").read_text()


def test_seeds_flag_runs_each_point_n_times_and_evaluates_the_named_checkpoint(tmp_path):
    """`--seeds 2` replaces the file's seeds; `checkpoint: last` tests last.ckpt (the dry run shows it)."""
    sweep_file = tmp_path / "one.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": [2]},
                                          "evaluate": {"final": {"checkpoint": "last"}}}))
    args = [sweep_file, "--root", tmp_path / "runs", "--seeds", "2", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    dry = run_sweep([*args, "--dry-run"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "n_heads=2/seed0 [fit]" in dry.stdout and "n_heads=2/seed1 [final]" in dry.stdout
    assert "--seed_everything=1" in dry.stdout and "checkpoint" not in dry.stdout  # not a config key
    from attnlab.sweeps.sweep import checkpoint_to_test

    checkpoints = tmp_path / "fit" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("best-epoch=0-step=1.ckpt", "last.ckpt"):
        (checkpoints / name).write_text("x")
    assert checkpoint_to_test(tmp_path / "fit", "last").name == "last.ckpt"
    (checkpoints / "last.ckpt").unlink()  # "best" reads its record (test_sweep_best_checkpoint.py)
    assert checkpoint_to_test(tmp_path / "fit", "best").name.startswith("best-")
    from attnlab.errors import AttnlabError

    with pytest.raises(AttnlabError, match="CheckpointAveraging"):
        checkpoint_to_test(tmp_path / "fit", "averaged")


def test_shipped_sweeps_load_and_export_to_wandb(tmp_path):
    from attnlab.sweeps.spec import load_sweep, wandb_sweep_config

    spec = load_sweep(EXPERIMENTS / "compare_families.yaml")
    assert [p.name for p in spec.grid_points()] == ["decoder_only", "encoder_decoder", "block_diffusion",
                                                    "block_diffusion_from_ar"]
    assert spec.seeds == [0, 1, 2]
    assert [p.folder for p in spec.points()][:5] == ["decoder_only/seed0", "encoder_decoder/seed0", "block_diffusion/seed0",
                                                     "block_diffusion_from_ar/seed0", "decoder_only/seed1"]
    assert spec.init_from == {"block_diffusion_from_ar": ("decoder_only", 500)}
    exported = wandb_sweep_config(spec)["parameters"]
    assert exported["seed_everything"] == {"values": [0, 1, 2]}
    assert [Path(c).stem for c in exported["config"]["values"]] == ["decoder_only", "encoder_decoder", "block_diffusion"]
    exported = wandb_sweep_config(load_sweep(EXPERIMENTS / "number_words" / "block_size_sweep.yaml"))
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
    ({"base": str(DEBUG_YAML), "grid": {"a": [1]}, "points": {"b": {}}}, "not both"),
    ({"base": str(DEBUG_YAML), "points": {}}, "points is empty"),
    ({"base": str(DEBUG_YAML), "points": {"seed1": {}}}, "points.seed1: a point name is a folder name"),
    ({"base": str(DEBUG_YAML), "points": {"a/b": {}}}, "points.a/b: a point name is a folder name"),
    ({"base": str(DEBUG_YAML), "points": {"a": 3}}, "`points.a` must be a mapping"),
    ({"base": [str(DEBUG_YAML), str(DEBUG_YAML)], "points": {"a": {}}}, "named points need one base config (got 2)"),
    ({"base": str(DEBUG_YAML), "points": {"a": {}}, "reference": "b"}, "reference='b' must name a point: one of a"),
    ({"base": str(DEBUG_YAML), "points": {1: {}}}, "points.1: YAML reads this name as a int; quote it"),
    ({"base": str(DEBUG_YAML), "points": {"a": {}, "b": {}}, "reference": "a", "evaluate": {"t": {"points": ["b"]}}},
     "evaluate.t.points leaves out the reference point 'a'"),
])
def test_bad_sweep_files_name_the_field(tmp_path, content, expected):
    from attnlab.errors import ConfigError
    from attnlab.sweeps.spec import load_sweep

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_a_failed_point_is_reported_and_set_aside_on_rerun(tmp_path):
    sweep_file = tmp_path / "bad_heads.yaml"
    # d_model 32 is not divisible by 3: the run fails with a config error before training.
    sweep_file.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": [3]}}))
    args = [sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    first = run_sweep(args, cwd=tmp_path)
    assert first.returncode == 1
    assert "1 run(s) failed: n_heads=3" in first.stderr and "n_heads=3 does not divide" in first.stderr
    second = run_sweep(args, cwd=tmp_path)
    assert second.returncode == 1
    assert (tmp_path / "runs" / "bad_heads" / ".incomplete" / "n_heads=3-1").is_dir()
    assert "moved to" in second.stdout


def test_a_report_column_mixing_numbers_and_dashes_goes_to_wandb_as_text():
    """A sweep with an unfinished run has "—" beside numbers in a column; wandb.Table refused
    such a column (seen on a partial lm/compare_families report)."""
    import wandb

    from attnlab.reports.wandb_report import table_cells

    headers = ["run", "params", "test nll"]
    rows = [{"run": "a", "params": "—", "test nll": None}, {"run": "b", "params": 1317632, "test nll": 4.84}]
    cells = table_cells(headers, rows)
    assert cells == [["a", "—", None], ["b", "1317632", 4.84]]
    table = wandb.Table(columns=headers, data=cells)  # raised TypeError before
    assert len(table.data) == 2


def test_an_unfinished_point_of_a_sweep_is_left_out_of_the_report_and_said(tmp_path, capsys):
    """A sweep writes a point's done.json last; a point without one (killed, or still running)
    showed as an extra row named by its folder, with empty cells."""
    from attnlab.reports.runs import collect_runs

    for point, done in (("ar", True), ("bd", False)):
        fit = tmp_path / point / "seed0" / "fit"
        fit.mkdir(parents=True)
        (fit / "metrics.csv").write_text("step,train/loss,val/nll\n0,5.0,\n1,4.0,4.5\n")
        test = fit.parent / "test"
        test.mkdir()
        (test / "metrics.csv").write_text("test/nll\n4.4\n")
        if done:
            (fit.parent / "done.json").write_text(json.dumps({"point": point, "seed": 0, "index": 0}))
    plain = tmp_path / "plain_runs" / "20261201-120000"  # an ordinary fit beside the sweep stays
    plain.mkdir(parents=True)
    (plain / "metrics.csv").write_text("step,train/loss\n0,5.0\n")
    records = collect_runs(tmp_path)
    assert [(r.name, r.seed) for r in records] == [("ar", 0), ("plain_runs/20261201-120000", None)]
    assert records[0].evaluations["test"]["test/nll"] == 4.4
    err = capsys.readouterr().err
    assert "skipped" in err and str(tmp_path / "bd" / "seed0" / "fit") in err


GOOD_METRICS = "epoch,step,train/loss,val/nll\n0,0,5.0,\n0,1,4.0,4.5\n"  # empty cells: metrics a row did not log


@pytest.mark.parametrize("content, words", [
    (b"epoch,step,train/loss\n0,0,5.0\n\xff\xfe garbage\n", "line 3: bytes that are not UTF-8 text"),
    (b"epoch,step,train/loss\n0,0,5.0\n\x00\x00\x00\x00", "line 3: NUL bytes"),
    ("epoch,step,train/loss,val/nll\n0,0,5.0,\n0,1,4.\n0,2,3.0,\n", "line 3: 3 fields where the header has 4"),
    ("epoch,step,train/loss\n0,0,5.0,7,8\n", "line 2: 5 fields where the header has 3"),
    ("epoch,step,train/loss\n0,0,five\n", "line 2: train/loss is 'five', not a number"),
    ("0,0,5.0\n0,1,4.0\n", "line 1: no header"),
    ("", "the file is empty"),
])
def test_a_damaged_metrics_csv_names_the_file_line_and_fix(tmp_path, content, words):
    """Read leniently, such a file made a report of empty columns without a word."""
    from attnlab.errors import DataError
    from attnlab.reports.runs import collect_runs

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "metrics.csv").write_text(GOOD_METRICS)
    (tmp_path / "bad").mkdir()
    path = tmp_path / "bad" / "metrics.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=re.escape(f"{path}: {words}")) as raised:
        collect_runs(tmp_path)
    assert f"rerun the command that wrote {path.parent}, or move that folder out of {tmp_path}" in str(raised.value)


def test_a_damaged_metrics_csv_of_a_sweep_point_says_delete_and_rerun_or_skips_an_unfinished_one(tmp_path, capsys):
    from attnlab.errors import DataError
    from attnlab.reports.runs import collect_runs

    for point in ("done", "running"):
        fit = tmp_path / point / "fit"
        fit.mkdir(parents=True)
        (fit / "metrics.csv").write_text(GOOD_METRICS + "0,2,3.\n0,3,2.0,\n")  # a short row mid-file
    (tmp_path / "done" / "done.json").write_text(json.dumps({"point": "done"}))
    with pytest.raises(DataError, match=re.escape(f"delete {tmp_path / 'done'} and rerun `attnlab sweep`")):
        collect_runs(tmp_path)
    (tmp_path / "done" / "fit" / "metrics.csv").write_text(GOOD_METRICS)
    assert [r.name for r in collect_runs(tmp_path)] == ["done"]  # the running point's file is damaged
    assert f"skipped {tmp_path / 'running' / 'fit'}" in capsys.readouterr().err


def test_a_sweep_of_named_points_tests_every_row_against_its_reference(tmp_path):
    """`points:` runs each named point once (not a grid); done.json shows every key some point sets,
    read from the run's own config where the point leaves it at the base's value; the report tests
    against `reference:` (marked in every tested column, whether or not it is the best) and shows
    val perplexity as the paper's Table 3 does (exp of val nll)."""
    import math

    sweep_file = tmp_path / "table.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": str(DEBUG_YAML),
        "points": {"base": {}, "h=1": {"model.init_args.backbone.n_heads": 1},
                   "dropout": {"model.init_args.backbone.dropout": 0.1, "model.init_args.optimizer.lr": 0.001}},
        "reference": "base",
    }, sort_keys=False))  # the file's order is the table's
    args = [sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"]
    dry = run_sweep([*args, "--dry-run"], cwd=tmp_path)
    assert "dropout [fit]" in dry.stdout and "--model.init_args.optimizer.lr=0.001" in dry.stdout
    done = run_sweep(args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep_dir = tmp_path / "runs" / "table"
    swept = {p: json.loads((sweep_dir / p / "done.json").read_text())["swept"] for p in ("base", "h=1", "dropout")}
    heads, dropout, lr = ("model.init_args.backbone.n_heads", "model.init_args.backbone.dropout",
                          "model.init_args.optimizer.lr")
    assert swept["base"] == {heads: 2, dropout: 0.0, lr: 0.003}  # debug.yaml's values, from config.yaml
    assert swept["h=1"] == {heads: 1, dropout: 0.0, lr: 0.003}
    assert swept["dropout"] == {heads: 2, dropout: 0.1, lr: 0.001}
    rows = {row["run"]: row for row in json.loads((sweep_dir / "report" / "report.json").read_text())["rows"]}
    assert list(rows) == ["base", "h=1", "dropout"]
    assert [row["reference"] for row in rows.values()] == ["base", "base", "base"]
    tested = [c for c, v in rows["h=1"].items() if isinstance(v, dict) and "test" in v]
    assert {"test nll (best)", "test chrf (best)", "test exact_match (best)"} <= set(tested)
    for column in tested:  # one seed each: two single systems, tested on that seed's test examples
        assert "test" not in rows["base"][column], column
        assert rows["h=1"][column]["test"] == rows["dropout"][column]["test"] == "examples", column
        assert rows["h=1"][column]["p"] is not None and rows["dropout"][column]["p"] is not None, column
    for row in rows.values():
        assert row["val ppl (best)"]["values"] == pytest.approx([math.exp(v) for v in row["val nll (best)"]["values"]])
    text = (sweep_dir / "report" / "report.md").read_text()
    assert "**test chrf (best)**, reference base (" in text and "`†`: one shared seed, so two single systems" in text
    header, table = _table(text)
    assert header[:7] == ["run", "n", "family", "n_heads", "dropout", "lr", "params"]
    assert table[0][3:6] == ["2", "0.0", "0.003"]


def test_the_reference_comes_from_the_runs_that_name_one():
    """A row is tested against the row its runs name (done.json: the sweep's reference, or in a facetted
    sweep its grid cell's), else the first row; naming one the report does not have leaves it untested,
    so a test never silently moves to another row (across facets)."""
    from attnlab.reports.report import Point, point_reference
    from attnlab.reports.runs import RunRecord

    def point(name, *references):
        return Point(name, [RunRecord(name, None, "f", [], seed=i, reference=r) for i, r in enumerate(references)])

    names = ["base", "h=1", "h=2"]
    assert point_reference(point("h=1", None, "base"), names) == "base"  # a run finished before it named one
    assert point_reference(point("h=1", None, None), names) == "base"  # none named: the first row
    assert point_reference(point("h=2", "h=1"), names) == "h=1"
    assert point_reference(point("h=1", "gone"), names) is None  # a reference no row has: untested
    assert point_reference(point("h=1", "base", "h=2"), names) == "base"  # two named: the first row, said


def test_a_preempted_sweep_stops_leaves_the_point_unfinished_and_resumes_it(tmp_path, monkeypatch):
    """SIGTERM while the first point trains: that fit saves last.ckpt and exits 75, the sweep says
    so, starts no further run, writes no done.json and exits 75; the same command resumes it."""
    import os
    import signal

    from attnlab.families.base import FamilyModule
    from attnlab.errors import EXIT_INTERRUPTED

    sweep_file = tmp_path / "heads.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "grid": {"model.init_args.backbone.n_heads": [1, 2]}}))
    args = [sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, "--trainer.max_steps", "4", *DEBUG_DATA,
            "--run.wandb", "disabled", "--trainer.max_epochs", "3"]
    original = FamilyModule.on_train_batch_start

    def preempt_at_step_1(self, batch, batch_idx):
        if self.trainer.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(FamilyModule, "on_train_batch_start", preempt_at_step_1)
    first = run_sweep(args, cwd=tmp_path)
    monkeypatch.setattr(FamilyModule, "on_train_batch_start", original)
    sweep_dir = tmp_path / "runs" / "heads"
    assert first.returncode == EXIT_INTERRUPTED, first.stderr[-3000:]
    assert "n_heads=1: fit was interrupted; the same sweep command resumes it" in first.stderr
    assert not (sweep_dir / "n_heads=1" / "done.json").exists() and not (sweep_dir / "n_heads=2").exists()
    second = run_sweep(args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "n_heads=1: resuming the unfinished earlier attempt" in second.stdout
    assert "last.ckpt (epoch 0, step 2)" in second.stdout  # the step the preempted fit reached
    assert all((sweep_dir / point / "done.json").is_file() for point in POINTS)
