"""A report's tables and the words under them, from its JSON alone.

`attnlab report` writes each row's per-seed values and each comparison with its reference row into
report.json and renders them here; `attnlab report --remark PAGE.md` renders a committed results
page again from its JSON with today's tests, so a page's marks are what its numbers support.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from attnlab.reports.significance import MARKS, Comparison, fallback_column
from attnlab.reports.stats import ALPHA, MIN_SEEDS, POWER
from attnlab.families.metric_keys import LIKELIHOOD_METRICS

QUALITY = ("nll", "bpb", "bleu", "chrf", "exact_match")


def _params(v) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"


def _count(v) -> str:
    """FLOPs and tokens: three digits and a power of ten (5.12e+06)."""
    return f"{v:.3g}" if v < 1e4 else f"{v:.2e}"


def _minutes(v) -> str:
    return f"{int(v // 60)}:{int(v % 60):02d}"


FORMATS: dict[str, Callable[[object], str]] = {
    "text": str,
    "json": lambda v: v if isinstance(v, str) else json.dumps(v),
    "params": _params,
    "likelihood": lambda v: f"{v:.4f}",
    "score": lambda v: f"{v:.2f}",
    "count": _count,
    "number": lambda v: f"{v:.2f}",
    "thousands": lambda v: f"{v:,.0f}",
    "minutes": _minutes,
    "percent": lambda v: f"{100 * v:.1f} %",
}


def quality_format(metric: str) -> str:
    return "likelihood" if metric in LIKELIHOOD_METRICS else "score"


@dataclass
class ColumnMeta:
    """A column as report.json keeps it: its header, how its numbers print, whether it is averaged
    over seeds, and for an evaluation column its metric and evaluation (what the tests compare).
    `against`: for another decoding of the test data (the main job's `verify`), the evaluation of a
    reference row that has none of this one to test it against instead (`test`)."""

    header: str
    format: str = "text"
    numeric: bool = False
    metric: str | None = None
    evaluation: str | None = None
    against: str | None = None

    def fmt(self, value) -> str:
        return FORMATS[self.format](value)

    @property
    def tested(self) -> bool:
        return self.metric is not None


def infer_columns(rows: list[dict]) -> list[ColumnMeta]:
    """The columns of a report.json written before it listed them (format 3): known by their headers."""
    fixed = {"params": "params", "train FLOPs": "count", "train tokens": "count", "epochs": "number",
             "train tok/s": "thousands", "gen tok/s": "thousands", "fit wall": "minutes"}
    out = []
    for header in dict.fromkeys(h for row in rows for h in row if h != "seeds"):
        numeric = any(isinstance(row.get(header), dict) and "values" in row[header] for row in rows)
        name = header.split(" ", 1)[1] if " " in header else ""
        if header in fixed:
            out.append(ColumnMeta(header, fixed[header], numeric))
        elif numeric and name in QUALITY + ("ppl",):
            evaluation = header.split(" ", 1)[0]
            tested = evaluation != "val" and name in QUALITY
            out.append(ColumnMeta(header, quality_format(name), True, name if tested else None,
                                  evaluation if tested else None))
        else:
            out.append(ColumnMeta(header, "json" if header not in ("run", "family") else "text", numeric))
    return out


def comparison(row: dict, column: ColumnMeta) -> Comparison | None:
    entry = row.get(column.header)
    return Comparison.from_json(entry) if isinstance(entry, dict) and entry.get("test") else None


def is_reference(row: dict, rows: list[dict], column: ColumnMeta) -> bool:
    """A row others in this column are tested against."""
    return column.tested and any(r is not row and r.get("reference") == row["run"] and comparison(r, column)
                                 for r in rows)


def cell(column: ColumnMeta, row: dict, rows: list[dict], marks: bool = True) -> str:
    """One cell: text, or mean ± std over the seeds; bold for a reference, `*` / `†` for a
    significant difference from it."""
    entry = row.get(column.header)
    if not column.numeric:
        return "—" if entry is None else column.fmt(entry)
    if not isinstance(entry, dict) or entry.get("mean") is None:
        return "—"
    text = column.fmt(entry["mean"]) + (f" ± {column.fmt(entry['std'])}" if entry.get("n", 1) > 1 else "")
    if not marks:
        return text
    if is_reference(row, rows, column):
        return f"**{text}**"
    found = comparison(row, column)
    return text + (f" {found.mark}" if found and found.mark else "")


def row_label(row: dict, labelled: bool) -> str:
    """The row's name, with (tuned) / (untuned) where the sweep tuned some rows and not others."""
    if labelled and row.get("tuned") is not None:
        return f"{row['run']} ({'tuned' if row['tuned'] else 'untuned'})"
    return row["run"]


def _labelled(rows: list[dict]) -> bool:
    return len({row.get("tuned") for row in rows} - {None}) > 1


def markdown_table(columns: list[ColumnMeta], rows: list[dict]) -> str:
    headers = [columns[0].header, "n", *(c.header for c in columns[1:])]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    labelled = _labelled(rows)
    for row in rows:
        cells = [cell(c, row, rows) for c in columns]
        cells[0] = row_label(row, labelled)
        lines.append("| " + " | ".join([cells[0], str(len(row["seeds"])), *cells[1:]]) + " |")
    return "\n".join(lines)


def interval_table(columns: list[ColumnMeta], rows: list[dict]) -> str:
    numeric = [c for c in columns if c.numeric]
    lines = ["| run | n | " + " | ".join(c.header for c in numeric) + " |", "|" + "---|" * (len(numeric) + 2)]
    for row in rows:
        spans = []
        for column in numeric:
            low, high = (row.get(column.header) or {}).get("ci95") or (None, None)
            spans.append("—" if low is None else f"[{column.fmt(low)}, {column.fmt(high)}]")
        lines.append(f"| {row['run']} | {len(row['seeds'])} | " + " | ".join(spans) + " |")
    return "\n".join(lines)


def _signed(column: ColumnMeta, value: float) -> str:
    return ("+" if value >= 0 else "−") + column.fmt(abs(value))


def describe(column: ColumnMeta, name: str, c: Comparison) -> str:
    """One comparison in words: the mean difference (row minus reference), its interval, p, and for
    a non-significant test over seeds the smallest difference those seeds could have found."""
    if c.test == "seeds":
        words = (f"{name} {_signed(column, c.difference)} [{_signed(column, c.low)}, {_signed(column, c.high)}] "
                 f"(p = {c.p:.3g}")
        if not c.significant:
            words += (f"; {c.shared} seeds detect ≥ {column.fmt(c.detectable)}" if c.detectable is not None
                      else "; no spread between its seeds' differences to size an effect against")
        return words + ")"
    if c.test == "examples":
        return f"{name} {_signed(column, c.difference)} (p = {c.p:.3g}, {c.why})"
    shown = "" if c.difference is None else f" {_signed(column, c.difference)}"
    return f"{name}{shown} ({c.why})"


def legend(kinds: set[str], counts: dict[str, int], facetted: bool, two_seeds: bool) -> str:
    """What bold and each mark mean, and which test made them (only the tests the report ran)."""
    seeds = counts.get("seeds", 0)
    parts = ["Bold: the reference row each row is tested against, named before the runs (the sweep's "
             "`reference:`, else its first row" + ("; in each cell of the grid, that base's point of the same "
                                                    "cell: no test crosses cells" if facetted else "") + ")."]
    if "seeds" in kinds:
        parts.append(
            "Each comparison gives the mean difference (row minus reference, over the seeds both ran) with its "
            f"95 % t interval (not adjusted for the number of tests). `{MARKS['seeds']}`: significant over "
            f"training runs: a paired t-test on the per-seed values of the seeds both rows ran (at least "
            f"{MIN_SEEDS}; df = seeds − 1), p < {ALPHA} two-sided after Holm's correction over the report's "
            f"{seeds} hypotheses (one per row, evaluation and metric family; nll and bpb are one). Where it is "
            f"not significant, the smallest difference those seeds could have detected with {POWER * 100:.0f} % "
            f"power (at α / {seeds}, the level Holm holds the first hypothesis to), so a blank reads as too few "
            "seeds or too small a difference.")
    if "examples" in kinds:
        parts.append(
            f"`{MARKS['examples']}`: one shared seed, so two single systems: an example-level test on that seed's "
            f"test examples (its own Holm family of {counts.get('examples', 0)}): these two trained models differ "
            "on these examples; another training run may not keep the order.")
    if two_seeds:
        parts.append(f"Rows that share fewer than {MIN_SEEDS} seeds with their reference get no "
                     f"`{MARKS['seeds']}`: with two, t(0.975, 1) = 12.7, so only a difference 12.7 standard "
                     "errors from zero could show.")
    return " ".join(parts)


def significance_words(columns: list[ColumnMeta], rows: list[dict], counts: dict[str, int]) -> list[str]:
    """The words under the table: the legend, then one line per tested column and reference: each
    row's difference from it, split by what the tests say."""
    tested = [c for c in columns if c.tested and any(comparison(r, c) for r in rows)]
    if not tested:
        return []
    found = [comparison(r, c) for c in tested for r in rows if comparison(r, c)]
    lines = [legend({c.test for c in found}, counts, any(row.get("facet") for row in rows),
                    any(c.test != "seeds" and c.shared == 2 for c in found)), ""]
    by_name = {row["run"]: row for row in rows}
    for column in tested:
        references = list(dict.fromkeys(r["reference"] for r in rows if comparison(r, column)))
        for reference in references:
            ref = by_name[reference]
            groups: dict[str, list[str]] = {"different": [], "same": [], "examples": [], "untested": []}
            for row in rows:
                c = comparison(row, column)
                if c is None or row.get("reference") != reference:
                    continue
                kind = ("untested" if c.test == "none" else "examples" if c.test == "examples"
                        else "different" if c.significant else "same")
                groups[kind].append(describe(column, row["run"], c))
            mean = (ref.get(column.header) or {}).get("mean")
            head = f"- **{column.header}**, reference {reference} ({'—' if mean is None else column.fmt(mean)})"
            stand_in = fallback_column(column, columns)
            if mean is None and stand_in is not None and (ref.get(stand_in.header) or {}).get("mean") is not None:
                head = (f"- **{column.header}**, reference {reference}'s {stand_in.header} "
                        f"({column.fmt(ref[stand_in.header]['mean'])})")
            parts = []
            for key, label in (("different", "significantly different"), ("same", "not significantly different"),
                               ("examples", "on one seed's examples"), ("untested", "not tested")):
                if groups[key]:
                    parts.append(f"{label}: {', '.join(groups[key])}")
            lines.append(f"{head}: {'; '.join(parts)}.")
    return lines


def render(columns: list[ColumnMeta], rows: list[dict], counts: dict[str, int]) -> dict[str, object]:
    """The markdown of a report's table, the words on its tests and its interval table."""
    return {"table": markdown_table(columns, rows), "significance": significance_words(columns, rows, counts),
            "intervals": interval_table(columns, rows)}


def quality_cells(columns: list[ColumnMeta], rows: list[dict]) -> dict[str, dict[str, str]]:
    """Per row, every validation and evaluation quality cell as the table prints it (without marks):
    what a rerun must reproduce for its page's history to say that every quality number matched."""
    quality = [c for c in columns if c.tested or c.header.startswith("val ")]
    return {row["run"]: {c.header: cell(c, row, rows, marks=False) for c in quality} for row in rows}
