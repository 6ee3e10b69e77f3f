"""Statistics of a comparison: mean, spread and interval over seeds, and paired significance tests.

Seeds are the unit of replication: two rows are compared by a paired t-test on their per-seed
corpus metrics (seed k of one with seed k of the other, df = n - 1), with the mean difference's t
interval and, where it finds nothing, the smallest difference those seeds could have found
(`detectable_difference`). It marks equal systems at the rate alpha (tests/test_seed_significance.py
simulates them). A bootstrap over seeds and then examples, which this replaces, is not calibrated
at 2-5 seeds: it cannot see the spread of training runs it did not sample, and marked 17-43 % of
equal systems. Example-level tests (sacreBLEU's paired bootstrap for BLEU and chrF, a sign-flip
permutation test otherwise) remain for two single systems or two decodings of one checkpoint,
where the examples are what varies.

Libraries do the statistics where they have them: scipy's t-test, t and noncentral t
distributions; sacreBLEU's paired bootstrap. Holm's correction is here (scipy's
false_discovery_control is Benjamini-Hochberg), and so is the permutation test, written out
because scipy draws each pattern by sorting a random array, which dominated a report's time.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05
POWER = 0.8  # the power at which `detectable_difference` is stated
MIN_SEEDS = 3  # shared seeds a test over training runs needs (df = 2; with 2, t(0.975) is 12.7)
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
    permutation test on the per-example differences, statistic = their mean, |null| >= |observed|.

    Every sign pattern when there are at most PERMUTATIONS of them, else PERMUTATIONS random ones
    with p = (count + 1) / (PERMUTATIONS + 1), as scipy's permutation_test answers (the test
    checks the two agree). Written out because scipy draws each resample's pattern by sorting a
    random array, where one matrix of random signs does the same draws at once."""
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


@dataclass(frozen=True)
class SeedTest:
    """A paired t-test over training runs: n seeds, the mean of the per-seed differences a - b,
    its 95 % t interval and two-sided p (df = n - 1), and the spread (sample std) of the differences."""

    n: int
    difference: float
    low: float
    high: float
    p: float
    spread: float


def paired_t(a: list[float], b: list[float]) -> SeedTest:
    """Paired t-test of per-seed values a[k] against b[k] (k: the same seed); needs two or more.
    Differences that are all equal give p = 1 when they are 0 and p = 0 otherwise (no spread to
    weigh them against), as the t statistic's limit says."""
    import numpy as np
    from scipy import stats

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        raise ValueError("a paired t-test needs two or more seeds")
    mean, spread = float(d.mean()), float(d.std(ddof=1))
    if spread == 0.0:
        return SeedTest(len(d), mean, mean, mean, 1.0 if mean == 0.0 else 0.0, 0.0)
    result = stats.ttest_rel(a, b)
    interval = result.confidence_interval(1 - ALPHA)
    return SeedTest(len(d), mean, float(interval.low), float(interval.high), float(result.pvalue), spread)


def seed_test(a: list, b: list, score) -> tuple[float, float]:
    """(mean difference, two-sided p) of two systems over training runs: a paired t-test on their
    per-seed corpus metrics. `a[s]` and `b[s]` are the per-example sufficient statistics of each
    system on seed s (rows: test examples; columns summed into the corpus metric: nll and tokens,
    BLEU's n-gram counts, ...); `score` turns summed statistics (rows of an array) into the metric.
    The difference is the mean over seeds of score(a[s]) - score(b[s]), the table's difference of
    means. Public so that its calibration can be checked from outside (tests/test_seed_significance.py)."""
    import numpy as np

    def corpus(system) -> list[float]:
        return [float(score(np.asarray(x, dtype=np.float64).sum(0, keepdims=True))[0]) for x in system]

    result = paired_t(corpus(a), corpus(b))
    return result.difference, result.p


def detectable_difference(spread: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference that a two-sided paired t-test at level `alpha` over `n`
    seeds finds with probability `power`, when per-seed differences spread as `spread` (their std):
    the noncentral t's power solved for its effect. 0 when the differences do not spread."""
    import math

    from scipy import optimize, stats

    if spread == 0.0:
        return 0.0
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)

    def short_of(shift: float) -> float:  # power at this noncentrality, less the power asked for
        wrong_side = stats.nct.cdf(-critical, df, shift)  # ~0 for a positive shift; scipy may answer nan there
        return stats.nct.sf(critical, df, shift) + (wrong_side if math.isfinite(wrong_side) else 0.0) - power

    high = critical + 1.0  # at a shift of the critical value the power is about one half
    while short_of(high) < 0:
        high *= 2
    shift = optimize.brentq(short_of, 0.0, high, xtol=1e-10)
    return float(shift * spread / math.sqrt(n))


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
