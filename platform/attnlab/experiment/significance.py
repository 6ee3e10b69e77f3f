"""Which rows of a report differ significantly from a column's best row, on the same test examples.

The pairs are (seed, example): seed k of a row with seed k of the best row, example i with
example i, from the examples.jsonl each `attnlab test` saves; only seeds that both rows ran
are used. BLEU and chrF go to sacreBLEU's paired bootstrap resampling over the pooled
hypotheses; nll (when both rows count the same target tokens per example), bpb (same reference
bytes) and exact match go to a sign-flip permutation test on the per-example differences,
whose mean is proportional to the difference of the two corpus-level numbers (equal to it for
exact match; nll and bpb divide the summed difference by the shared token or byte total).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.experiment.stats import paired_permutation_p, sacrebleu_paired_p

PER_EXAMPLE = {"nll": "nll", "bpb": "bits", "exact_match": "exact"}


@dataclass
class ColumnTest:
    best: str | None
    p_values: dict[str, float | None] = field(default_factory=dict)  # row -> p against the best (best excluded)
    skipped: dict[str, str] = field(default_factory=dict)  # row -> why it was not tested


def _pooled(point, evaluation: str | dict[str, str], seeds: list) -> list[dict] | None:
    """The examples of `seeds` (in that order) concatenated, or None if a seed saved none."""
    if isinstance(evaluation, dict):
        evaluation = evaluation[point.name]
    by_seed = {r.seed: r for r in point.records}
    pooled = []
    for seed in seeds:
        examples = by_seed[seed].examples(evaluation)
        if not examples:
            return None
        pooled.extend(examples)
    return pooled


def test_column(points, evaluation: str | dict[str, str], metric: str, means: dict[str, float], higher_is_better: bool,
                reference: str | None = None) -> ColumnTest:
    """Test every row of `points` against the best mean of `metric` in `evaluation` (one name, or
    one per row), or against the row named `reference` (which then stands in the `best` field)."""
    if not means or (reference is not None and reference not in means):
        return ColumnTest(None)
    best_name = reference or (max if higher_is_better else min)(means, key=means.get)
    best = next(p for p in points if p.name == best_name)
    out = ColumnTest(best_name)
    # sacreBLEU tests many systems against one baseline: one call per set of shared seeds, so
    # seed k of every row meets seed k of the best row.
    by_seeds: dict[tuple, dict[str, list[str]]] = {}
    for point in points:
        if point.name == best_name or point.name not in means:
            continue
        seeds = tuple(s for s in point.seeds if s in set(best.seeds))
        if not seeds:
            out.skipped[point.name] = "no seed in common with the best row"
            continue
        mine, theirs = _pooled(point, evaluation, list(seeds)), _pooled(best, evaluation, list(seeds))
        if not mine or not theirs:
            out.skipped[point.name] = "no per-example values (examples.jsonl) for shared seeds"
            continue
        if [(e["index"], e["reference"]) for e in mine] != [(e["index"], e["reference"]) for e in theirs]:
            out.skipped[point.name] = "different test examples"
            continue
        field_name = "hypothesis" if metric in ("bleu", "chrf") else PER_EXAMPLE[metric]
        if field_name not in mine[0] or field_name not in theirs[0]:
            out.skipped[point.name] = "no generations saved"
            continue
        if metric in ("bleu", "chrf"):  # one sacreBLEU test per seed set, below
            by_seeds.setdefault(seeds, {})[point.name] = [e["hypothesis"] for e in mine]
            continue
        if metric == "nll" and [e["tokens"] for e in mine] != [e["tokens"] for e in theirs]:
            out.skipped[point.name] = "other tokenization: compare bpb"
            continue
        out.p_values[point.name] = paired_permutation_p([float(e[field_name]) for e in mine],
                                                        [float(e[field_name]) for e in theirs])
    for seeds, systems in by_seeds.items():
        theirs = _pooled(best, evaluation, list(seeds))
        out.p_values.update(sacrebleu_paired_p(metric, [e["reference"] for e in theirs],
                                               [e["hypothesis"] for e in theirs], systems))
    out.p_values = {p.name: out.p_values[p.name] for p in points if p.name in out.p_values}  # table order
    return out
