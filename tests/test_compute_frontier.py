"""The compute frontier: a run per contender, budget and seed, each at its best validation checkpoint;
the crossover in compute read off it with an interval over seeds, and a test over seeds at each
budget, on run folders written by hand as `attnlab sweep` leaves a grid of budgets."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from conftest import png_size

BUDGETS = (1.0e9, 4.0e9, 1.6e10)
# contender -> (class, per budget: the val/nll validations of seeds 0, 1, 2; the lowest is the best)
RUNS = {
    "ar": ("DecoderOnly", {1.0e9: ([3.4, 3.0], [3.3, 3.1], [3.5, 3.2]),
                           4.0e9: ([3.0, 2.8, 2.9], [2.85, 2.9], [2.9, 3.1]),
                           1.6e10: ([2.9, 3.3], [3.0, 3.2], [3.1, 3.6])}),  # overfits: its best comes early
    "mdlm": ("BlockDiffusion", {1.0e9: ([3.5], [3.6], [3.7]),
                                4.0e9: ([3.2, 2.9], [2.95], [3.05]),
                                1.6e10: ([2.8, 2.6], [2.7], [2.75, 2.8])}),
}


def _name(contender: str, budget: float) -> str:
    mantissa, exponent = f"{budget:.1e}".split("e")
    return f"{contender},flops={mantissa}e{int(exponent)}"


def _write_sweep(root: Path) -> Path:
    sweep = root / "runs" / "frontier"
    index = 0
    for contender, (cls, by_budget) in RUNS.items():
        for budget, seeds in by_budget.items():
            point = _name(contender, budget)
            for seed, losses in enumerate(seeds):
                fit = sweep / point / f"seed{seed}" / "fit"
                fit.mkdir(parents=True)
                rows = [["epoch", "step", "train/loss", "val/nll"]] + [[0, 10 * (i + 1), "", v] for i, v in enumerate(losses)]
                rows.insert(1, [0, 1, 4.0, ""])
                with (fit / "metrics.csv").open("w", newline="") as f:
                    csv.writer(f).writerows(rows)
                (fit / "config.yaml").write_text(f"model:\n  class_path: attnlab.{cls}\n")
                (fit / "summary.json").write_text(json.dumps({"params": 1000, "steps": 10 * len(losses), "fit_seconds": 1.0,
                                                              "ledger": {"flops": budget, "tokens": 1, "epochs": budget / 1e8},
                                                              "budget": {"flops": budget, "max_steps": 10 * len(losses)}}))
                test = fit.parent / "test"
                test.mkdir()
                (test / "metrics.csv").write_text(f"test/nll\n{min(losses) + 0.05}\n")
                (fit.parent / "done.json").write_text(json.dumps({
                    "point": point, "index": index, "seed": seed, "swept": {"run.budget": {"flops": budget}},
                    "reference": _name("ar", budget), "facet": _name("", budget).lstrip(",")}))
            index += 1
    return sweep


def test_crossing_is_interpolated_in_log_compute_between_the_last_budget_above_and_the_next():
    from attnlab.reports.compute_frontier import crossing

    assert crossing([1e9, 4e9, 1.6e10], [0.5, 0.1, -0.3]) == pytest.approx(4e9 * 4 ** 0.25)
    assert crossing([1e9, 4e9, 1.6e10], [-0.1, 0.1, -0.3]) == pytest.approx(4e9 * 4 ** 0.25)  # an early dip does not count
    assert crossing([1e9, 4e9], [-0.2, -0.1]) == 1e9  # below everywhere: from the smallest budget
    assert crossing([1e9, 4e9], [-0.2, 0.1]) is None  # not below at the largest: none in the range


def test_the_report_reads_each_contenders_frontier_tests_each_budget_and_states_the_crossover(tmp_path):
    from scipy import stats

    from attnlab.reports.report import report_main

    sweep = _write_sweep(tmp_path)
    assert report_main([str(sweep), "--wandb", "disabled"]) == 0
    report = json.loads((sweep / "report" / "report.json").read_text())
    frontier = report["compute_frontier"]
    contenders = {c["name"]: c for c in frontier["contenders"]}
    assert set(contenders) == {"ar", "mdlm"} and contenders["ar"]["ar"] and not contenders["mdlm"]["ar"]
    best = {(name, rung["budget"]): rung["best"] for name, c in contenders.items() for rung in c["rungs"]}
    assert best["ar", 1.6e10] == [2.9, 3.0, 3.1]  # each run's lowest val/nll, not its last
    assert best["mdlm", 4.0e9] == [2.9, 2.95, 3.05]
    assert contenders["ar"]["rungs"][0]["test"] == pytest.approx([3.05, 3.15, 3.25])  # its test at that checkpoint
    lines = "\n".join(report["markdown"]["compute_frontier"])
    # each budget: paired t over the 3 seeds (scipy), Holm over the section's 3 tests (by hand)
    raw = [stats.ttest_rel(best["mdlm", b], best["ar", b]).pvalue for b in BUDGETS]
    order = sorted(range(3), key=raw.__getitem__)
    adjusted, running = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[i]))
        adjusted[i] = running
    for budget, p in zip(BUDGETS, adjusted):
        difference = sum(best["mdlm", budget]) / 3 - sum(best["ar", budget]) / 3
        assert f"| mdlm | ar | {budget:.3g} | 3 | {difference:+.4f} [" in lines
        assert f"| {p:.3g} |" in lines
    # the means cross between 4e9 (+0.1167) and 1.6e10 (-0.3167); seeds 0 and 1 at a quarter of the
    # log step, seed 2 (+0.15, -0.35) at three tenths
    share = (2.9667 - 2.85) / ((2.9667 - 2.85) + (3.0 - 2.6833))
    at = 4e9 * 4 ** share
    seeds = [4e9 * 4 ** 0.25, 4e9 * 4 ** 0.25, 4e9 * 4 ** 0.3]
    logs = [math.log10(x) for x in seeds]
    mean, sd = sum(logs) / 3, (sum((x - sum(logs) / 3) ** 2 for x in logs) / 2) ** 0.5
    half = stats.t.ppf(0.975, 2) * sd / 3 ** 0.5
    assert (f"- mdlm against ar: below from {at:.3g} FLOPs on (seed 0: {seeds[0]:.3g}; seed 1: {seeds[1]:.3g}; "
            f"seed 2: {seeds[2]:.3g}, 95 % interval [{10 ** (mean - half):.3g}, {10 ** (mean + half):.3g}]).") in lines
    assert png_size(sweep / "report" / "compute_frontier.png")[0] > 900
    from test_publish import _check_frontier_marks  # what the committed pages are held to

    _check_frontier_marks(sweep, frontier, report["markdown"]["compute_frontier"])
    # the main table tests each row against AR at its own budget, never across budgets
    rows = {row["run"]: row for row in report["rows"]}
    for budget in BUDGETS:
        assert rows[_name("mdlm", budget)]["reference"] == _name("ar", budget)
        assert rows[_name("mdlm", budget)]["test nll (best)"]["shared"] == 3


def test_a_contender_that_never_drops_below_says_none_in_the_range():
    from attnlab.reports.compute_frontier import ComputeFrontier

    data = {"kind": "flops", "contenders": [
        {"name": "ar", "family": "DecoderOnly", "ar": True,
         "rungs": [{"budget": b, "seeds": [0, 1, 2], "best": [2.0, 2.1, 2.2], "test": [2.0, 2.1, 2.2], "epochs": [1, 1, 1]}
                   for b in BUDGETS]},
        {"name": "bd", "family": "BlockDiffusion", "ar": False,
         "rungs": [{"budget": b, "seeds": [0, 1], "best": [2.5, 2.6], "test": [2.5, 2.6], "epochs": [1, 1]}
                   for b in BUDGETS]}]}
    lines = "\n".join(ComputeFrontier.from_json(data).lines())
    assert "- bd against ar: none in the range (1e+09–1.6e+10 FLOPs): not below at the largest budget" in lines
    assert "| bd | ar | 1e+09 | 2 | +0.5000 | not tested (2 shared seeds) |" in lines


def test_a_seed_below_at_every_budget_crosses_somewhere_below_the_range_and_gives_no_interval():
    from attnlab.reports.compute_frontier import ComputeFrontier

    def rungs(best):
        return [{"budget": b, "seeds": [0, 1, 2], "best": v, "test": v, "epochs": [1, 1, 1]} for b, v in zip(BUDGETS, best)]

    data = {"kind": "flops", "contenders": [
        {"name": "ar", "family": "DecoderOnly", "ar": True, "rungs": rungs([[3.0] * 3, [2.8] * 3, [2.9] * 3])},
        {"name": "bd", "family": "BlockDiffusion", "ar": False,
         "rungs": rungs([[2.9, 3.2, 3.3], [2.7, 2.9, 2.95], [2.6, 2.7, 2.75]])}]}
    frontier = ComputeFrontier.from_json(data)
    entry = frontier.crossover(*reversed(frontier.contenders))
    assert entry["seeds"][0] == 1e9 and "interval" not in entry  # seed 0 is below from the smallest budget on
    lines = "\n".join(frontier.lines())
    assert "seed 0: ≤ 1e+09; seed 1: " in lines and "no interval: it needs 3 or more seeds that all cross inside" in lines
