"""The report's frontier: generation speed against quality, one line per batch size.

A sweep's `frontier:` tests each decoding of each point at several eval batch sizes (evaluations
named `<decoding>@b<batch>`; done.json says which is which). Here each decoding is a row: its
test quality (from its largest batch), and at every
batch size the model calls per generated token (threshold decoding calls until every row's
block is clean, so larger batches call more) and tokens/s with its ratio to the
reference decoding's, measured in the same sweep on the same machine. Quality is tested against
the reference as the report's columns are (significance.compare: over seeds from three shared
seeds, on one seed's examples for one), its p-values Holm-adjusted together with the rest of the
report's; a speed difference is called one only where the rows' intervals over seeds are apart.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.reports.runs import RunRecord
from attnlab.reports.significance import MARKS, Comparison, Row as TableRow, compare, example_p
from attnlab.reports.stats import Summary, summarize

QUALITY = {"exact_match": "exact match", "chrf": "chrF", "bleu": "BLEU"}


@dataclass
class Row:
    """One decoding of one grid point, over its seeds."""

    point: str
    decoding: str
    records: list[RunRecord] = field(default_factory=list)
    evaluations: dict[int, str] = field(default_factory=dict)  # batch size -> evaluation name

    @property
    def name(self) -> str:
        return f"{self.point} {self.decoding}"

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.records]

    @property
    def quality_evaluation(self) -> str:
        return self.evaluations[max(self.evaluations)]

    def summary(self, key: str, batch: int | None = None) -> Summary | None:
        evaluation = self.quality_evaluation if batch is None else self.evaluations.get(batch)
        return summarize([r.evaluations.get(evaluation, {}).get(key) for r in self.records])


def frontier_rows(points) -> tuple[list[Row], str | None]:
    """The rows of every point whose runs have frontier evaluations, and the reference row's name."""
    rows: dict[tuple[str, str], Row] = {}
    reference = None
    for point in points:
        for record in point.records:
            for evaluation, meta in record.frontier.items():
                if evaluation not in record.evaluations:
                    continue
                row = rows.setdefault((point.name, meta["decoding"]), Row(point.name, meta["decoding"]))
                if not any(r is record for r in row.records):
                    row.records.append(record)
                row.evaluations[int(meta["batch_size"])] = evaluation
            reference = reference or record.frontier_reference
    if reference:
        point, _, decoding = reference.rpartition("/")
        reference = f"{point} {decoding}"
    return list(rows.values()), reference


def batch_sizes(rows: list[Row]) -> list[int]:
    return sorted({b for row in rows for b in row.evaluations})


def quality_tests(rows: list[Row], reference: str | None) -> dict[str, dict[str, Comparison]]:
    """metric -> row -> its quality against the reference row's (significance.compare on the per-seed
    values of each row's quality evaluation, one shared seed on its examples.jsonl; raw p until
    significance.adjust)."""
    if reference not in {row.name for row in rows}:
        return {}
    table = [TableRow(row.name, row.seeds, reference, row.records[0].tuned) for row in rows]
    by_name = {row.name: row for row in rows}

    def on_examples(metric, name, ref, seed):
        pair = (_examples(by_name[name], seed), _examples(by_name[ref], seed))
        return "no per-example values (examples.jsonl)" if None in pair else example_p(metric, *pair)

    out = {}
    for metric in QUALITY:
        values = {row.name: [r.evaluations.get(row.quality_evaluation, {}).get(f"test/{metric}") for r in row.records]
                  for row in rows if row.summary(f"test/{metric}") is not None}
        if reference in values:
            out[metric] = compare(table, values, metric, on_examples)
    return out


def _examples(row: Row, seed) -> list[dict] | None:
    return next(r for r in row.records if r.seed == seed).examples(row.quality_evaluation) or None


@dataclass
class FrontierTests:
    """The frontier's rows, its reference row and its quality tests, made before the report
    Holm-adjusts all of its comparisons together and the section is written."""

    rows: list[Row]
    reference: str | None
    tests: dict[str, dict[str, Comparison]]

    def columns(self) -> list[tuple[str, str, dict[str, Comparison]]]:
        """(evaluation, metric, comparisons) per tested metric, as significance.adjust takes them."""
        return [("frontier", metric, comparisons) for metric, comparisons in self.tests.items()]


def frontier_tests(points) -> FrontierTests | None:
    """The frontier of the report's points with its quality tests, or None without frontier runs."""
    rows, reference = frontier_rows(points)
    return FrontierTests(rows, reference, quality_tests(rows, reference)) if rows else None


def _comparison(tests: dict[str, dict[str, Comparison]], metric: str, row: str) -> Comparison | None:
    return tests.get(metric, {}).get(row)


def _apart(a: Summary | None, b: Summary | None) -> bool:
    return bool(a and b and a.low is not None and b.low is not None and (a.low > b.high or b.low > a.high))


def _speed(summary: Summary | None) -> str:
    if summary is None:
        return "—"
    return f"{summary.mean:,.0f}" + (f" ± {summary.std:,.0f}" if summary.n > 1 else "")


def frontier_table(rows: list[Row], reference: str | None, tests: dict) -> str:
    batches = batch_sizes(rows)
    metrics = [m for m in QUALITY if any(row.summary(f"test/{m}") for row in rows)]
    headers = ["decoding", "n", *(f"test {QUALITY[m]}" for m in metrics)]
    headers += [h for b in batches for h in (f"calls/token b{b}", f"tok/s b{b}", f"× ref b{b}")]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    by_name = {row.name: row for row in rows}
    for row in rows:
        quality = [row.summary(f"test/{m}") for m in metrics]
        cells = [row.name + (" (reference)" if row.name == reference else ""),
                 str(max((s.n for s in quality if s), default=0))]  # the seeds that have a score
        for metric, s in zip(metrics, quality):
            c = _comparison(tests, metric, row.name)
            cells.append("—" if s is None else f"{s.mean:.2f}" + (f" ± {s.std:.2f}" if s.n > 1 else "")
                         + (f" {c.mark}" if c is not None and c.mark else ""))
        for batch in batches:
            calls = row.summary("test/nfe_per_token", batch)
            mine = row.summary("test/gen_tokens_per_s", batch)
            theirs = by_name[reference].summary("test/gen_tokens_per_s", batch) if reference in by_name else None
            cells += ["—" if calls is None else f"{calls.mean:.2f}", _speed(mine),
                      "—" if mine is None or theirs is None else f"{mine.mean / theirs.mean:.2f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_text(rows: list[Row], reference: str | None, tests: dict, counts: dict[str, int] | None = None) -> list[str]:
    """Per batch size, which rows are faster than the reference (and whether the seed intervals
    say so); per metric, which rows' quality differs from the reference's."""
    from attnlab.reports.tables import ColumnMeta, describe

    by_name = {row.name: row for row in rows}
    if reference not in by_name:
        return [f"The reference {reference} has no finished runs: no speed ratios and no quality tests."]
    ref = by_name[reference]
    family = f", Holm-adjusted with the report's {counts['seeds']} hypotheses" if counts and counts.get("seeds") else ""
    lines = [f"Against {reference}, timed in the same sweep. Quality is tested as the table's columns are: "
             f"`{MARKS['seeds']}` significant over training runs (a paired t-test over 3 or more shared seeds{family}), "
             f"`{MARKS['examples']}` on one shared seed's test examples; two shared seeds are not tested. A speed gap "
             "counts as one when the 95 % intervals over seeds are apart."]
    for batch in batch_sizes(rows):
        theirs = ref.summary("test/gen_tokens_per_s", batch)
        faster, unsure, single = [], [], []
        for row in rows:
            mine = row.summary("test/gen_tokens_per_s", batch)
            if row is ref or mine is None or theirs is None or mine.mean <= theirs.mean:
                continue
            kind = faster if _apart(mine, theirs) else single if min(mine.n, theirs.n) < 2 else unsure
            kind.append(f"{row.name} ({mine.mean / theirs.mean:.2f}×)")
        parts = [f"- batch {batch}: faster than the reference: {', '.join(faster) or 'none'}"]
        if unsure:
            parts.append(f"faster in the mean, intervals not apart: {', '.join(unsure)}")
        if single:
            parts.append(f"faster in one timed run (one seed: no interval): {', '.join(single)}")
        lines.append("; ".join(parts) + ".")
    for metric, comparisons in tests.items():
        column = ColumnMeta(f"test {QUALITY[metric]}", "score")
        described = [describe(column, name, c) for name, c in comparisons.items()]
        lines.append(f"- test {QUALITY[metric]} against the reference: {'; '.join(described) or 'no row to compare'}.")
    return lines


def frontier_json(rows: list[Row], reference: str | None, tests: dict) -> list[dict]:
    out = []
    for row in rows:
        entry: dict = {"row": row.name, "point": row.point, "decoding": row.decoding, "seeds": row.seeds,
                       "reference": row.name == reference}
        for metric in QUALITY:
            if (s := row.summary(f"test/{metric}")) is not None:
                c = _comparison(tests, metric, row.name)
                entry[f"test/{metric}"] = {"mean": s.mean, "std": s.std, "n": s.n, "ci95": [s.low, s.high],
                                           **({"comparison": c.as_json()} if c else {})}
        for key in ("gen_tokens_per_s", "nfe_per_token"):  # per batch size
            entry[key] = {str(b): {"mean": s.mean, "std": s.std, "n": s.n, "ci95": [s.low, s.high]}
                          for b in sorted(row.evaluations) if (s := row.summary(f"test/{key}", b))}
        out.append(entry)
    return out


def frontier_plot(rows: list[Row], output: Path, metric: str) -> Path | None:
    """Quality against tokens/s (log), a colour per batch size; each point's decodings joined by a
    line (sorted by speed), a marker per point, error bars of 95 % over seeds."""
    from attnlab.reports.plots import half_width, pyplot, save_figure

    key = next((f"test/{m}" for m in (metric, *QUALITY) if m in QUALITY and any(r.summary(f"test/{m}") for r in rows)), None)
    if key is None:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "*osD^v"
    points = list(dict.fromkeys(row.point for row in rows))
    for i, batch in enumerate(batch_sizes(rows)):
        colour = colours[i % len(colours)]
        for j, point in enumerate(points):
            xy = []
            for row in rows:
                speed, quality = row.summary("test/gen_tokens_per_s", batch), row.summary(key)
                if row.point == point and speed and quality:
                    xy.append((speed, quality, row.decoding))
            xy.sort(key=lambda t: t[0].mean)
            if not xy:
                continue
            bars = ax.errorbar([s.mean for s, _, _ in xy], [q.mean for _, q, _ in xy],
                               xerr=[half_width(s) for s, _, _ in xy], yerr=[half_width(q) for _, q, _ in xy],
                               color=colour, marker=markers[j % len(markers)], markersize=9 if j == 0 else 5,
                               capsize=2, elinewidth=0.7, label=f"batch {batch}" if j == 0 else None)
            for line in bars[2]:  # the interval bars: faint, so the means stay readable
                line.set_alpha(0.35)
            if i == 0:  # names once (the first batch), alternating sides
                for k, (s, q, decoding) in enumerate(xy):
                    ax.annotate(decoding, (s.mean, q.mean), fontsize=7, xytext=(4, 6 if k % 2 else -10),
                                textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens/s (test split, log scale)")
    ax.set_ylabel(f"{key} (mean, 95% interval over seeds)")
    ax.set_title("speed against quality: " + ", ".join(f"{markers[j % len(markers)]} {p}" for j, p in enumerate(points)),
                 fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, output / "frontier.png", plt)


def write_frontier(frontier: FrontierTests | None, output: Path, metric: str,
                   counts: dict[str, int] | None = None) -> tuple[list[str], list[Path]]:
    """The report's frontier section (markdown lines) and its plot; nothing without frontier runs.
    `counts`: the hypotheses Holm adjusted per test, the frontier's among them."""
    if frontier is None:
        return [], []
    rows, reference, tests = frontier.rows, frontier.reference, frontier.tests
    (output / "frontier.json").write_text(json.dumps(frontier_json(rows, reference, tests), indent=1) + "\n")
    plot = frontier_plot(rows, output, metric)
    lines = ["## Speed against quality (frontier)", "", frontier_table(rows, reference, tests), "",
             *frontier_text(rows, reference, tests, counts), ""]
    return lines, [plot] if plot else []
