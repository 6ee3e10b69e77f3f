"""Which rows of a report differ significantly from the reference row, over seeds and test examples.

A row meets the reference on the seeds both ran (seed k with seed k) and, within a seed, on the
same test examples (example i with example i), from the examples.jsonl each `attnlab test` saves.
Seeds are the unit of replication: a row sharing two or more seeds with the reference is tested
by a hierarchical paired bootstrap (seeds, then examples within each seed: stats.hierarchical_bootstrap)
of the corpus metric: BLEU and chrF from sacreBLEU's per-sentence statistics, nll = summed nll /
summed tokens, bpb = summed bits / summed bytes, exact match = share of exact outputs. With one
shared seed there is no spread between seeds to see, and the examples of that seed are tested as
before: sacreBLEU's paired bootstrap (BLEU, chrF), a sign-flip permutation test (nll, bpb, exact
match). That example-level test is also run on the pooled (seed, example) pairs of every row, only
to say where it calls a difference significant that the bootstrap over seeds does not.
`adjust` applies Holm's correction over every comparison of one report.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.experiment.stats import ALPHA, hierarchical_bootstrap, holm, paired_permutation_p, sacrebleu_paired_p

PER_EXAMPLE = {"nll": "nll", "bpb": "bits", "exact_match": "exact"}
DENOMINATOR = {"nll": "tokens", "bpb": "bytes", "exact_match": None}  # None: per example
TESTS = {"seeds": "hierarchical bootstrap over seeds and examples",
         "sacrebleu": "sacreBLEU paired bootstrap, one seed", "permutation": "sign-flip permutation test, one seed"}


@dataclass
class Comparison:
    """One row against the reference in one column: the test its mark uses, its p, and the pooled
    example-level p. `p` and `pooled` are Holm-adjusted once `adjust` has seen the report's
    comparisons; until then a comparison is a family of its own (adjusted = raw)."""

    test: str  # a key of TESTS
    p_raw: float
    pooled_raw: float  # the example-level test over pooled (seed, example) pairs; p_raw itself with one seed
    p: float = field(init=False)
    pooled: float = field(init=False)

    def __post_init__(self):
        self.p, self.pooled = self.p_raw, self.pooled_raw

    @property
    def pooled_only(self) -> bool:
        """Significant on the pooled example-level test, not over seeds."""
        return self.test == "seeds" and self.pooled < ALPHA <= self.p


@dataclass
class ColumnTest:
    reference: str | None
    comparisons: dict[str, Comparison] = field(default_factory=dict)  # row -> its test (reference excluded)
    skipped: dict[str, str] = field(default_factory=dict)  # row -> why it was not tested

    @property
    def p_values(self) -> dict[str, float]:
        """row -> the p its mark uses (Holm-adjusted once `adjust` ran)."""
        return {name: c.p for name, c in self.comparisons.items()}


def adjust(tests) -> int:
    """Holm-adjust every comparison of `tests` (the ColumnTests of one report) as one family, the
    pooled p-values as another of the same size; the number of comparisons."""
    comparisons = [c for test in tests for c in test.comparisons.values()]
    for c, p, pooled in zip(comparisons, holm([c.p_raw for c in comparisons]), holm([c.pooled_raw for c in comparisons])):
        c.p, c.pooled = p, pooled
    return len(comparisons)


def _examples(point, evaluation: str | dict[str, str], seed) -> list[dict] | None:
    if isinstance(evaluation, dict):
        evaluation = evaluation[point.name]
    return next(r for r in point.records if r.seed == seed).examples(evaluation) or None


def _statistics(metric: str, examples: list[dict]):
    """Per-example sufficient statistics of `metric` (rows: examples), summed by `_score`."""
    import numpy as np

    if metric == "bleu":  # public API: a sentence's BLEU carries its n-gram counts and lengths
        from sacrebleu.metrics import BLEU

        bleu = BLEU(effective_order=True)  # changes no count; only silences the sentence-level warning
        scores = [bleu.sentence_score(e["hypothesis"], [e["reference"]]) for e in examples]
        return np.array([[s.sys_len, s.ref_len, *s.counts, *s.totals] for s in scores], dtype=np.float64)
    if metric == "chrf":
        from sacrebleu.metrics import CHRF

        from attnlab.compat import private_api as private

        chrf = CHRF()
        extract = private.get(chrf, "_extract_corpus_statistics")
        return np.array(extract([e["hypothesis"] for e in examples], [[e["reference"] for e in examples]]),
                        dtype=np.float64)
    denominator = DENOMINATOR[metric]
    return np.array([[float(e[PER_EXAMPLE[metric]]), float(e[denominator]) if denominator else 1.0]
                     for e in examples])


def _score(metric: str):
    """Summed statistics (rows) -> the corpus metric, as the evaluation logs it."""
    import numpy as np

    if metric == "bleu":
        from sacrebleu.metrics import BLEU

        def bleu(stats):  # sums of counts are whole numbers, exact in float64; BLEUScore wants ints
            return np.array([BLEU.compute_bleu(s[2:6], s[6:10], s[0], s[1], smooth_method="exp").score
                             for s in stats.astype(np.int64).tolist()])

        return bleu
    if metric == "chrf":
        from sacrebleu.metrics import CHRF

        from attnlab.compat import private_api as private

        compute = private.get(CHRF(), "_compute_score_from_stats")
        return lambda stats: np.array([compute(list(s)).score for s in stats])
    scale = 100.0 if metric == "exact_match" else 1.0
    return lambda stats: scale * stats[:, 0] / stats[:, 1]


def over_seeds(metric: str, mine: list[list[dict]], theirs: list[list[dict]]) -> tuple[float, float]:
    """(difference, p) of a row's examples against the reference's, one list per shared seed."""
    return hierarchical_bootstrap([_statistics(metric, m) for m in mine], [_statistics(metric, t) for t in theirs],
                                  _score(metric))


def _why_not(metric: str, mine: list[dict], theirs: list[dict]) -> str | None:
    if [(e["index"], e["reference"]) for e in mine] != [(e["index"], e["reference"]) for e in theirs]:
        return "different test examples"
    field_name = "hypothesis" if metric in ("bleu", "chrf") else PER_EXAMPLE[metric]
    if field_name not in mine[0] or field_name not in theirs[0]:
        return "no generations saved"
    if metric == "nll" and [e["tokens"] for e in mine] != [e["tokens"] for e in theirs]:
        return "other tokenization: compare bpb"
    return None


def test_column(points, evaluation: str | dict[str, str], metric: str, scored, reference: str | None) -> ColumnTest:
    """Test every row of `points` with a value (its name in `scored`) against the row named
    `reference`, on `metric` of `evaluation` (one name, or one per row); p-values raw until `adjust`."""
    if reference is None or reference not in scored:
        return ColumnTest(None)
    ref = next(p for p in points if p.name == reference)
    out = ColumnTest(reference)
    pooled: dict[str, tuple] = {}  # row -> (its pooled examples, the reference's, the seeds)
    over: dict[str, float] = {}  # row -> p over seeds (rows sharing two or more)
    for point in points:
        if point.name == reference or point.name not in scored:
            continue
        seeds = [s for s in point.seeds if s in set(ref.seeds)]
        if not seeds:
            out.skipped[point.name] = "no seed in common with the reference row"
            continue
        mine, theirs = [_examples(point, evaluation, s) for s in seeds], [_examples(ref, evaluation, s) for s in seeds]
        if not all(mine) or not all(theirs):
            out.skipped[point.name] = "no per-example values (examples.jsonl) for shared seeds"
            continue
        why = next((w for m, t in zip(mine, theirs) if (w := _why_not(metric, m, t))), None)
        if why:
            out.skipped[point.name] = why
            continue
        pooled[point.name] = (sum(mine, []), sum(theirs, []), tuple(seeds))
        if len(seeds) > 1:
            over[point.name] = over_seeds(metric, mine, theirs)[1]
    example_test = "sacrebleu" if metric in ("bleu", "chrf") else "permutation"
    example_p = _pooled_p(metric, pooled)
    for name in pooled:  # table order; with one shared seed the example-level test is the mark's
        p = example_p[name]
        out.comparisons[name] = Comparison("seeds", over[name], p) if name in over else Comparison(example_test, p, p)
    return out


def _pooled_p(metric: str, pooled: dict[str, tuple]) -> dict[str, float]:
    """row -> p of the example-level test over its pooled (seed, example) pairs against the reference's."""
    if metric not in ("bleu", "chrf"):
        field_name = PER_EXAMPLE[metric]
        return {name: paired_permutation_p([float(e[field_name]) for e in mine], [float(e[field_name]) for e in theirs])
                for name, (mine, theirs, _) in pooled.items()}
    # sacreBLEU tests many systems against one baseline: one call per set of shared seeds, so
    # seed k of every row meets seed k of the reference.
    out, by_seeds = {}, {}
    for name, (mine, theirs, seeds) in pooled.items():
        by_seeds.setdefault(seeds, (theirs, {}))[1][name] = [e["hypothesis"] for e in mine]
    for theirs, systems in by_seeds.values():
        out.update(sacrebleu_paired_p(metric, [e["reference"] for e in theirs], [e["hypothesis"] for e in theirs], systems))
    return out
