"""The speed-quality frontier: a sweep's `frontier:` block, what `attnlab sweep` runs for it, and
the report's frontier section (ratios, significance against the reference, the plot)."""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, png_size, run_sweep

FRONTIER = {"batch_sizes": [1, 4], "decodings": {
    "ar": {"greedy": {}},
    "bd": {"steps=1": {"model.init_args.denoising_steps": 1},
           "tau=0.5": {"model.init_args.unmasking": "threshold", "model.init_args.threshold": 0.5}}}}


def _bases(folder):
    """Two bases from the debug experiment: ar (DecoderOnly) and bd (BlockDiffusion, blocks of 4)."""
    config = yaml.safe_load(DEBUG_YAML.read_text())
    (folder / "ar.yaml").write_text(yaml.safe_dump(config))
    config["model"]["class_path"] = "attnlab.BlockDiffusion"
    config["model"]["init_args"].update(block_size=4, denoising_steps=2)
    (folder / "bd.yaml").write_text(yaml.safe_dump(config))


def _sweep_file(folder, **extra):
    _bases(folder)
    path = folder / "frontier.yaml"
    path.write_text(yaml.safe_dump({"base": ["ar.yaml", "bd.yaml"], "frontier": FRONTIER, **extra}))
    return path


def test_a_frontier_is_one_evaluation_per_decoding_and_batch_size_for_its_point_only(tmp_path):
    from attnlab.sweeps.spec import load_sweep

    spec = load_sweep(_sweep_file(tmp_path))
    ar, bd = spec.grid_points()
    assert list(spec.evaluations_for(ar)) == ["greedy@b1", "greedy@b4"]  # no `test` entry beside a frontier
    assert list(spec.evaluations_for(bd)) == ["steps=1@b1", "steps=1@b4", "tau=0.5@b1", "tau=0.5@b4"]
    assert spec.evaluate["tau=0.5@b4"] == {"model.init_args.unmasking": "threshold", "model.init_args.threshold": 0.5,
                                           "data.init_args.eval_batch_size": 4, "points": ["bd"]}
    assert spec.frontier.reference == "ar/greedy"  # the first decoding listed
    assert spec.frontier.evaluations["steps=1@b4"] == ("steps=1", 4)
    # `points:` on a plain evaluate entry restricts it the same way.
    spec = load_sweep(_sweep_file(tmp_path, evaluate={"test": {}, "long": {"points": ["bd"], "checkpoint": "last"}}))
    assert list(spec.evaluations_for(ar)) == ["test", "greedy@b1", "greedy@b4"]
    assert "long" in spec.evaluations_for(bd)


@pytest.mark.parametrize("frontier, expected", [
    ({**FRONTIER, "batch_sizes": [1, 1]}, "frontier.batch_sizes must be a list of distinct positive integers"),
    ({**FRONTIER, "batch_sizes": [0]}, "frontier.batch_sizes"),
    ({**FRONTIER, "decodings": {"mdlm": {"greedy": {}}}}, "frontier.decodings must map grid points (ar, bd) to their decodings"),
    ({**FRONTIER, "decodings": {"ar": {"greedy": {}}}}, "grid point(s) bd would train and never be tested"),
    ({**FRONTIER, "decodings": {"ar": ["greedy"]}}, "`frontier.decodings.ar` must be a mapping of decoding names"),
    ({**FRONTIER, "decodings": {"ar": {}}}, "frontier.decodings.ar names no decoding"),
    ({**FRONTIER, "decodings": {"ar": {"a/b": {}}}}, "frontier.decodings.ar.a/b: a decoding name has no '/'"),
    ({**FRONTIER, "decodings": {"ar": {"g": {"data.init_args.eval_batch_size": 8}}}}, "which the frontier sets itself"),
    ({**FRONTIER, "reference": "bd/greedy"}, "frontier.reference='bd/greedy' must be <point>/<decoding>"),
    ({**FRONTIER, "decodings": {"ar": {"g": {}}, "bd": {"g": {"model.init_args.denoising_steps": 1}}}},
     "frontier decoding g differs between two points"),
    ({**FRONTIER, "batchsizes": [1]}, "frontier has unknown key(s) batchsizes"),
])
def test_bad_frontiers_name_the_field(tmp_path, frontier, expected):
    from attnlab.errors import ConfigError
    from attnlab.sweeps.spec import load_sweep

    _bases(tmp_path)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"base": ["ar.yaml", "bd.yaml"], "frontier": frontier}))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_an_evaluate_entry_for_an_unknown_point_is_refused(tmp_path):
    from attnlab.errors import ConfigError
    from attnlab.sweeps.spec import load_sweep

    with pytest.raises(ConfigError, match=r"evaluate.b1.points must be a non-empty list of the sweep's points \(ar, bd\)"):
        load_sweep(_sweep_file(tmp_path, evaluate={"b1": {"points": ["decoder_only"]}}))
    with pytest.raises(ConfigError, match=r"evaluate.greedy@b1 is also a frontier evaluation"):
        load_sweep(_sweep_file(tmp_path, evaluate={"greedy@b1": {}}))


def test_a_decoding_name_two_points_share_with_the_same_overrides_is_one_evaluation_for_both(tmp_path):
    from attnlab.sweeps.spec import load_sweep

    _bases(tmp_path)
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump({"base": ["ar.yaml", "bd.yaml"], "frontier": {
        "batch_sizes": [2], "decodings": {"ar": {"plain": {}}, "bd": {"plain": {}}}, "reference": "bd/plain"}}))
    spec = load_sweep(path)
    assert spec.evaluate == {"plain@b2": {"data.init_args.eval_batch_size": 2, "points": ["ar", "bd"]}}
    assert [list(spec.evaluations_for(p)) for p in spec.grid_points()] == [["plain@b2"], ["plain@b2"]]


# ---- the report's frontier section on hand-made runs ---------------------------------------------

REFERENCES = [f"satz {i}" for i in range(40)]


def _write_run(root, point, seed, evaluations):
    """A finished sweep run with frontier evaluations: {name: (decoding, batch, tokens/s, calls per
    token, exact match in metrics.csv, hypotheses)}."""
    folder = root / point / f"seed{seed}"
    (folder / "fit").mkdir(parents=True)
    (folder / "fit" / "metrics.csv").write_text("epoch,step,train/loss,val/nll\n0,1,1.0,\n0,1,,0.5\n")
    frontier = {}
    for name, (decoding, batch, speed, calls, exact, hypotheses) in evaluations.items():
        (folder / name).mkdir()
        examples = [{"index": i, "reference": r, "hypothesis": h, "exact": h == r, "nll": 1.0, "tokens": 2}
                    for i, (r, h) in enumerate(zip(REFERENCES, hypotheses))]
        (folder / name / "examples.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
        with (folder / name / "metrics.csv").open("w", newline="") as f:
            csv.writer(f).writerows([["test/exact_match", "test/gen_tokens_per_s", "test/nfe_per_token"], [exact, speed, calls]])
        frontier[name] = {"decoding": decoding, "batch_size": batch}
    (folder / "done.json").write_text(json.dumps({"point": point, "index": int(point == "bd"), "seed": seed,
                                                  "swept": {}, "frontier": frontier, "frontier_reference": "ar/greedy"}))


RIGHT, HALF_WRONG = REFERENCES, [r if i % 2 else "falsch" for i, r in enumerate(REFERENCES)]


def _write_bd(root, seed, fast1, fast4, same1):
    # At b1 "fast" gets every example right: only its largest batch (b4, half wrong) may be scored and tested.
    _write_run(root, "bd", seed, {"fast@b1": ("fast", 1, fast1, 0.25, 100.0, RIGHT),
                                  "fast@b4": ("fast", 4, fast4, 0.5, 50.0, HALF_WRONG),
                                  "same@b1": ("same", 1, same1, 0.25, 100.0, RIGHT),
                                  "same@b4": ("same", 4, 900, 0.75, 100.0, RIGHT)})


def test_the_report_tabulates_speed_ratios_tests_quality_against_the_reference_and_plots(tmp_path):
    from attnlab.reports.report import report_main

    for seed, (ar1, ar4, fast1, fast4, same1) in enumerate([(100, 1000, 300, 800, 105), (110, 1100, 310, 820, 108),
                                                            (105, 1050, 305, 810, 106.5)]):
        _write_run(tmp_path, "ar", seed, {"greedy@b1": ("greedy", 1, ar1, 1.0, 0.0, RIGHT),  # b1's score is not shown
                                          "greedy@b4": ("greedy", 4, ar4, 1.0, 100.0, RIGHT)})
        _write_bd(tmp_path, seed, fast1, fast4, same1)
    assert report_main([str(tmp_path), "--wandb", "disabled"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    rows = {r["row"]: r for r in json.loads((tmp_path / "report" / "frontier.json").read_text())}
    assert rows["ar greedy"]["reference"] and rows["ar greedy"]["test/exact_match"]["mean"] == 100.0  # from b4
    fast, same = rows["bd fast"]["test/exact_match"]["comparison"], rows["bd same"]["test/exact_match"]["comparison"]
    assert fast["test"] == "seeds" and fast["p"] < 0.05 and fast["difference"] == -50.0  # b4's scores, not b1's
    assert same["p"] == 1.0 and same["difference"] == 0.0  # the same outputs
    assert rows["bd fast"]["gen_tokens_per_s"]["1"]["mean"] == 305.0
    assert {b: (v["mean"], v["n"]) for b, v in rows["bd same"]["nfe_per_token"].items()} == {"1": (0.25, 3), "4": (0.75, 3)}
    table = {line.split(" | ")[0].strip("| "): line for line in report.splitlines() if line.startswith(("| ar ", "| bd "))}
    # calls/token, tok/s and the ratio to the reference, per batch size
    assert f"| 0.25 | 305 ± 5 | {305 / 105:.2f}× | 0.50 | 810 ± 10 | {810 / 1050:.2f}× |" in table["bd fast"]
    assert "50.00 ± 0.00 *" in table["bd fast"] and "100.00 ± 0.00 |" in table["bd same"]
    assert "- batch 1: faster than the reference: bd fast (2.90×); faster in the mean, intervals not apart: bd same (1.01×)." in report
    assert "- batch 4: faster than the reference: none." in report
    assert "greedy@b1 exact_match" not in report  # frontier evaluations stay out of the main table
    assert png_size(tmp_path / "report" / "frontier.png")[0] > 300


def test_a_frontier_whose_reference_never_finished_says_so(tmp_path):
    from attnlab.reports.report import report_main

    _write_bd(tmp_path, 0, 300, 800, 105)
    assert report_main([str(tmp_path), "--wandb", "disabled"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "The reference ar greedy has no finished runs: no speed ratios and no quality tests." in report
    assert "| bd fast | 1 | 50.00 |" in report


# ---- end to end ------------------------------------------------------------------------------------

def test_sweep_runs_each_decoding_at_each_batch_size_and_reports_the_frontier(tmp_path):
    sweep_file = _sweep_file(tmp_path, seeds=[0])
    result = run_sweep([sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA, "--run.wandb", "disabled"],
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = tmp_path / "runs" / "frontier"
    for point, names in (("ar", ["greedy@b1", "greedy@b4"]),
                         ("bd", ["steps=1@b1", "steps=1@b4", "tau=0.5@b1", "tau=0.5@b4"])):
        done = json.loads((runs / point / "seed0" / "done.json").read_text())
        assert sorted(done["frontier"]) == names
        assert sorted(p.name for p in (runs / point / "seed0").iterdir() if p.is_dir()) == sorted(["fit", *names])
        for name in names:
            config = yaml.safe_load((runs / point / "seed0" / name / "config.yaml").read_text())
            assert config["data"]["init_args"]["eval_batch_size"] == done["frontier"][name]["batch_size"]
            model = config["model"]["init_args"]
            if name.startswith("tau"):
                assert model["unmasking"] == "threshold" and model["threshold"] == 0.5
            if name.startswith("steps=1"):
                assert model["denoising_steps"] == 1
    rows = {r["row"]: r for r in json.loads((runs / "report" / "frontier.json").read_text())}
    assert set(rows) == {"ar greedy", "bd steps=1", "bd tau=0.5"} and rows["ar greedy"]["reference"]
    calls = {name: {b: v["mean"] for b, v in row["nfe_per_token"].items()} for name, row in rows.items()}
    assert calls["ar greedy"] == {"1": 1.0, "4": 1.0} and all(0.25 <= c <= 1.0 for c in calls["bd steps=1"].values())
    assert set(rows["bd tau=0.5"]["gen_tokens_per_s"]) == {"1", "4"}
    assert "## Speed against quality (frontier)" in (runs / "report" / "report.md").read_text()
