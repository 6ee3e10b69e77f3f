"""Statistics of a comparison: mean, spread and interval over seeds, and paired significance tests.

Libraries do the statistics where they have them: scipy's Student t quantiles for the intervals
and its permutation test for per-example likelihoods and exact match; sacreBLEU's own paired
bootstrap resampling for BLEU and chrF (the test MT papers report). Neither has a bootstrap
over seeds and examples, nor Holm's correction (scipy.stats.false_discovery_control is
Benjamini-Hochberg), so those two are here, short. Two systems are paired on the same test
examples of the same seeds: seed k of one with seed k of the other, example i with example i.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05
BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's default for --paired-bs
PERMUTATIONS = 9999
# Resamples of the bootstrap over seeds: its smallest p, 2 / 10,000, stays under ALPHA after Holm
# multiplies it by up to 250 comparisons.
HIERARCHICAL_SAMPLES = 9999
_CHUNK = 512  # example resamples drawn at once: 512 x examples counts in memory
SEED = 12345  # sacreBLEU's default seed (SACREBLEU_SEED); the permutation test uses it too


@dataclass(frozen=True)
class Summary:
    """mean, sample std (0 for one seed), n and a 95 % t interval of the mean (None for one seed)."""

    mean: float
    std: float
    n: int
    low: float | None
    high: float | None


def summarize(values: list[float]) -> Summary | None:
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Summary(mean, 0.0, 1, None, None)
    from scipy import stats

    std = statistics.stdev(values)
    half = float(stats.t.ppf(1 - ALPHA / 2, len(values) - 1)) * std / math.sqrt(len(values))
    return Summary(mean, std, len(values), mean - half, mean + half)


def paired_permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value that paired values a and b come from the same system: a sign-flip
    permutation test on the per-example differences, statistic = their mean, |null| >= |observed|.

    Every sign pattern when there are at most PERMUTATIONS of them, else PERMUTATIONS random ones
    with p = (count + 1) / (PERMUTATIONS + 1), as scipy's permutation_test answers (the test
    checks the two agree). Written out because scipy draws each resample's pattern by sorting a
    random array: 2 s per column of 3,000 pairs, most of the main job's report; a matrix of
    random signs takes a fraction of that."""
    import numpy as np

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if not np.any(d):
        return 1.0
    n = len(d)
    observed = abs(d.mean())
    floor = observed - 1e-12 * max(1.0, observed)  # ties with the observed value count as extreme
    if 2**n <= PERMUTATIONS:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2.0 - 1.0
        return float(np.mean(np.abs(signs @ d) / n >= floor))
    rng, count = np.random.default_rng(SEED), 0
    for start in range(0, PERMUTATIONS, 1000):  # in slices: 9,999 x n signs at once would be large
        signs = rng.integers(0, 2, size=(min(1000, PERMUTATIONS - start), n)) * 2.0 - 1.0
        count += int(np.count_nonzero(np.abs(signs @ d) / n >= floor))
    return min(1.0, (count + 1) / (PERMUTATIONS + 1))


def sacrebleu_paired_p(metric: str, references: list[str], baseline: list[str],
                       systems: dict[str, list[str]]) -> dict[str, float]:
    """{system: p} from sacreBLEU's paired bootstrap resampling of `metric` (bleu: BLEU with its 13a
    tokenizer; chrf: chrF with character n-grams only, the metrics attnlab logs) against `baseline`.

    A system with the baseline's very outputs gets p = 1: there is no difference at all, while
    sacreBLEU's bootstrap counts resampled differences strictly above the observed 0 and would
    answer 1 / 1001."""
    import os

    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    p = {name: 1.0 for name, outputs in systems.items() if list(outputs) == list(baseline)}
    differ = {name: outputs for name, outputs in systems.items() if name not in p}
    if differ:
        os.environ.setdefault("SACREBLEU_SEED", str(SEED))
        scorer = {"bleu": BLEU, "chrf": CHRF}[metric]()
        named = [("baseline", baseline), *differ.items()]
        test = PairedTest(named, {metric: scorer}, [references], test_type="bs", n_samples=BOOTSTRAP_SAMPLES)
        _, scores = test()
        (column,) = [k for k in scores if k != "System"]
        p.update({name: float(scores[column][i].p_value) for i, name in enumerate(differ, start=1)})
    return {name: p[name] for name in systems}


def hierarchical_bootstrap(a: list, b: list, score, samples: int = HIERARCHICAL_SAMPLES) -> tuple[float, float]:
    """(observed difference, two-sided p) of a paired bootstrap over seeds, then examples.

    `a[s]` and `b[s]` are the per-example sufficient statistics of two systems on seed s (one row
    per test example, the same examples in the same order for both; columns summed into the
    corpus metric: nll and tokens, BLEU's n-gram counts, ...); `score` turns summed statistics
    (rows of an array) into the corpus metric. The statistic is the mean over seeds of
    score(a) - score(b): the difference of the table's means over seeds. Each resample draws as
    many seeds as there are, with replacement (seed k of a with seed k of b), then within each
    drawn seed as many examples as it has, with replacement and the same ones for both systems;
    so the spread between seeds (training runs) counts, not only that between test examples.

    p is twice the smaller share of resampled differences at or beyond 0 (each share with the
    +1 of a resampling p-value, ties counted on both sides, at most 1): p < alpha exactly when 0
    lies outside the (1 - alpha) percentile interval of the difference. The shifted-null
    alternative assumes the spread of the difference does not depend on its size, which a
    distribution over 2 or 3 seeds does not show. Identical statistics give p = 1."""
    import numpy as np

    a = [np.asarray(x, dtype=np.float64) for x in a]
    b = [np.asarray(y, dtype=np.float64) for y in b]
    observed = float(np.mean([score(x.sum(0, keepdims=True))[0] - score(y.sum(0, keepdims=True))[0]
                              for x, y in zip(a, b)]))
    if all(np.array_equal(x, y) for x, y in zip(a, b)):
        return observed, 1.0
    rng = np.random.default_rng(SEED)
    drawn = rng.integers(len(a), size=(samples, len(a)))  # the seeds of each resample
    total = np.zeros(samples)
    for seed, (x, y) in enumerate(zip(a, b)):
        n = len(x)
        resamples = np.nonzero(drawn == seed)[0]  # once per time a resample drew this seed
        for start in range(0, len(resamples), _CHUNK):
            rows = resamples[start:start + _CHUNK]
            picks = rng.integers(n, size=(len(rows), n)) + n * np.arange(len(rows))[:, None]
            counts = np.bincount(picks.ravel(), minlength=len(rows) * n).reshape(len(rows), n).astype(np.float64)
            np.add.at(total, rows, score(counts @ x) - score(counts @ y))
    difference = total / len(a)
    tails = min(int(np.sum(difference <= 0)), int(np.sum(difference >= 0)))
    return observed, min(1.0, 2 * (tails + 1) / (samples + 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment, in the given order: the i-th smallest p (from 0) times the
    m - i hypotheses left, made non-decreasing along that order, at most 1. It holds the chance
    of any false mark among the m comparisons at alpha without assuming them independent."""
    m, running = len(p_values), 0.0
    adjusted = [0.0] * m
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
