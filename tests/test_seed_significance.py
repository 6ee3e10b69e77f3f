"""Significance over seeds: the hierarchical paired bootstrap (seeds, then examples), Holm's
correction, and the report's words on them, on constructed per-example values (no training)."""
from __future__ import annotations

import math
import random

import pytest

from attnlab.experiment import significance
from attnlab.experiment.report import Column, Point, significance_text
from attnlab.experiment.runs import RunRecord
from attnlab.experiment.stats import holm, paired_permutation_p

N = 60  # test examples per seed


def _examples(nll: list[float], hypotheses: list[str] | None = None) -> list[dict]:
    """examples.jsonl records as `attnlab test` writes them (nll in nats over 10 target tokens)."""
    return [{"index": i, "reference": f"ref {i}", "nll": v, "tokens": 10, **({"hypothesis": hypotheses[i]} if hypotheses else {})}
            for i, v in enumerate(nll)]


def _noisy(mean: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean + rng.gauss(0, 1) for _ in range(N)]


def _point(name: str, per_seed: list[list[dict]]) -> Point:
    """A report row whose runs hold these examples (seed k: per_seed[k]) and their corpus test nll."""
    records = [RunRecord(name, None, "f", [], seed=seed, evaluations={"test": {
        "test/nll": sum(e["nll"] for e in examples) / sum(e["tokens"] for e in examples)}}, _examples={"test": examples})
        for seed, examples in enumerate(per_seed)]
    return Point(name, records)


def test_identical_systems_give_p_one_and_clearly_different_ones_a_small_p():
    a = [_examples(_noisy(20.0, seed)) for seed in range(3)]
    same = significance.over_seeds("nll", a, [list(examples) for examples in a])
    assert same == (0.0, 1.0)
    near = significance.over_seeds("nll", a, [_examples([v + 0.001 * (i % 3 - 1) for i, v in enumerate(_noisy(20.0, s))])
                                              for s in range(3)])
    assert near[1] > 0.9  # differences of a thousandth of a nat, both signs: nothing to see
    worse = [_examples([v + 3.0 for v in _noisy(20.0, seed + 10)]) for seed in range(3)]
    difference, p = significance.over_seeds("nll", a, worse)
    assert difference == pytest.approx(sum(
        (sum(e["nll"] for e in x) - sum(e["nll"] for e in y)) / (10 * N) for x, y in zip(a, worse)) / 3)
    assert difference < 0 and p < 0.01


def _sign_change() -> tuple[Point, Point]:
    """Seed 0: a far better on every example; seed 1: b better, by less; seed 2: about a tie."""
    a = [_examples(_noisy(20.0, seed)) for seed in range(3)]
    rng = random.Random(7)
    b = [_examples([v + shift + rng.gauss(0, 0.5) for v in _noisy(20.0, seed)]) for seed, shift in enumerate((30.0, -10.0, 2.0))]
    return _point("a", a), _point("b", b)


def test_a_difference_that_changes_sign_between_seeds_is_significant_only_when_examples_are_pooled():
    a, b = _sign_change()
    pooled = paired_permutation_p([e["nll"] for r in b.records for e in r.examples("test")],
                                  [e["nll"] for r in a.records for e in r.examples("test")])
    assert pooled < 0.01  # (seed, example) pairs taken as exchangeable: 180 pairs, b worse on 120
    test = significance.test_column([a, b], "test", "nll", ["a", "b"], reference="a")
    comparison = test.comparisons["b"]
    assert comparison.test == "seeds" and comparison.pooled_raw == pytest.approx(pooled)
    assert comparison.p_raw > 0.3  # over seeds: 2 of 3 seeds favour a, one b
    assert significance.adjust([test]) == 1 and comparison.pooled_only
    column = Column("test nll", lambda r: r.evaluations["test"]["test/nll"], numeric=True, evaluation="test", metric="nll")
    column.tests = test
    words = "\n".join(significance_text([a, b], [column], comparisons=1))
    assert "Bold: the reference row, a, which every other row is tested against (the first row" in words
    assert "Holm-adjusted over the report's 1 comparison " in words and "hierarchical paired bootstrap" in words
    assert "no row significantly different; not significantly different: b (p = " in words
    assert f"significant on the pooled example-level test, not over seeds: b (pooled p = {comparison.pooled:.3g})" in words


def test_holm_equals_a_hand_computation():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.2]) == pytest.approx([0.5, 0.4]) and holm([0.6, 0.7]) == [1.0, 1.0] and holm([]) == []


def test_adjust_holms_every_comparison_of_a_report_together():
    """Two columns, two rows each tested: one family of four p-values, the pooled ones another."""
    a, b = _sign_change()
    c = _point("c", [_examples([v + 3.0 for v in _noisy(20.0, seed + 10)]) for seed in range(3)])
    for point in (a, b, c):
        for record in point.records:
            for e in record.examples("test"):
                e["bits"], e["bytes"] = e["nll"] / math.log(2), 7
    tests = [significance.test_column([a, b, c], "test", metric, ["a", "b", "c"], reference="a") for metric in ("nll", "bpb")]
    comparisons = [c for t in tests for c in t.comparisons.values()]
    raw = [c.p_raw for c in comparisons]
    assert significance.adjust(tests) == 4
    assert [c.p for c in comparisons] == pytest.approx(holm(raw))
    assert [c.pooled for c in comparisons] == pytest.approx(holm([c.pooled_raw for c in comparisons]))


SENTENCES = [f"Der {a} Hund sieht {b} Katze." for a in ("kleine", "alte", "müde", "große", "junge")
             for b in ("die", "keine", "eine", "jede")]


def _corrupt(share: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [s.replace("Hund", "Hunde").replace("sieht", "sah") if rng.random() < share else s for s in SENTENCES]


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_bleu_and_chrf_over_seeds_are_sacrebleus_corpus_scores(metric):
    """The difference at the full sample is the mean over seeds of sacreBLEU's own corpus-score
    differences (an independent reference); identical outputs give p = 1, far worse ones a small p."""
    import sacrebleu

    corpus = {"bleu": sacrebleu.corpus_bleu, "chrf": sacrebleu.corpus_chrf}[metric]
    good = [_corrupt(0.1, seed) for seed in range(3)]
    bad = [_corrupt(0.9, seed + 10) for seed in range(3)]

    def examples(hypotheses):
        return [{"index": i, "reference": r, "hypothesis": h} for i, (r, h) in enumerate(zip(SENTENCES, hypotheses))]

    mine, theirs = [examples(h) for h in good], [examples(h) for h in bad]
    difference, p = significance.over_seeds(metric, mine, theirs)
    expected = sum(corpus(g, [SENTENCES]).score - corpus(b, [SENTENCES]).score for g, b in zip(good, bad)) / 3
    assert difference == pytest.approx(expected, abs=1e-9) and difference > 0
    assert p < 0.01
    assert significance.over_seeds(metric, mine, [examples(h) for h in good]) == (0.0, 1.0)
