"""The report's learning curves: the best val/nll so far against the epochs and FLOPs the budget
ledger spent, one panel per data size, and the crossover words, on run folders written by hand as a
sweep leaves them."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import png_size

TRAIN_TOKENS = "data.init_args.train_tokens"
# point -> (class, train_tokens, epochs per step, steps, validated steps, val/nll of seed 0, of seed 1)
POINTS = {
    "ar-1k": ("DecoderOnly", 1000, 0.5, 40, [9, 19, 29, 39], [3.0, 2.5, 2.8, 3.2], [3.2, 2.7, 3.0, 3.4]),
    "mdlm-1k": ("BlockDiffusion", 1000, 0.3, 60, [14, 29, 44, 59], [2.0, 2.8, 2.7, 2.5], [2.0, 3.0, 2.8, 2.7]),
    "ar-2k": ("DecoderOnly", 2000, 0.25, 40, [9, 19, 29, 39], [3.0, 2.6, 2.5, 2.45], [3.1, 2.7, 2.6, 2.55]),
    "mdlm-2k": ("BlockDiffusion", 2000, 0.15, 60, [14, 29, 44, 59], [3.5, 3.0, 2.9, 2.8], [3.6, 3.1, 3.0, 2.9]),
}
FLOPS_PER_EPOCH = 1.0e9


def _write_sweep(root: Path) -> Path:
    """Fits with the ledger: budget/* on training rows logged every 10 steps (4, 14, ...), so no
    validation step has one and its epochs are interpolated; summary.json with the totals."""
    sweep = root / "runs" / "lm"
    for index, (point, (cls, tokens, per_step, steps, validated, *losses)) in enumerate(POINTS.items()):
        for seed, values in enumerate(losses):
            fit = sweep / point / f"seed{seed}" / "fit"
            fit.mkdir(parents=True)
            header = ["epoch", "step", "train/loss", "budget/epochs", "budget/flops", "budget/tokens", "val/nll"]
            rows = [[0, s, 4.0, per_step * (s + 1), FLOPS_PER_EPOCH * per_step * (s + 1), 64 * (s + 1), ""]
                    for s in range(4, steps, 10)]
            rows += [[0, s, "", "", "", "", v] for s, v in zip(validated, values)]
            with (fit / "metrics.csv").open("w", newline="") as f:
                csv.writer(f).writerows([header, *sorted(rows, key=lambda r: r[1])])
            (fit / "config.yaml").write_text(f"model:\n  class_path: attnlab.{cls}\n")
            epochs = per_step * steps
            (fit / "summary.json").write_text(json.dumps({
                "family": "decoder_only" if cls == "DecoderOnly" else "block_diffusion", "params": 1000, "steps": steps,
                "fit_seconds": 1.0, "ledger": {"flops": FLOPS_PER_EPOCH * epochs, "tokens": 64 * steps,
                                               "unique_tokens": tokens, "epochs": epochs, "train_seconds": 1.0}}))
            (fit.parent / "done.json").write_text(json.dumps({"point": point, "index": index, "seed": seed,
                                                              "swept": {TRAIN_TOKENS: tokens}, "reference": "ar-1k"}))
    return sweep


def test_crossover_is_where_the_curve_goes_below_the_interpolated_reference_for_good():
    from attnlab.reports.curves import crossover

    ar_x, ar_y = [5, 10, 15, 20], [3.1, 2.6, 2.9, 3.3]
    # 4.5 is before AR's first evaluation (skipped, not extrapolated); at 9 AR is 3.1 - 0.5 * 4 / 5 = 2.7
    # (2.9 is above); at 13.5 AR is 2.6 + 0.3 * 3.5 / 5 = 2.81 > 2.75, at 18 it is 3.14 > 2.6.
    assert crossover([4.5, 9, 13.5, 18], [2.0, 2.9, 2.75, 2.6], ar_x, ar_y) == pytest.approx(13.5)
    # below at 5 (a bound that starts low), above at 10, below again from 13.5 on: 13.5
    assert crossover([5, 10, 13.5, 18], [3.0, 2.7, 2.75, 2.6], ar_x, ar_y) == pytest.approx(13.5)
    assert crossover([5, 10, 15, 20], [2.0, 2.5, 2.9, 3.4], ar_x, ar_y) is None  # below early, not at the end
    assert crossover([4.5, 9, 13.5, 18], [3.5, 3.0, 2.9, 3.4], ar_x, ar_y) is None
    assert crossover([21, 25], [1.0, 1.0], ar_x, ar_y) is None  # past AR's last evaluation


def test_the_report_draws_curves_per_data_size_and_says_where_diffusion_crosses(tmp_path):
    from attnlab.reports.report import report_main

    sweep = _write_sweep(tmp_path)
    assert report_main([str(sweep), "--wandb", "disabled"]) == 0
    report = json.loads((sweep / "report" / "report.json").read_text())
    assert "learning_curves.png" in report["plots"]
    width, height = png_size(sweep / "report" / "learning_curves.png")
    assert width > 2 * 400 and height > 400  # two data sizes: two panels side by side, epochs over FLOPs
    text = "\n".join(report["markdown"]["learning"])
    assert "### train_tokens = 1,000" in text and "### train_tokens = 2,000" in text
    small, large = text.split("### train_tokens = 2,000")
    # Size 1k, best so far: MDLM 2.0 at every validation in both seeds (4.5, 9, 13.5, 18 epochs of 1e9
    # FLOPs); AR (3.0, 2.5, 2.5, 2.5) and (3.2, 2.7, 2.7, 2.7), mean (3.1, 2.6, 2.6, 2.6) at 5, 10, 15,
    # 20: at 9 AR is 3.1 - 0.5 * 4 / 5 = 2.7, so MDLM is below from 9e9 FLOPs on (4.5 comes before
    # AR's first validation: skipped). Bests 2.0 - 2.5 and 2.0 - 2.7: -0.6 with a t interval of
    # 12.706 * 0.1.
    assert ("- mdlm-1k against ar-1k: below from 9e+09 FLOPs on (epoch 9.0) (seed 0: 9e+09; seed 1: 9e+09); "
            "best difference -0.6000 [-1.8706, 0.6706].") in small
    # Bests with 95 % t intervals over the two seeds: AR 2.5 and 2.7 -> 2.6 ± 12.706 * 0.1.
    assert "| ar-1k | DecoderOnly | 2 | 20.0 | 2.6000 [1.3294, 3.8706] |" in small
    assert "- mdlm-2k against ar-2k: never below for good within the run (seed 0: never; seed 1: never)" in large
    assert "## Learning curves" in (sweep / "report" / "report.md").read_text()


def test_epochs_and_flops_of_a_validation_come_from_the_ledger_at_its_step(tmp_path):
    from attnlab.reports.curves import build_curves, facet_key
    from attnlab.reports.report import group_points
    from attnlab.reports.runs import collect_runs

    points = group_points(collect_runs(_write_sweep(tmp_path)))
    facet = facet_key(points)
    assert facet == TRAIN_TOKENS
    curves = {c.name: c for c in build_curves(points, facet)}
    mdlm = curves["mdlm-1k"]
    # Validated at steps 14, 29, 44, 59 (after 15, 30, 45, 60 steps of 0.3 epochs); the ledger was
    # logged at steps 4, 14, 24, ..., 54 and its total is at the last step, 59.
    assert mdlm.epochs == pytest.approx([4.5, 9.0, 13.5, 18.0])
    assert mdlm.flops == pytest.approx([e * FLOPS_PER_EPOCH for e in (4.5, 9.0, 13.5, 18.0)])
    assert mdlm.mean == pytest.approx([2.0, 2.0, 2.0, 2.0])  # the best so far: both seeds start at their best
    ar = curves["ar-1k"]
    assert ar.low == [3.0, 2.5, 2.5, 2.5] and ar.high == [3.2, 2.7, 2.7, 2.7]  # 2.8 and 3.2 come after 2.5
    assert mdlm.facet == 1000 and not mdlm.ar and curves["ar-1k"].ar


def test_a_facet_key_no_run_sweeps_is_one_error_naming_the_swept_keys(tmp_path):
    from attnlab.errors import AttnlabError
    from attnlab.reports.report import report_main

    sweep = _write_sweep(tmp_path)
    with pytest.raises(AttnlabError, match=f"--facet model.init_args.block_size: no run sweeps that key; swept keys: {TRAIN_TOKENS}"):
        report_main([str(sweep), "--wandb", "disabled", "--facet", "model.init_args.block_size"])


def test_a_run_started_from_another_network_begins_at_its_inherited_cost():
    """A converted run logs its own steps 0..n-1 with ledger totals that include what the network
    it started from had cost; the summary counts the inherited steps too. The FLOPs axis starts at
    the inherited FLOPs before its first step and ends at its own last step."""
    from types import SimpleNamespace

    from attnlab.reports.curves import ledger_at

    summary = {"steps": 500 + 100, "ledger": {"flops": 7.0, "epochs": 1.2, "unique_tokens": 1000,
                                              "inherited": {"steps": 500, "flops": 5.0, "tokens": 1000}}}
    logged = {"budget/flops": [(49, 6.0)], "budget/epochs": [(49, 1.1)]}
    record = SimpleNamespace(summary=summary, series=lambda key: logged.get(key, []),
                             ledger=lambda key: summary["ledger"].get(key))
    assert ledger_at(record, "flops") == [(-1, 5.0), (49, 6.0), (99, 7.0)]
    assert ledger_at(record, "epochs") == [(-1, 1.0), (49, 1.1), (99, 1.2)]  # epochs: tokens / unique tokens
