"""Statistics of a comparison: mean, spread and interval over seeds, and paired significance tests.

Libraries do the statistics: scipy's Student t quantiles for the intervals and its permutation
test for per-example likelihoods and exact match; sacreBLEU's own paired bootstrap resampling
for BLEU and chrF (the test MT papers report). Two systems are paired on the same test examples
of the same seeds: seed k of one with seed k of the other, example i with example i.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05
BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's default for --paired-bs
PERMUTATIONS = 9999
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
    permutation test on the per-example differences (scipy), statistic = their mean."""
    import numpy as np
    from scipy import stats

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if not np.any(d):
        return 1.0
    result = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=PERMUTATIONS,
                                    vectorized=True, alternative="two-sided", random_state=SEED)
    return float(result.pvalue)


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
