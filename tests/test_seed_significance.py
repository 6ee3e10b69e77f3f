"""Significance over seeds: the training run is the unit of every `*`. The public test
(stats.seed_test) is calibrated, checked by simulating equal systems whose training runs each land
somewhere of their own; it has the power it claims (stats.detectable_difference against a
simulation); its corpus metrics are sacreBLEU's; Holm's correction counts one hypothesis per row and
metric family; and the words say what each comparison found (no training here)."""
from __future__ import annotations

import numpy as np
import pytest

from attnlab.reports import significance
from attnlab.reports.significance import Comparison, Row, adjust, compare
from attnlab.reports.stats import ALPHA, detectable_difference, holm, seed_test
from attnlab.reports.tables import ColumnMeta, describe

EXAMPLES, TOKENS = 120, 10  # test examples per run, target tokens per example
RUN_SPREAD, EXAMPLE_SPREAD = 0.05, 1.0  # nats per token: between training runs, between examples


def _run(rng, offset: float) -> np.ndarray:
    """One training run's per-example statistics (summed nll, tokens): the corpus nll of a run is its
    system's level, plus where this run landed (`offset`), plus the test examples' own noise."""
    nll = TOKENS * (3.0 + offset + rng.normal(0.0, EXAMPLE_SPREAD / np.sqrt(TOKENS), EXAMPLES))
    return np.column_stack([nll, np.full(EXAMPLES, TOKENS)])


def _system(rng, seeds: int, effect: float = 0.0) -> list[np.ndarray]:
    return [_run(rng, effect + rng.normal(0.0, RUN_SPREAD)) for _ in range(seeds)]


SCORE = significance.score("nll")


def _marked(seeds: int, effect: float, comparisons: int = 1000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([seed_test(_system(rng, seeds, effect), _system(rng, seeds), SCORE)[1] < ALPHA
                          for _ in range(comparisons)]))


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_equal_systems_are_marked_at_the_rate_alpha_whatever_the_number_of_seeds(seeds):
    """1,000 comparisons of two equal systems (each of its runs with its own offset, as training runs
    land): the test marks about 5 % of them, not the 17-43 % a bootstrap over 2-3 seeds marked."""
    assert 0.02 <= _marked(seeds, effect=0.0) <= 0.08


def test_a_stated_effect_is_found_with_the_power_the_detectable_difference_promises():
    """At 5 seeds, an effect of twice the spread of per-seed differences is found at least 80 % of the
    time; and at exactly `detectable_difference` of that spread, 80 % of the time (within the
    simulation's error)."""
    spread = np.sqrt(2 * (RUN_SPREAD**2 + EXAMPLE_SPREAD**2 / (TOKENS * EXAMPLES)))  # of a difference of two runs
    assert _marked(5, effect=2 * spread, seed=1) >= 0.8
    assert _marked(5, effect=detectable_difference(spread, 5), comparisons=2000, seed=2) == pytest.approx(0.8, abs=0.035)


def test_detectable_difference_grows_with_fewer_seeds_and_a_stricter_level():
    assert detectable_difference(1.0, 5) == pytest.approx(1.682, abs=1e-3)  # a noncentral t's 80 % power point
    assert detectable_difference(1.0, 10) < detectable_difference(1.0, 5) < detectable_difference(1.0, 3)
    assert detectable_difference(1.0, 3, alpha=0.005) > detectable_difference(1.0, 3)
    assert detectable_difference(2.0, 5) == pytest.approx(2 * detectable_difference(1.0, 5))
    assert detectable_difference(0.0, 5) == 0.0


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_seed_test_of_bleu_and_chrf_is_a_t_test_on_sacrebleus_corpus_scores(metric):
    """From per-sentence statistics, each seed's corpus score is sacreBLEU's own (an independent
    reference), and the test is scipy's paired t on those."""
    import random

    import sacrebleu
    from scipy import stats

    references = [f"Der {a} Hund sieht {b} Katze." for a in ("kleine", "alte", "müde", "große") for b in ("die", "eine")]

    def outputs(share: float, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [r.replace("Hund", "Hunde") if rng.random() < share else r for r in references]

    corpus = {"bleu": sacrebleu.corpus_bleu, "chrf": sacrebleu.corpus_chrf}[metric]
    good, bad = [outputs(0.2, s) for s in range(4)], [outputs(0.7, s + 10) for s in range(4)]

    def per_example(hypotheses):
        return significance.statistics(metric, [{"hypothesis": h, "reference": r} for h, r in zip(hypotheses, references)])

    difference, p = seed_test([per_example(h) for h in good], [per_example(h) for h in bad], significance.score(metric))
    a = [corpus(h, [references]).score for h in good]
    b = [corpus(h, [references]).score for h in bad]
    assert difference == pytest.approx(np.mean(a) - np.mean(b), abs=1e-9)
    assert p == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)


def test_holm_equals_a_hand_computation():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.2]) == pytest.approx([0.5, 0.4]) and holm([0.6, 0.7]) == [1.0, 1.0] and holm([]) == []


def _rows() -> list[Row]:
    return [Row("ref", [0, 1, 2, 3], "ref"), Row("a", [0, 1, 2], "ref"), Row("b", [1, 2], "ref"), Row("c", [3], "ref"),
            Row("tuned", [0, 1, 2], "ref", tuned=True)]


def test_a_row_is_tested_over_its_shared_seeds_only_from_three_on():
    """Three shared seeds: a paired t-test; two: none, said; one: the example-level test (here a
    stand-in); a tuned row against an untuned reference: none, said."""
    rows = _rows()
    rows[0].tuned = False
    values = {"ref": [1.0, 2.0, 3.0, 4.0], "a": [1.5, 2.4, 3.7], "b": [2.5, 3.5], "c": [9.0], "tuned": [1.0, 2.0, 3.0]}
    seen = []

    def example_test(metric, row, reference, seed):
        seen.append((metric, row, reference, seed))
        return 0.01, "a stand-in test"

    out = compare(rows, values, "nll", example_test)
    assert set(out) == {"a", "b", "c", "tuned"}  # the reference is not compared with itself
    assert out["a"].test == "seeds" and out["a"].shared == 3
    assert out["a"].difference == pytest.approx(np.mean([0.5, 0.4, 0.7]))
    assert out["b"].test == "none" and "2 shared seeds" in out["b"].why and out["b"].difference == pytest.approx(0.5)
    assert out["c"].test == "examples" and out["c"].p_raw == 0.01 and seen == [("nll", "c", "ref", 3)]
    assert out["tuned"].test == "none" and out["tuned"].why.startswith("tuned against untuned")


def test_nll_and_bpb_are_one_hypothesis_and_examples_a_family_of_their_own():
    """Two rows in nll, bpb and BLEU: 4 hypotheses over seeds (not 6); the one example-level test is
    a family of one; the detectable difference is given where nothing was found."""
    def seeds(p: float) -> Comparison:
        return Comparison("seeds", 3, 0.1, 0.0, 0.2, p_raw=p, spread=0.05)

    nll = {"a": seeds(0.01), "b": seeds(0.2)}
    bpb = {"a": seeds(0.012), "b": seeds(0.3)}
    bleu = {"a": seeds(0.04), "b": seeds(0.001), "c": Comparison("examples", 1, 2.0, p_raw=0.02, why="x")}
    counts = adjust([("test", "nll", nll), ("test", "bpb", bpb), ("test", "bleu", bleu)])
    assert counts == {"seeds": 4, "examples": 1}
    # hypotheses: a/likelihood 0.012, b/likelihood 0.3, a/bleu 0.04, b/bleu 0.001 -> Holm
    expected = dict(zip(["al", "bl", "ab", "bb"], holm([0.012, 0.3, 0.04, 0.001])))
    assert nll["a"].p == bpb["a"].p == pytest.approx(expected["al"]) and nll["b"].p == bpb["b"].p == pytest.approx(expected["bl"])
    assert bleu["a"].p == pytest.approx(expected["ab"]) and bleu["b"].p == pytest.approx(expected["bb"])
    assert bleu["c"].p == 0.02 and bleu["c"].mark == "†"
    assert bleu["b"].mark == "*" and bleu["b"].detectable is None
    assert not nll["b"].significant and nll["b"].detectable == pytest.approx(detectable_difference(0.05, 3, ALPHA / 4))
    # another evaluation of the same metric is another hypothesis
    again = {"a": seeds(0.01)}
    assert adjust([("test", "nll", {"a": seeds(0.01)}), ("len2x", "nll", again)])["seeds"] == 2


def test_a_seed_without_a_finite_value_is_left_out_and_a_reference_without_values_says_so():
    """A diverged run (nan) is dropped from the pairs instead of turning every p into nan; a reference
    with no value in the column gives its rows a line saying so, not a crash."""
    rows = [Row("ref", [0, 1, 2, 3], "ref"), Row("a", [0, 1, 2, 3], "ref"), Row("b", [0, 1, 2], "ref")]
    values = {"ref": [1.0, 2.0, 3.0, 4.0], "a": [1.5, 2.4, float("nan"), 4.6], "b": [None, None, None]}
    out = compare(rows, values, "nll")
    assert out["a"].test == "seeds" and out["a"].shared == 3 and np.isfinite(out["a"].p_raw)
    assert out["a"].difference == pytest.approx(np.mean([0.5, 0.4, 0.6]))
    assert "b" not in out  # nothing to compare
    missing = compare(rows, {"ref": [None] * 4, "a": [1.0, 2.0, 3.0, 4.0]}, "nll")
    assert missing["a"].test == "none" and missing["a"].why == "the reference ref has no value here"


def test_the_words_give_the_difference_its_interval_p_and_what_the_seeds_could_detect():
    column = ColumnMeta("test nll (best)", "likelihood", True, "nll", "test")
    found = Comparison("seeds", 3, -0.0451, -0.0856, -0.0046, p_raw=0.04, p=0.163, spread=0.0163, detectable=0.1509)
    assert describe(column, "encoder_decoder", found) == (
        "encoder_decoder −0.0451 [−0.0856, −0.0046] (p = 0.163; 3 seeds detect ≥ 0.1509)")
    untested = Comparison("none", 2, 0.2, why="2 shared seeds; a test over training runs needs 3")
    assert describe(column, "b", untested) == "b +0.2000 (2 shared seeds; a test over training runs needs 3)"
