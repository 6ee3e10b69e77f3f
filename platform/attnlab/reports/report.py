"""`attnlab report`: runs in, markdown tables with intervals and significance, PNG plots out (and to wandb).

One row per grid point (a sweep point, or a run folder of its own); a point run with several
seeds shows every metric as mean ± std over them, with n and a 95 % interval in a second table.
Validation columns are each run's best checkpoint's (by the metric its checkpoints were chosen by),
evaluation columns name the checkpoint they tested. Each evaluation metric (test nll, bpb, BLEU,
chrF, exact match) is tested between every row and its reference row (the sweep's `reference:`,
else the first row; per grid cell in a facetted sweep), paired on seeds, with the training run as
the unit (see `significance`); the rows and their comparisons go to report.json, from which
`tables` renders the page, so a committed page can be re-marked from its JSON alone (`--remark`).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from attnlab.errors import AttnlabError
from attnlab.families.metric_keys import LIKELIHOOD_METRICS
from attnlab.reports.provenance import context, read_sweep_record
from attnlab.reports.runs import RunRecord, collect_runs
from attnlab.reports.significance import adjust, compare_columns, example_p, store_comparisons
from attnlab.reports.stats import Summary, summarize
from attnlab.reports.tables import QUALITY, ColumnMeta, quality_cells, quality_format, render

DESCRIPTION = "turn a folder of runs (or a sweep) into tables with intervals and significance, and PNG plots"
# Draft-and-verify's decoding statistics (generation.verify): tokens per call, and the share of
# drafts the AR view agreed with, overall and at the first draft position.
DRAFT_STATS = {"tokens_per_call": "k (tokens/call)", "draft_p": "p (drafts agreed)", "draft_p1": "p1 (first draft)"}
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
class Column(ColumnMeta):
    """A column of the report: its ColumnMeta and how to read its value off a run."""

    value: Callable[[RunRecord], object] = field(default=lambda r: None, repr=False)

    def summary(self, point: Point) -> Summary | None:
        return summarize([self.value(r) for r in point.records])

    def meta(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "value"}


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
    columns = [Column("run", value=lambda r: r.name), Column("family", value=lambda r: r.family)]
    swept = list(dict.fromkeys(key for r in records for key in r.swept))
    for key in swept:
        columns.append(Column(key.rsplit(".", 1)[-1], "json", value=lambda r, k=key: r.swept.get(k)))
    columns.append(Column("params", "params", value=lambda r: r.summary.get("params")))
    for name in VAL_QUALITY:  # at the best checkpoint, what the evaluations test
        if any(r.at_best(f"val/{name}") is not None for r in records):
            columns.append(Column(f"val {name} (best)", quality_format(name), True,
                                  value=lambda r, n=name: r.at_best(f"val/{n}")))
    # A frontier's evaluations (one per decoding and batch size) get their own section.
    evaluations = list(dict.fromkeys(e for r in records for e in r.evaluations if e not in r.frontier))
    evaluations.sort(key=lambda e: e != "test")
    for evaluation in evaluations:
        checkpoints = {r.checkpoints.get(evaluation, "best") for r in records if evaluation in r.evaluations}
        which = checkpoints.pop() if len(checkpoints) == 1 else "/".join(sorted(checkpoints))
        redecoded = evaluation != "test" and decodes_the_test_data(records, evaluation)
        for name in QUALITY:
            key = f"test/{name}"
            if any(key in r.evaluations.get(evaluation, {}) for r in records):
                against = "test" if redecoded and name not in LIKELIHOOD_METRICS else None
                columns.append(Column(f"{evaluation} {name} ({which})", quality_format(name), True, name, evaluation,
                                      against, value=lambda r, e=evaluation, k=key: r.evaluations.get(e, {}).get(k)))
        for name, header in DRAFT_STATS.items():  # what draft-and-verify's drafts bought (described, not tested)
            key = f"test/{name}"
            if any(key in r.evaluations.get(evaluation, {}) for r in records):
                columns.append(Column(f"{evaluation} {header}", "number", True,
                                      value=lambda r, e=evaluation, k=key: r.evaluations.get(e, {}).get(k)))
    if any(r.ledger("flops") is not None for r in records):  # what each run spent (attnlab.training.ledger)
        columns.append(Column("train FLOPs", "count", True, value=lambda r: r.ledger("flops")))
        columns.append(Column("train tokens", "count", True, value=lambda r: r.ledger("tokens")))
        columns.append(Column("epochs", "number", True, value=lambda r: r.ledger("epochs")))
    if any(spent_share(r) is not None for r in records):
        columns.append(Column("of budget", "percent", True, value=spent_share))
    columns.append(Column("train tok/s", "thousands", True, value=RunRecord.train_tokens_per_s))
    columns.append(Column("gen tok/s", "thousands", True, value=RunRecord.gen_tokens_per_s))
    columns.append(Column("fit wall", "minutes", True, value=lambda r: r.summary.get("fit_seconds")))
    return columns


def decodes_the_test_data(records: list[RunRecord], evaluation: str) -> bool:
    """Whether every run's `evaluation` tested the data its `test` did (the config's `data` alike but for
    the eval batch size): another decoding of the same sentences, whose generation quality a reference
    row without it is tested on in its `test` evaluation. Its likelihood is the test's own: not
    tested twice."""
    def data(folder) -> dict | None:
        config = folder / "config.yaml"
        if not config.is_file():
            return None
        section = (yaml.safe_load(config.read_text()) or {}).get("data")
        if isinstance(section, dict) and isinstance(section.get("init_args"), dict):
            section = {**section, "init_args": {k: v for k, v in section["init_args"].items() if k != "eval_batch_size"}}
        return section

    pairs = [(r.evaluation_dirs.get(evaluation), r.evaluation_dirs.get("test")) for r in records
             if evaluation in r.evaluation_dirs]
    return bool(pairs) and all(None not in pair and (mine := data(pair[0])) is not None and mine == data(pair[1])
                               for pair in pairs)


def spent_share(record: RunRecord) -> float | None:
    """What a run spent of its budget of flops, tokens or epochs (its ledger over the budget)."""
    budget = record.budget() or {}
    kind = next((k for k in ("flops", "tokens", "epochs") if k in budget), None)
    spent = record.ledger(kind) if kind else None
    return None if spent is None else spent / float(budget[kind])


def point_reference(point: Point, names: list[str]) -> str | None:
    """The row `point` is tested against: the one its runs name (done.json; a facetted sweep names
    its grid cell's), else the first row; None when the row it names is not in the report."""
    named = {r.reference for r in point.records} - {None}
    if len(named) > 1:
        print(f"report: the runs of {point.name} name different reference rows ({', '.join(sorted(named))}); "
              "testing it against the first row instead", file=sys.stderr)
    if len(named) == 1:
        reference = named.pop()
        return reference if reference in names else None
    return names[0]


def report_rows(points: list[Point], columns: list[Column]) -> list[dict]:
    """report.json's rows: per row its seeds, reference row, facet and whether it was tuned, and every
    column's value (numeric: per-seed values, mean, std, n, interval)."""
    names = [p.name for p in points]
    rows = []
    for point in points:
        first = point.first
        row: dict = {"seeds": point.seeds, "reference": point_reference(point, names), "facet": first.facet,
                     "tuned": first.tuned}
        for column in columns:
            if not column.numeric:
                row[column.header] = column.value(first)
                continue
            entry: dict = {"values": [column.value(r) for r in point.records]}
            if (summary := column.summary(point)) is not None:
                entry.update(mean=summary.mean, std=summary.std, n=summary.n, ci95=[summary.low, summary.high])
            row[column.header] = entry
        rows.append(row)
    return rows


def records_example_test(points: list[Point]):
    """The example-level test of two rows on one shared seed, from the examples.jsonl its evaluation saved."""
    by_name = {p.name: p for p in points}

    def run(evaluation: str, metric: str, row: str, reference: str, seed, reference_evaluation: str | None = None):
        mine, theirs = (next(r for r in by_name[n].records if r.seed == seed).examples(e)
                        for n, e in ((row, evaluation), (reference, reference_evaluation or evaluation)))
        if not mine or not theirs:
            return "no per-example values (examples.jsonl)"
        return example_p(metric, mine, theirs)

    return run


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
        return f"to a budget of {kind} {amount}"

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
    parser.add_argument("folder", nargs="?", help="a sweep folder (runs/<sweep>) or any folder holding run folders")
    parser.add_argument("--output", help="where to write report.md, report.json and the plots (default: <folder>/report)")
    parser.add_argument("--metric", default="chrf", help="quality metric of the quality-against-parameters plot "
                                                        "(nll, bpb, bleu, chrf, exact_match; test if measured, else the last val)")
    parser.add_argument("--facet", metavar="KEY",
                        help="draw the learning curves (val/nll against epochs and FLOPs) in one panel per value of "
                             "this swept key (default: data.init_args.train_tokens, else run.budget, where the points differ in it)")
    parser.add_argument("--publish", metavar="PAGE.md",
                        help="also write a results page for the docs (e.g. docs/results/<name>.md) from report.json, "
                             "with the plots beside it; a page already there keeps its history and gains one line")
    parser.add_argument("--remark", metavar="PAGE.md",
                        help="render a published results page again from its PAGE.json with today's tests and words "
                             "(no runs needed: the per-seed values are in it); its history gains a line saying so")
    parser.add_argument("--wandb", default="auto", choices=("auto", "online", "offline", "disabled"),
                        help="log the table and plots as a wandb run of the sweep's group (default: auto)")
    return parser


def report_main(argv: list[str]) -> int:
    from attnlab.reports.compute_frontier import ComputeFrontier
    from attnlab.reports.curves import build_curves, crossover_text, facet_key, write_curves
    from attnlab.reports.frontier import frontier_tests, write_frontier
    from attnlab.reports.plots import write_plots
    from attnlab.reports.tuning import tuning_section

    args = build_parser().parse_args(argv)
    if args.remark:
        from attnlab.reports.publish import remark

        print(f"report: re-marked {remark(Path(args.remark))}")
        return 0
    if args.folder is None:
        raise AttnlabError("give a folder of runs (attnlab report runs/<sweep>), or --remark PAGE.md")
    if args.publish and not args.publish.endswith(".md"):
        raise AttnlabError(f"--publish {args.publish}: give the page's path ending in .md, e.g. docs/results/<name>.md")
    folder = Path(args.folder)
    records = collect_runs(folder)
    if not records:
        raise AttnlabError(f"no runs under {folder}: a run folder holds the metrics.csv that `attnlab fit` writes")
    points = group_points(records)
    columns = build_columns(records)
    rows = report_rows(points, columns)
    example_test = records_example_test(points)
    tested = compare_columns(rows, columns, example_test)
    speed = frontier_tests(points)  # its comparisons join the report's Holm families
    counts = adjust(tested + (speed.columns() if speed else []))
    store_comparisons(rows)
    md = render(columns, rows, counts)
    output = Path(args.output) if args.output else folder / "report"
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(points, output, args.metric)
    facet = facet_key(points, args.facet)
    curves = build_curves(points, facet)  # fits with the budget ledger only
    plots += write_curves(curves, output, facet)
    learning = crossover_text(curves, facet)
    frontier, frontier_plots = write_frontier(speed, output, args.metric, counts)
    plots += frontier_plots
    ladder = ComputeFrontier.from_points(points)
    ladder_lines, ladder_plots = ladder.write(output) if ladder else ([], [])
    plots += ladder_plots
    budget = budget_line(points)
    tuning = tuning_section(folder, [r["run"] for r in rows])
    body = [f"# Report: {folder}", "", f"{len(points)} row(s), {len(records)} run(s); numbers are mean ± std over "
            "the seeds of a row (n). " + budget, "", md["table"], "", *md["significance"], "",
            "95 % intervals of the mean over seeds (Student t, n - 1 degrees of freedom):", "", md["intervals"], "",
            *ladder_lines, *learning, *frontier, *([*tuning, ""] if tuning else [])]
    body += [f"![{p.stem}]({p.name})" for p in plots]
    (output / "report.md").write_text("\n".join(body) + "\n")
    report = {
        "format": 4, "folder": str(folder), "meta": read_sweep_record(folder) or context(f"attnlab report {folder}"),
        "budget": budget, "columns": [c.meta() for c in columns], "rows": rows, "tests": counts,
        "quality": quality_cells(columns, rows), "compute_frontier": ladder.as_json() if ladder else None,
        "markdown": {**md, "frontier": frontier, "tuning": tuning, "learning": learning, "compute_frontier": ladder_lines},
        "plots": [p.name for p in plots],
    }
    (output / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    if args.publish:
        from attnlab.reports.publish import publish

        print(f"report: published {publish(output / 'report.json', Path(args.publish))}")
    print(md["table"])
    for section in (md["significance"], ladder_lines, frontier):
        if section:
            print("\n" + "\n".join(section))
    print(f"\nreport: {output / 'report.md'} ({len(plots)} plots)")
    if args.wandb != "disabled":
        from attnlab.reports.wandb_report import log_report

        flat = [{c.header: (v["mean"] if isinstance(v := row[c.header], dict) and "mean" in v else v) for c in columns}
                for row in rows]
        line = log_report(folder, output, [c.header for c in columns], flat, plots, args.wandb)
        if line:
            print(line)
    return 0
