"""`attnlab report`: runs in, markdown tables with intervals and significance, PNG plots out (and to wandb).

One row per grid point (a sweep point, or a run folder of its own); a point run with several
seeds shows every metric as mean ± std over them, with n and a 95 % interval in a second table.
Each evaluation metric (test nll, bpb, BLEU, chrF, exact match) is tested between every row and
the reference row (the sweep's `reference:`, else the first row), paired on the same seeds and
test examples, with seeds as the unit of replication (see `significance`); p is Holm-adjusted
over every comparison of the report, and the report marks the significant differences and says
in words which differences are and are not, and by which test.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from attnlab.errors import AttnlabError
from attnlab.experiment.provenance import context, read_sweep_record
from attnlab.experiment.runs import RunRecord, collect_runs
from attnlab.experiment.significance import ColumnTest, adjust, test_column
from attnlab.experiment.stats import ALPHA, HIERARCHICAL_SAMPLES, Summary, summarize
from attnlab.families.metrics import LIKELIHOOD_METRICS

DESCRIPTION = "turn a folder of runs (or a sweep) into tables with intervals and significance, and PNG plots"
QUALITY = ("nll", "bpb", "bleu", "chrf", "exact_match")
VAL_QUALITY = ("nll", "ppl", *QUALITY[1:])  # the paper's Table 3 reports dev perplexity


@dataclass
class Point:
    """A row of the report: the runs of one grid point, one per seed."""

    name: str
    records: list[RunRecord]

    @property
    def first(self) -> RunRecord:
        return self.records[0]

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.records]


@dataclass
class Column:
    header: str
    value: Callable[[RunRecord], object]
    fmt: Callable[[object], str] = str
    numeric: bool = False  # summarised over seeds (mean ± std, interval)
    evaluation: str | None = None  # with `metric`: a paired test against the reference row applies
    metric: str | None = None
    tests: ColumnTest | None = field(default=None, repr=False)

    def summary(self, point: Point) -> Summary | None:
        return summarize([self.value(r) for r in point.records])


def _number(digits: int):
    return lambda v: f"{v:.{digits}f}"


def _thousands(v) -> str:
    return f"{v:,.0f}"


def _params(v) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"


def _count(v) -> str:
    """FLOPs and tokens: three digits and a power of ten (5.12e+06)."""
    return f"{v:.3g}" if v < 1e4 else f"{v:.2e}"


def _minutes(v) -> str:
    return f"{int(v // 60)}:{int(v % 60):02d}"


def _quality_fmt(name: str):
    return _number(4 if name in LIKELIHOOD_METRICS else 2)


def group_points(records: list[RunRecord]) -> list[Point]:
    """Runs of one grid point form a row; a run without a seed next to seeded ones (an older
    seedless sweep rerun with seeds) is a row of its own, never pooled with them."""
    seeded = {r.name for r in records if r.seed is not None}
    points: dict[str, Point] = {}
    for record in records:
        name = f"{record.name} (no seed)" if record.seed is None and record.name in seeded else record.name
        points.setdefault(name, Point(name, [])).records.append(record)
    return list(points.values())


def build_columns(records: list[RunRecord]) -> list[Column]:
    columns = [Column("run", lambda r: r.name), Column("family", lambda r: r.family)]
    swept = list(dict.fromkeys(key for r in records for key in r.swept))
    for key in swept:
        short = key.rsplit(".", 1)[-1]
        columns.append(Column(short, lambda r, k=key: r.swept.get(k), lambda v: json.dumps(v) if not isinstance(v, str) else v))
    columns.append(Column("params", lambda r: r.summary.get("params"), _params))
    for name in VAL_QUALITY:
        if any(r.final(f"val/{name}") is not None for r in records):
            columns.append(Column(f"val {name}", lambda r, n=name: r.final(f"val/{n}"), _quality_fmt(name), numeric=True))
    # A frontier's evaluations (one per decoding and batch size) get their own section.
    evaluations = list(dict.fromkeys(e for r in records for e in r.evaluations if e not in r.frontier))
    evaluations.sort(key=lambda e: e != "test")
    for evaluation in evaluations:
        for name in QUALITY:
            key = f"test/{name}"
            if any(key in r.evaluations.get(evaluation, {}) for r in records):
                columns.append(Column(f"{evaluation} {name}", lambda r, e=evaluation, k=key: r.evaluations.get(e, {}).get(k),
                                      _quality_fmt(name), numeric=True, evaluation=evaluation, metric=name))
    if any(r.ledger("flops") is not None for r in records):  # what each run spent (attnlab.training.ledger)
        columns.append(Column("train FLOPs", lambda r: r.ledger("flops"), _count, numeric=True))
        columns.append(Column("train tokens", lambda r: r.ledger("tokens"), _count, numeric=True))
        columns.append(Column("epochs", lambda r: r.ledger("epochs"), _number(2), numeric=True))
    columns.append(Column("train tok/s", RunRecord.train_tokens_per_s, _thousands, numeric=True))
    columns.append(Column("gen tok/s", RunRecord.gen_tokens_per_s, _thousands, numeric=True))
    columns.append(Column("fit wall", lambda r: r.summary.get("fit_seconds"), _minutes, numeric=True))
    return columns


def run_tests(points: list[Point], columns: list[Column], reference: str | None = None) -> None:
    """Paired tests of every evaluation column against the `reference` row the sweep names, else
    against the first row (in sweep order) with a value in that column: chosen before any number
    is seen, so which row the others are tested against cannot follow the results (stored on the
    column; p-values raw until `adjust`)."""
    for column in columns:
        if column.metric is not None:
            scored = [p.name for p in points if column.summary(p) is not None]
            column.tests = test_column(points, column.evaluation, column.metric, scored,
                                       reference if reference is not None else next(iter(scored), None))


def sweep_reference(points: list[Point]) -> str | None:
    """The row a sweep's `reference:` names, or None. Runs finished before the file gained its
    `reference:` name none and do not count; runs that name different ones leave none, said."""
    named = {r.reference for p in points for r in p.records} - {None}
    if len(named) > 1:
        print(f"report: the runs name different reference rows ({', '.join(sorted(named))}); "
              "testing against the first row instead", file=sys.stderr)
    reference = named.pop() if len(named) == 1 else None
    return reference if reference in {p.name for p in points} else None


def _cell(column: Column, point: Point, marks: bool = True) -> str:
    """The table's text of one cell; `marks`: bold for the reference row, `*` for a significant
    difference (Holm-adjusted p)."""
    if not column.numeric:
        value = column.value(point.first)
        return "—" if value is None else column.fmt(value)
    summary = column.summary(point)
    if summary is None:
        return "—"
    text = column.fmt(summary.mean) + (f" ± {column.fmt(summary.std)}" if summary.n > 1 else "")
    tests = column.tests if marks else None
    if tests is not None and tests.reference == point.name:
        return f"**{text}**"
    if tests is not None and (p := tests.p_values.get(point.name)) is not None and p < ALPHA:
        return text + " *"
    return text


def _interval(column: Column, point: Point) -> str:
    summary = column.summary(point)
    if summary is None or summary.low is None:
        return "—"
    return f"[{column.fmt(summary.low)}, {column.fmt(summary.high)}]"


def markdown_table(points: list[Point], columns: list[Column]) -> str:
    headers = [columns[0].header, "n", *(c.header for c in columns[1:])]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for point in points:
        cells = [_cell(c, point) for c in columns]
        lines.append("| " + " | ".join([cells[0], str(len(point.records)), *cells[1:]]) + " |")
    return "\n".join(lines)


def interval_table(points: list[Point], columns: list[Column]) -> str:
    numeric = [c for c in columns if c.numeric]
    lines = ["| run | n | " + " | ".join(c.header for c in numeric) + " |", "|" + "---|" * (len(numeric) + 2)]
    for point in points:
        lines.append(f"| {point.name} | {len(point.records)} | " + " | ".join(_interval(c, point) for c in numeric) + " |")
    return "\n".join(lines)


SEEDS_WORDS = (f"a hierarchical paired bootstrap over seeds and examples ({HIERARCHICAL_SAMPLES:,} resamples: seeds drawn "
               "with replacement, then test examples with replacement within each drawn seed, the same for both rows; "
               "statistic: the mean over seeds of the difference of the corpus metric; p: twice its smaller tail at 0)")
ONE_SEED_WORDS = ("that seed's test examples alone: sacreBLEU's paired bootstrap resampling for BLEU and chrF, a paired "
                  "sign-flip permutation test for nll, bpb and exact match")


def tests_sentence(tests: list[ColumnTest]) -> str:
    """Which test the marks used: over seeds, on one seed's examples, or each for the rows named."""
    rows: dict[bool, list[str]] = {}
    for test in tests:
        for name, c in test.comparisons.items():
            if name not in rows.get(c.test == "seeds", []):
                rows.setdefault(c.test == "seeds", []).append(name)
    if set(rows) == {True, False}:
        return (f"Rows sharing two or more seeds with the reference ({', '.join(rows[True])}): {SEEDS_WORDS}; rows "
                f"sharing one ({', '.join(rows[False])}): {ONE_SEED_WORDS}.")
    if False in rows:
        return f"The rows share one seed with the reference, so the test uses {ONE_SEED_WORDS}."
    return f"Test: {SEEDS_WORDS}."


def significance_text(points: list[Point], columns: list[Column], reference: str | None = None,
                      comparisons: int = 0, frontier: bool = False) -> list[str]:
    """The words under the table: the reference row, the test and its correction, then one line per
    tested column: which rows differ significantly, which do not, which only on the pooled test.
    `reference`: the row the sweep names; `comparisons`: how many p-values Holm adjusted."""
    tested = [c for c in columns if c.tests is not None and c.tests.reference is not None]
    if not tested or len(points) < 2:
        return []
    seeds = sorted({len(p.records) for p in points})
    references = list(dict.fromkeys(c.tests.reference for c in tested))
    if reference or len(references) == 1:
        why = "named by the sweep's `reference:`" if reference else "the first row; a sweep's `reference:` names another"
        bold = f"the reference row, {reference or references[0]}, which every other row is tested against ({why})"
    else:
        bold = "the reference row of each column (the first row with a value), which every other row is tested against"
    lines = [
        f"Bold: {bold}. `*`: significantly different from it at p < {ALPHA}, two-sided, paired on the same seeds and "
        f"test examples, p Holm-adjusted over the report's {comparisons} comparison{'s' if comparisons != 1 else ''} "
        f"(every tested row of every marked column{', the frontier included' if frontier else ''}). "
        f"{tests_sentence([c.tests for c in tested])} Seeds per row: {', '.join(map(str, seeds))}. "
        "Unmarked rows are not significantly different from the reference.",
        "",
    ]
    by_name = {p.name: p for p in points}
    overlapping = pooled_only = False
    for column in tested:
        tests = column.tests
        ref = column.summary(by_name[tests.reference])
        worse, same, pooled = [], [], []
        for name, c in tests.comparisons.items():
            if c.p < ALPHA:
                mine = column.summary(by_name[name])
                overlap = ref.low is not None and mine.low is not None and mine.low <= ref.high and ref.low <= mine.high
                overlapping |= overlap
                worse.append(f"{name} (p = {c.p:.3g}{'; intervals over seeds overlap' if overlap else ''})")
            else:
                same.append(f"{name} (p = {c.p:.3g})")
            if c.pooled_only:
                pooled.append(f"{name} (pooled p = {c.pooled:.3g})")
        pooled_only |= bool(pooled)
        parts = [f"- **{column.header}**: reference {tests.reference} ({column.fmt(ref.mean)})"]
        parts.append(f"significantly different: {', '.join(worse)}" if worse else "no row significantly different")
        if same:
            parts.append(f"not significantly different: {', '.join(same)}")
        if pooled:
            parts.append(f"significant on the pooled example-level test, not over seeds: {', '.join(pooled)}")
        if tests.skipped:
            parts.append("not tested: " + ", ".join(f"{n} ({why})" for n, why in tests.skipped.items()))
        lines.append("; ".join(parts) + ".")
    if pooled_only:
        lines += ["", "The pooled example-level test treats every (seed, example) pair as exchangeable (sacreBLEU's "
                  "paired bootstrap for BLEU and chrF, the sign-flip permutation test otherwise; Holm-adjusted over the "
                  "same comparisons). A difference it calls significant and the bootstrap over seeds does not holds "
                  "for these trained models on these test examples; another seed may not keep it."]
    if overlapping:
        k = max(seeds)  # k seeds drawn k times with replacement: C(2k - 1, k) distinct draws
        lines += ["", "Where a marked row's 95 % interval over seeds overlaps the reference row's: the bootstrap "
                  f"draws from these few seeds only ({k} seeds give {math.comb(2 * k - 1, k)} distinct draws), which "
                  "makes it less cautious than the t interval; more seeds would tell whether another training run "
                  "keeps the order."]
    return lines


def quality_cells(points: list[Point], columns: list[Column]) -> dict[str, dict[str, str]]:
    """Per row, every validation and test quality cell as the table shows it (without marks):
    what a rerun must reproduce for its page's history to say that every quality number matched."""
    quality = [c for c in columns if c.metric is not None or c.header.startswith("val ")]
    return {p.name: {c.header: _cell(c, p, marks=False) for c in quality} for p in points}


def report_rows(points: list[Point], columns: list[Column]) -> list[dict]:
    """report.json: per row, every column's value (numbers: per-seed values, mean, std, n, interval;
    tested columns: whether the row is the reference, and against it: p (Holm-adjusted, the mark's),
    p_raw, the test (a key of significance.TESTS), pooled_p and pooled_p_raw (the example-level
    test over pooled seeds and examples))."""
    rows = []
    for point in points:
        row: dict = {"seeds": point.seeds}
        for column in columns:
            if not column.numeric:
                row[column.header] = column.value(point.first)
                continue
            summary = column.summary(point)
            entry = {"values": [column.value(r) for r in point.records]}
            if summary is not None:
                entry.update(mean=summary.mean, std=summary.std, n=summary.n, ci95=[summary.low, summary.high])
            if column.tests is not None:
                c = column.tests.comparisons.get(point.name)
                entry.update(reference=column.tests.reference == point.name, p=c and c.p, p_raw=c and c.p_raw,
                             test=c and c.test, pooled_p=c and c.pooled, pooled_p_raw=c and c.pooled_raw)
            row[column.header] = entry
        rows.append(row)
    return rows


def budget_line(points: list[Point]) -> str:
    """What every run of the table was given: its run.budget where it had one (what was matched,
    and the optimizer steps each row derived from it, as a range over its seeds), else optimizer
    steps and epochs (summary.json); and the seeds."""
    def given(record: RunRecord) -> str:
        budget = record.budget() or {}
        kind = next((k for k in ("flops", "tokens", "epochs", "time") if k in budget), None)
        if kind is None:
            return ""
        amount = budget[kind] if isinstance(budget[kind], str) else f"{budget[kind]:.3g}"
        return f"under a budget of {kind} {amount}"

    def steps(records: list[RunRecord]) -> str:
        counts = sorted({r.summary["steps"] for r in records})
        epochs = {r.summary.get("epochs") for r in records}
        span = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}–{counts[-1]:,}"
        if len(epochs) == 1 and None not in epochs and not any(given(r) for r in records):
            (e,) = epochs
            return f"{span} optimizer steps ({e} epoch{'s' if e != 1 else ''})"
        return f"{span} optimizer steps"

    def spent(records: list[RunRecord]) -> str:
        if any(r.summary.get("steps") is None for r in records):
            return "unknown (no summary.json)"
        label = " / ".join(sorted({given(r) for r in records} - {""}))
        return f"{label} ({steps(records)})" if label else steps(records)

    budgets = {p.name: spent(p.records) for p in points}
    shared = {given(r) for p in points for r in p.records}
    seeds = {p.name: ", ".join(str(s) for s in p.seeds if s is not None) or "none" for p in points}
    if len(set(budgets.values())) == 1:
        spend = f"every run trained {next(iter(budgets.values()))}"
    elif len(shared) == 1 and "" not in shared and all(r.summary.get("steps") is not None for p in points for r in p.records):
        spend = (f"every run trained {next(iter(shared))}, which gave each row its optimizer steps: "
                 + ", ".join(f"{p.name} {steps(p.records)}".replace(" optimizer steps", "") for p in points))
    else:
        spend = "; ".join(f"{name}: {b}" for name, b in budgets.items())
    seed = (f"seeds {next(iter(seeds.values()))} for every row" if len(set(seeds.values())) == 1
            else "seeds " + "; ".join(f"{name}: {s}" for name, s in seeds.items()))
    walls = [r.summary.get("fit_seconds") for p in points for r in p.records]
    wall = (f" Wall time: {_clock(sum(walls))} of training in all (every run's fit wall summed; tests and "
            "tuning not included)." if walls and None not in walls else "")
    return f"Budget: {spend}; {seed}.{wall}"


def _clock(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour."""
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab report", description=DESCRIPTION)
    parser.add_argument("folder", help="a sweep folder (runs/<sweep>) or any folder holding run folders")
    parser.add_argument("--output", help="where to write report.md, report.json and the plots (default: <folder>/report)")
    parser.add_argument("--metric", default="chrf", help="quality metric of the quality-against-parameters plot "
                                                        "(nll, bpb, bleu, chrf, exact_match; test if measured, else val)")
    parser.add_argument("--facet", metavar="KEY",
                        help="draw the learning curves (val/nll against epochs and FLOPs) in one panel per value of "
                             "this swept key (default: data.init_args.train_tokens where the points differ in it)")
    parser.add_argument("--publish", metavar="PAGE.md",
                        help="also write a results page for the docs (e.g. docs/results/<name>.md) from report.json, "
                             "with the plots beside it; a page already there keeps its history and gains one line")
    parser.add_argument("--wandb", default="auto", choices=("auto", "online", "offline", "disabled"),
                        help="log the table and plots as a wandb run of the sweep's group (default: auto)")
    return parser


def report_main(argv: list[str]) -> int:
    from attnlab.experiment.curves import build_curves, crossover_text, facet_key, write_curves
    from attnlab.experiment.frontier import frontier_tests, write_frontier
    from attnlab.experiment.plots import write_plots
    from attnlab.experiment.tune import tuning_section

    args = build_parser().parse_args(argv)
    if args.publish and not args.publish.endswith(".md"):
        raise AttnlabError(f"--publish {args.publish}: give the page's path ending in .md, e.g. docs/results/<name>.md")
    folder = Path(args.folder)
    records = collect_runs(folder)
    if not records:
        raise AttnlabError(f"no runs under {folder}: a run folder holds the metrics.csv that `attnlab fit` writes")
    points = group_points(records)
    columns = build_columns(records)
    reference = sweep_reference(points)
    run_tests(points, columns, reference)
    speed = frontier_tests(points)  # its marks join the report's family of comparisons
    comparisons = adjust([c.tests for c in columns if c.tests is not None] + (list(speed.tests.values()) if speed else []))
    table, intervals = markdown_table(points, columns), interval_table(points, columns)
    words = significance_text(points, columns, reference, comparisons, frontier=bool(speed and speed.tests))
    output = Path(args.output) if args.output else folder / "report"
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(points, output, args.metric)
    facet = facet_key(points, args.facet)
    curves = build_curves(points, facet)  # fits with the budget ledger only
    plots += write_curves(curves, output, facet)
    learning = crossover_text(curves, facet)
    frontier, frontier_plots = write_frontier(speed, output, args.metric, comparisons)
    plots += frontier_plots
    budget = budget_line(points)
    tuning = tuning_section(folder)
    body = [f"# Report: {folder}", "", f"{len(points)} row(s), {len(records)} run(s); numbers are mean ± std over "
            "the seeds of a row (n). " + budget, "", table, "", *words, "",
            "95 % intervals of the mean over seeds (Student t, n - 1 degrees of freedom):", "", intervals, "", *learning,
            *frontier, *([*tuning, ""] if tuning else [])]
    body += [f"![{p.stem}]({p.name})" for p in plots]
    (output / "report.md").write_text("\n".join(body) + "\n")
    rows = report_rows(points, columns)
    report = {
        "format": 3, "folder": str(folder), "meta": read_sweep_record(folder) or context(f"attnlab report {folder}"),
        "budget": budget, "rows": rows, "quality": quality_cells(points, columns),
        "markdown": {"table": table, "significance": words, "intervals": intervals, "frontier": frontier,
                     "tuning": tuning, "learning": learning},
        "plots": [p.name for p in plots],
    }
    (output / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    if args.publish:
        from attnlab.experiment.publish import publish

        print(f"report: published {publish(output / 'report.json', Path(args.publish))}")
    print(table)
    if words:
        print("\n" + "\n".join(words))
    if frontier:
        print("\n" + "\n".join(frontier))
    print(f"\nreport: {output / 'report.md'} ({len(plots)} plots)")
    if args.wandb != "disabled":
        from attnlab.experiment.wandb_report import log_report

        flat = [{c.header: (v["mean"] if isinstance(v := row[c.header], dict) and "mean" in v else v) for c in columns}
                for row in rows]
        line = log_report(folder, output, [c.header for c in columns], flat, plots, args.wandb)
        if line:
            print(line)
    return 0
