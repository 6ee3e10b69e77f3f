"""Which rows of a report differ from their reference row, and by how much, with seeds as the unit.

Each row is tested against the row it names as its reference (the sweep's `reference:`; in a
facetted sweep the reference base's point of the same grid cell, so no test crosses cells), on the
seeds both ran, seed k with seed k, in each evaluation column:

- 3 or more shared seeds (stats.MIN_SEEDS): a paired t-test on the per-seed corpus metrics, the
  values the table averages; its mean difference with a 95 % t interval and, where it finds
  nothing, the smallest difference those seeds could have found with 80 % power. Mark `*`.
- 2 shared seeds: no test. With one degree of freedom t(0.975) is 12.7, so only a difference 12.7
  standard errors from zero could show; the words say so rather than mark anything.
- 1 shared seed: two single systems. An example-level test on that seed's test examples
  (sacreBLEU's paired bootstrap for BLEU and chrF, a sign-flip permutation test otherwise), under
  its own mark `†`: it says these two trained models differ on these examples, not that another
  training run would keep the order.

A tuned row is never tested against an untuned one (the difference would be the tuning's). Holm's
correction runs over the report's hypotheses, one per row, evaluation and metric family (nll and bpb
measure one quantity: one hypothesis, whose p is the larger of the two), the seed-level and the
example-level tests each a family of its own. A seed whose value is missing or not finite (a run
that diverged) is left out of the pairs, never allowed to turn a p into nan.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

from attnlab.reports.stats import (
    ALPHA,
    MIN_SEEDS,
    detectable_difference,
    holm,
    paired_permutation_p,
    paired_t,
    sacrebleu_paired_p,
)

PER_EXAMPLE = {"nll": "nll", "bpb": "bits", "exact_match": "exact"}
DENOMINATOR = {"nll": "tokens", "bpb": "bytes", "exact_match": None}  # None: per example
FAMILY = {"nll": "likelihood", "bpb": "likelihood", "bleu": "bleu", "chrf": "chrf", "exact_match": "exact_match"}
MARKS = {"seeds": "*", "examples": "†"}
EXAMPLE_TESTS = {"bleu": "sacreBLEU's paired bootstrap", "chrf": "sacreBLEU's paired bootstrap"}
PERMUTATION = "a sign-flip permutation test"


@dataclass
class Row:
    """What the tests need of a table row: its seeds, the row it is tested against (its own name:
    a reference; None: not tested) and whether a tune stage chose its values."""

    name: str
    seeds: list
    reference: str | None
    tuned: bool | None = None


@dataclass
class Comparison:
    """One row against its reference in one column. test: "seeds" (paired t over seeds), "examples"
    (one shared seed's test examples) or "none" (`why`). difference: the row's mean over the shared
    seeds minus the reference's; low, high: its 95 % t interval; detectable: the smallest difference
    the seeds could have found (80 % power, at the level Holm holds the first hypothesis to); p:
    Holm-adjusted once `adjust` ran; detectable is None where the seeds' differences do not spread
    (nothing to size an effect against)."""

    test: str
    shared: int
    difference: float | None = None
    low: float | None = None
    high: float | None = None
    p_raw: float | None = None
    p: float | None = None
    spread: float | None = None
    detectable: float | None = None
    why: str | None = None

    @property
    def significant(self) -> bool:
        return self.p is not None and self.p < ALPHA

    @property
    def mark(self) -> str:
        return MARKS[self.test] if self.significant else ""

    def as_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, entry: dict) -> Comparison:
        return cls(**{k: entry.get(k) for k in cls.__dataclass_fields__})


# An example-level test of one row against its reference on one shared seed: (metric, row, reference,
# seed) -> (p, the test's name), or why it cannot run.
ExampleTest = Callable[[str, str, str, object], "tuple[float, str] | str"]


def compare(rows: list[Row], values: dict[str, list], metric: str, example_test: ExampleTest | None = None
            ) -> dict[str, Comparison]:
    """row -> its comparison with its reference in one column whose per-seed values (aligned with
    each row's seeds, None where a seed has none) are `values[row]`; raw p until `adjust`."""
    by_name = {row.name: row for row in rows}
    known = {name: {seed: v for seed, v in zip(by_name[name].seeds, per_seed) if _finite(v)}
             for name, per_seed in values.items() if name in by_name}
    out = {}
    for row in rows:
        reference = by_name.get(row.reference) if row.reference not in (None, row.name) else None
        if reference is None or not known.get(row.name):
            continue
        mine, theirs = known[row.name], known.get(reference.name, {})
        if not theirs:
            out[row.name] = Comparison("none", 0, why=f"the reference {reference.name} has no value here")
            continue
        shared = [s for s in row.seeds if s in mine and s in theirs]
        out[row.name] = _compare(row, reference, [mine[s] for s in shared], [theirs[s] for s in shared], shared,
                                 metric, example_test)
    return out


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _compare(row: Row, reference: Row, mine: list, theirs: list, shared: list, metric: str,
             example_test: ExampleTest | None) -> Comparison:
    n = len(shared)
    difference = sum(mine) / n - sum(theirs) / n if n else None
    if None not in (row.tuned, reference.tuned) and row.tuned != reference.tuned:
        return Comparison("none", n, difference, why="tuned against untuned: the difference would include the tuning")
    if n >= MIN_SEEDS:
        t = paired_t(mine, theirs)
        return Comparison("seeds", n, t.difference, t.low, t.high, t.p, spread=t.spread)
    if n == 0:
        return Comparison("none", 0, why="no seed in common")
    if n == 2:
        return Comparison("none", 2, difference, why=f"2 shared seeds; a test over training runs needs {MIN_SEEDS}")
    found = example_test(metric, row.name, reference.name, shared[0]) if example_test is not None else None
    if not isinstance(found, tuple):
        return Comparison("none", 1, difference, why=f"one shared seed; {found or 'no per-example values to test it on'}")
    p, test = found
    return Comparison("examples", 1, difference, p_raw=p, why=test)


def adjust(columns: list[tuple[str, str, dict[str, Comparison]]]) -> dict[str, int]:
    """Holm-adjust every comparison of a report (`columns`: (evaluation, metric, row -> Comparison) per
    tested column), the seed-level and the example-level tests as two families, each hypothesis one
    row, evaluation and metric family; a non-significant seed-level comparison gets its detectable
    difference at the level Holm holds the first hypothesis to (alpha / hypotheses). Returns the
    hypotheses per test."""
    counts = {}
    for test in MARKS:
        hypotheses: dict[tuple, list[Comparison]] = {}
        for evaluation, metric, comparisons in columns:
            for row, c in comparisons.items():
                if c.test == test:
                    hypotheses.setdefault((row, evaluation, FAMILY[metric]), []).append(c)
        keys = list(hypotheses)
        for key, p in zip(keys, holm([max(c.p_raw for c in hypotheses[k]) for k in keys])):
            for c in hypotheses[key]:
                c.p = p
                if test == "seeds" and not c.significant and c.spread:
                    c.detectable = detectable_difference(c.spread, c.shared, ALPHA / len(keys))
        counts[test] = len(keys)
    return counts


# ---- a report's rows (report.json) ----------------------------------------------------------------

CELL = ("values", "mean", "std", "n", "ci95")  # what a numeric cell holds besides its comparison


def fallback_column(column, columns: list):
    """The column a reference row without `column` is tested in instead (its `against` evaluation's
    column of the same metric), or None."""
    if column.against is None:
        return None
    return next((c for c in columns if c.tested and c.evaluation == column.against and c.metric == column.metric), None)


def compare_columns(rows: list[dict], columns, example_test=None) -> list[tuple[str, str, dict]]:
    """Each tested column's comparisons (`columns`: tables.ColumnMeta), every row of report.json's
    `rows` against its reference on the per-seed values, put into the rows' cells (raw p until
    `adjust`, JSON once `store_comparisons` ran): (evaluation, metric, row -> Comparison) per column.
    `example_test(evaluation, metric, row, reference, seed, reference_evaluation=)`: the one-shared-seed
    test (the reference's examples from `reference_evaluation`), or None."""
    table = [Row(r["run"], r["seeds"], r.get("reference"), r.get("tuned")) for r in rows]
    out = []
    for column in (c for c in columns if c.tested):
        values = {r["run"]: r[column.header]["values"] for r in rows if isinstance(r.get(column.header), dict)}
        holders = {name for name, per_seed in values.items() if any(v is not None for v in per_seed)}
        stand_in = fallback_column(column, columns)
        if stand_in is not None:  # a reference without this decoding is tested in its `against` evaluation
            values.update({r["run"]: r[stand_in.header]["values"] for r in rows
                           if r["run"] not in holders and isinstance(r.get(stand_in.header), dict)})

        def test(metric, row, ref, seed, e=column.evaluation):
            return example_test(e, metric, row, ref, seed,
                                reference_evaluation=e if ref in holders else column.against)

        comparisons = {name: c for name, c in compare(table, values, column.metric,
                                                      test if example_test else None).items() if name in holders}
        for row in rows:
            if isinstance(row.get(column.header), dict):  # a page's earlier comparison fields go
                row[column.header] = {k: v for k, v in row[column.header].items() if k in CELL}
                if row["run"] in comparisons:
                    row[column.header]["comparison"] = comparisons[row["run"]]
        out.append((column.evaluation, column.metric, comparisons))
    return out


def store_comparisons(rows: list[dict]) -> None:
    """The comparisons, adjusted, as JSON in their cells."""
    for row in rows:
        for entry in row.values():
            if isinstance(entry, dict) and isinstance(entry.get("comparison"), Comparison):
                entry.update(entry.pop("comparison").as_json())


# ---- example-level tests on one seed's test examples ------------------------------------------------

def example_p(metric: str, mine: list[dict], theirs: list[dict]) -> tuple[float, str] | str:
    """(p, the test) of one system's test examples against another's (the same examples, in order),
    or why they cannot be tested."""
    if [(e["index"], e["reference"]) for e in mine] != [(e["index"], e["reference"]) for e in theirs]:
        return "different test examples"
    field_name = "hypothesis" if metric in ("bleu", "chrf") else PER_EXAMPLE[metric]
    if field_name not in mine[0] or field_name not in theirs[0]:
        return "no generations saved"
    if metric == "nll" and [e["tokens"] for e in mine] != [e["tokens"] for e in theirs]:
        return "other tokenization: compare bpb"
    if metric in ("bleu", "chrf"):
        p = sacrebleu_paired_p(metric, [e["reference"] for e in theirs], [e["hypothesis"] for e in theirs],
                               {"row": [e["hypothesis"] for e in mine]})["row"]
        return p, EXAMPLE_TESTS[metric]
    return paired_permutation_p([float(e[field_name]) for e in mine], [float(e[field_name]) for e in theirs]), PERMUTATION


def statistics(metric: str, examples: list[dict]):
    """Per-example sufficient statistics of `metric` (rows: examples), summed by `score`: what
    stats.seed_test takes to score each seed's corpus metric from its examples."""
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


def score(metric: str):
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
