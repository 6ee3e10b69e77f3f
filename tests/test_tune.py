"""The tune stage: the same Optuna search for every point, chosen on validation, resumable."""
from __future__ import annotations

import json
import math
import os
import signal

import pytest
import yaml

from attnlab.errors import ConfigError
from attnlab.reports.runs import read_metrics
from attnlab.sweeps.tune import best_value, parse_tune
from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, run_sweep

LR = "model.init_args.optimizer.lr"


@pytest.mark.parametrize("block,needle", [
    ({"trials": 2}, "tune.space must map"),
    ({"trials": 2, "space": {LR: []}}, "empty list"),
    ({"trials": 2, "space": {LR: {"low": 0.01, "high": 0.001}}}, "low < high"),
    ({"trials": 2, "space": {LR: {"low": 0.0, "high": 0.01, "log": True}}}, "low > 0"),
    ({"trials": 2, "space": {LR: {"low": 1e-4, "high": 1e-2}}, "sampler": "grid"}, "list of choices"),
    ({"trials": 5, "space": {LR: [1e-3, 3e-3]}, "sampler": "grid"}, "more than the grid's 2"),
    ({"trials": 2, "space": {LR: [1e-3]}, "sampler": "random"}, "tune.sampler='random'"),
    ({"trials": 2, "space": {LR: [1e-3]}, "metric": "test/bleu"}, "tune.metric"),
    ({"trials": 2, "space": {LR: [1e-3]}, "budget": 3}, "unknown key(s) budget"),
    ({"trials": 2, "space": {LR: [1e-3], "trainer.max_steps": [1, 2]}}, "also set by grid, points or fixed"),
    ({"trials": 2, "space": {"model.init_args.backbone.dropout": [0.0, 0.1]}}, "tune.space must search the learning rate"),
    ({"trials": 2, "space": {LR: [1e-3]}, "points": ["c"]}, "tune.points: 'c' is not a point; the points are a, b"),
    ({"trials": 2, "space": {LR: [1e-3]}, "points": []}, "non-empty list of point names"),
])
def test_a_bad_tune_block_names_its_field(tmp_path, block, needle):
    with pytest.raises(ConfigError) as caught:
        parse_tune(block, tmp_path / "s.yaml", ["trainer.max_steps"], "val/nll", ["a", "b"])
    assert needle in str(caught.value)


def test_tune_points_limit_the_search_to_the_points_named(tmp_path):
    every = parse_tune({"trials": 1, "space": {LR: [1e-3]}}, tmp_path / "s.yaml", [], "val/nll", ["a", "b"])
    some = parse_tune({"trials": 1, "space": {LR: [1e-3]}, "points": ["b"]}, tmp_path / "s.yaml", [], "val/nll", ["a", "b"])
    assert every.tunes("a") and every.tunes("b") and not some.tunes("a") and some.tunes("b")


def test_ranges_become_optuna_distributions_and_grids_default_to_their_size(tmp_path):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    spec = parse_tune({"space": {LR: {"low": 1e-4, "high": 1e-2, "log": True}, "w": {"low": 0, "high": 400},
                                 "d": [0.0, 0.1]}, "trials": 3}, tmp_path / "s.yaml", [], "val/bleu")
    kinds = {k: type(p.distribution()) for k, p in spec.space.items()}
    assert kinds == {LR: FloatDistribution, "w": IntDistribution, "d": CategoricalDistribution}
    assert spec.space[LR].distribution().log and spec.direction == "maximize"
    grid = parse_tune({"space": {LR: [1, 2], "b": [3, 4, 5]}, "sampler": "grid"}, tmp_path / "s.yaml", [], "val/nll")
    assert grid.trials == 6 and grid.direction == "minimize"


def test_a_tune_seed_among_the_evaluation_seeds_is_refused_before_any_run(tmp_path, cli):
    """A trial with seed k is a run of its point with seed k: its best-of-N score would count again as
    that seed's. Refused in one line, exit 2, with nothing written; the default seed (1000) is apart."""
    sweep = tmp_path / "tuned.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "points": {"a": {}, "b": {}}, "seeds": [0, 1, 2],
                                     "tune": {"trials": 1, "seed": 2, "space": {LR: [1e-3]}}}))
    result = cli("sweep", sweep, "--root", tmp_path / "runs")
    assert result.code == 2 and not (tmp_path / "runs").exists()
    assert "tune.seed=2 is also an evaluation seed (0, 1, 2): a point's best trial would count again" in result.err
    assert parse_tune({"trials": 1, "space": {LR: [1e-3]}}, sweep, [], "val/nll").seed == 1000
    from attnlab.sweeps.spec import load_sweep
    from attnlab.sweeps.sweep import evaluation_seeds

    unseeded = tmp_path / "unseeded.yaml"  # no seeds: the base config's seed_everything (0) is the evaluation seed
    unseeded.write_text(yaml.safe_dump({"base": str(DEBUG_YAML), "points": {"a": {}, "b": {}}}))
    assert evaluation_seeds(load_sweep(unseeded), []) == [0]
    assert evaluation_seeds(load_sweep(unseeded), ["--seed_everything", "7"]) == [7]


def test_a_chosen_value_on_the_edge_of_its_range_is_flagged():
    from attnlab.reports.tuning import on_edge

    choices = {"choices": [0.001, 0.003, 0.009]}
    assert on_edge(choices, 0.001) and on_edge(choices, 0.009) and not on_edge(choices, 0.003)
    assert on_edge({"choices": [0.1, 0.3]}, 0.1)  # two values: either is an edge, nothing is bracketed
    assert not on_edge({"choices": ["a", "b"]}, "a")  # not numbers: no edge
    ranged = {"low": 1e-4, "high": 1e-2, "log": True}  # log scale: 1e-3 is its middle
    assert on_edge(ranged, 1.2e-4) and on_edge(ranged, 0.0095) and not on_edge(ranged, 1e-3)
    assert on_edge({"low": 0.0, "high": 0.5}, 0.49) and not on_edge({"low": 0.0, "high": 0.5}, 0.25)


def test_best_value_reads_the_best_validation_row():
    history = [{"val/nll": 3.0}, {"train/loss": 1.0}, {"val/nll": 2.5}, {"val/nll": math.nan}, {"val/nll": 2.7}]
    assert best_value(history, "val/nll", "minimize") == 2.5
    assert best_value(history, "val/nll", "maximize") == 3.0
    assert best_value([{"train/loss": 1.0}], "val/nll", "minimize") is None


def test_each_point_gets_n_trials_runs_its_best_and_a_rerun_resumes_without_repeating(tmp_path, monkeypatch):
    """Two points, two TPE trials each. The second trial of point a is preempted (SIGTERM in its
    second step): the sweep exits 75 with that trial unfinished. The same command resumes that
    trial's fit from its last.ckpt, runs no trial again, and each point then trains with the
    values of its trial that validated best (read back from the trials' own metrics.csv)."""
    from attnlab.errors import EXIT_INTERRUPTED
    from attnlab.sweeps import tune as tune_module
    from attnlab.families.base import FamilyModule

    monkeypatch.setattr(tune_module, "check_space_keys", lambda spec, passthrough: None)  # a catalogue row tests it
    sweep_file = tmp_path / "tuned.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": str(DEBUG_YAML), "points": {"a": {}, "b": {"model.init_args.backbone.n_heads": 1}},
        "tune": {"trials": 2, "seed": 3, "space": {LR: {"low": 1e-4, "high": 3e-2, "log": True}}}}))
    # 4 steps an epoch: the trial preempted while step 1 trains saves step 2, mid-epoch
    args = [sweep_file, "--root", tmp_path / "runs", *FAST_TRAINER, "--trainer.max_steps", "3", *DEBUG_DATA,
            "--data.init_args.batch_size", "16", "--run.wandb", "disabled"]
    original = FamilyModule.on_train_batch_start

    def preempt_trial_1_of_a(self, batch, batch_idx):
        if self.trainer.global_step == 1 and "tune/a/trial1" in str(self.trainer.log_dir):
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(FamilyModule, "on_train_batch_start", preempt_trial_1_of_a)
    first = run_sweep(args, cwd=tmp_path)
    monkeypatch.setattr(FamilyModule, "on_train_batch_start", original)
    assert first.returncode == EXIT_INTERRUPTED, first.stderr[-3000:]
    assert "a trial was interrupted; the same sweep command resumes it" in first.stderr
    sweep_dir = tmp_path / "runs" / "tuned"
    trial0 = (sweep_dir / "tune" / "a" / "trial0" / "metrics.csv").read_bytes()
    assert not (sweep_dir / "tune" / "b").exists() and not (sweep_dir / "a").exists()

    second = run_sweep(args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "[tune] a: trial 1/2" not in second.stdout  # trial 0 (shown as 1/2) is not run again
    assert "[tune] a: trial 2/2" in second.stdout and "last.ckpt (epoch 0, step 2)" in second.stdout
    assert (sweep_dir / "tune" / "a" / "trial0" / "metrics.csv").read_bytes() == trial0

    record = json.loads((sweep_dir / "tune" / "tune.json").read_text())
    for point in ("a", "b"):
        trials = record[point]["trials"]
        assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"], trials
        assert sorted(p.name for p in (sweep_dir / "tune" / point).iterdir()) == ["trial0", "trial1"]
        values = {t["number"]: best_value(read_metrics(sweep_dir / "tune" / point / f"trial{t['number']}" / "metrics.csv"),
                                          "val/nll", "minimize") for t in trials}
        best = min(values, key=values.get)
        chosen = trials[best]["params"][LR]
        assert record[point]["chosen"] == {LR: chosen}
        assert json.loads((sweep_dir / point / "done.json").read_text())["tuned"] == {LR: chosen}
        config = yaml.safe_load((sweep_dir / point / "fit" / "config.yaml").read_text())
        assert config["model"]["init_args"]["optimizer"]["lr"] == pytest.approx(chosen, rel=1e-12)
    assert record["a"]["trials"][0]["params"] != record["a"]["trials"][1]["params"]
    # the trials are the report's tuning section, not rows of the comparison
    report = (sweep_dir / "report" / "report.md").read_text()
    table, tuning = report.split("## Tuning")
    assert "trial0" not in table and "trial1" not in table and "2 row(s), 2 run(s)" in table
    for point in ("a", "b"):
        best = next(t for t in record[point]["trials"] if t["params"] == record[point]["chosen"])
        assert f"| {point} | {best['number']} | {best['params'][LR]:.3g} | **{best['value']:.4f}** | complete |" in tuning
    assert "4 trials" in tuning


def test_a_grid_runs_every_cell_once_and_chooses_the_best_by_asking_and_telling(tmp_path):
    """The grid sampler with the Tuner's ask-and-tell loop: each of the 4 cells is tried once (Optuna's
    own grid sampler stops the study at the last cell, which raises outside Study.optimize), and the
    cell whose fit validated best is chosen."""
    from attnlab.sweeps.spec import load_sweep
    from attnlab.sweeps.tune import Tuner

    sweep_file = tmp_path / "grid.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "base": str(DEBUG_YAML), "points": {"a": {}},
        "tune": {"sampler": "grid", "space": {LR: [1e-3, 3e-3], "model.init_args.backbone.dropout": [0.0, 0.3]}}}))
    spec = load_sweep(sweep_file)
    tuner = Tuner(spec, tmp_path / "sweep", str(tmp_path), [], fit=None)
    tried = []

    def fake_fit(args):  # writes the trial's metrics.csv: val/nll lowest for lr 3e-3, dropout 0.3
        values = dict(arg.split("=", 1) for arg in args if arg.startswith("--model.init_args."))
        lr, dropout = float(values[f"--{LR}"]), float(values["--model.init_args.backbone.dropout"])
        tried.append((lr, dropout))
        folder = tuner.trial_dir(spec.grid_points()[0], int(args[args.index("--run.version") + 1].removeprefix("trial")))
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"step,val/nll\n0,{5 - 100 * lr - dropout}\n")
        return 0

    tuner.fit = fake_fit
    assert tuner.best_params(spec.grid_points()[0]) == {LR: 3e-3, "model.init_args.backbone.dropout": 0.3}
    assert sorted(tried) == [(1e-3, 0.0), (1e-3, 0.3), (3e-3, 0.0), (3e-3, 0.3)]
    assert tuner.best_params(spec.grid_points()[0]) == {LR: 3e-3, "model.init_args.backbone.dropout": 0.3}
    assert len(tried) == 4  # a rerun resumes the finished study: no trial again
