"""`attnlab report`: runs in, one markdown table and PNG plots out (and to wandb).

One row per fit run: family, the swept values, parameters, final validation metrics, every
evaluation's metrics, median training tokens/s, generation tokens/s and the wall time of fit.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attnlab.experiment.runs import RunRecord, collect_runs
from attnlab.errors import AttnlabError

DESCRIPTION = "turn a folder of runs (or a sweep) into a markdown table and PNG plots"
QUALITY = ("nll", "bleu", "chrf", "exact_match")


@dataclass
class Column:
    header: str
    value: Callable[[RunRecord], object]
    fmt: Callable[[object], str] = str


def _number(digits: int):
    return lambda v: f"{v:.{digits}f}"


def _thousands(v) -> str:
    return f"{v:,.0f}"


def _params(v) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"


def _minutes(v) -> str:
    return f"{int(v // 60)}:{int(v % 60):02d}"


def _quality_fmt(name: str):
    return _number(4 if name == "nll" else 2)


def generation_speed(record: RunRecord) -> float | None:
    test = record.evaluations.get("test", {}).get("test/gen_tokens_per_s")
    return test if test is not None else record.final("val/gen_tokens_per_s")


def build_columns(records: list[RunRecord]) -> list[Column]:
    columns = [Column("run", lambda r: r.name), Column("family", lambda r: r.family)]
    swept = list(dict.fromkeys(key for r in records for key in r.swept))
    for key in swept:
        short = key.rsplit(".", 1)[-1]
        columns.append(Column(short, lambda r, k=key: r.swept.get(k), lambda v: json.dumps(v) if not isinstance(v, str) else v))
    columns.append(Column("params", lambda r: r.summary.get("params"), _params))
    for name in QUALITY:
        if any(r.final(f"val/{name}") is not None for r in records):
            columns.append(Column(f"val {name}", lambda r, n=name: r.final(f"val/{n}"), _quality_fmt(name)))
    evaluations = list(dict.fromkeys(e for r in records for e in r.evaluations))
    evaluations.sort(key=lambda e: e != "test")
    for evaluation in evaluations:
        for name in QUALITY:
            key = f"test/{name}"
            if any(key in r.evaluations.get(evaluation, {}) for r in records):
                columns.append(Column(f"{evaluation} {name}", lambda r, e=evaluation, k=key: r.evaluations.get(e, {}).get(k),
                                      _quality_fmt(name)))
    columns.append(Column("train tok/s", RunRecord.train_tokens_per_s, _thousands))
    columns.append(Column("gen tok/s", generation_speed, _thousands))
    columns.append(Column("fit wall", lambda r: r.summary.get("fit_seconds"), _minutes))
    return columns


def markdown_table(records: list[RunRecord], columns: list[Column]) -> str:
    def cell(column, record):
        value = column.value(record)
        return "—" if value is None else column.fmt(value)

    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c, r) for c in columns) + " |" for r in records]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab report", description=DESCRIPTION)
    parser.add_argument("folder", help="a sweep folder (runs/<sweep>) or any folder holding run folders")
    parser.add_argument("--output", help="where to write report.md, report.json and the plots (default: <folder>/report)")
    parser.add_argument("--metric", default="chrf", help="quality metric of the quality-against-parameters plot "
                                                        "(nll, bleu, chrf, exact_match; test if measured, else val)")
    parser.add_argument("--wandb", default="auto", choices=("auto", "online", "offline", "disabled"),
                        help="log the table and plots as a wandb run of the sweep's group (default: auto)")
    return parser


def report_main(argv: list[str]) -> int:
    from attnlab.experiment.plots import write_plots

    args = build_parser().parse_args(argv)
    folder = Path(args.folder)
    records = collect_runs(folder)
    if not records:
        raise AttnlabError(f"no runs under {folder}: a run folder holds the metrics.csv that `attnlab fit` writes")
    columns = build_columns(records)
    table = markdown_table(records, columns)
    output = Path(args.output) if args.output else folder / "report"
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(records, output, args.metric)
    body = [f"# Report: {folder}", "", f"{len(records)} run(s).", "", table, ""]
    body += [f"![{p.stem}]({p.name})" for p in plots]
    (output / "report.md").write_text("\n".join(body) + "\n")
    rows = [{c.header: c.value(r) for c in columns} for r in records]
    (output / "report.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(table)
    print(f"\nreport: {output / 'report.md'} ({len(plots)} plots)")
    if args.wandb != "disabled":
        from attnlab.experiment.wandb_report import log_report

        line = log_report(folder, output, [c.header for c in columns], rows, plots, args.wandb)
        if line:
            print(line)
    return 0
