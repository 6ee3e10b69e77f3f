"""Reading run folders back: a fit run with its metrics history, summary and evaluations.

A fit folder holds metrics.csv with `train/*` columns; an evaluation folder (`attnlab test`)
holds one without (and examples.jsonl). In a sweep an evaluation sits next to its fit run under
the point's folder (or its seed folder); elsewhere it stays a row of its own.
"""
from __future__ import annotations

import csv
import io
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from attnlab.checkpoints.atomic import complete_lines
from attnlab.errors import AttnlabError, DataError


@dataclass
class RunRecord:
    name: str  # the point (sweeps) or the folder relative to the report root
    folder: Path
    family: str
    history: list[dict[str, float]]
    summary: dict = field(default_factory=dict)
    swept: dict = field(default_factory=dict)
    evaluations: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    order: int = 0  # the point's place in its sweep file, so tables follow the file
    seed: int | None = None  # the sweep seed (None: a run without seeds)
    evaluation_dirs: dict[str, Path] = field(default_factory=dict)
    frontier: dict[str, dict] = field(default_factory=dict)  # evaluation -> {decoding, batch_size} (done.json)
    frontier_reference: str | None = None  # <point>/<decoding> the frontier compares with
    reference: str | None = None  # the point a sweep's tests compare this one with (done.json; itself: a reference)
    facet: str | None = None  # a facetted sweep's grid cell: tests stay within it (done.json)
    tuned: bool | None = None  # a tuned sweep's point: whether the tune stage chose its values (None: no tune stage)
    checkpoints: dict[str, str] = field(default_factory=dict)  # evaluation -> the checkpoint it tested (best, last, averaged)
    class_path: str | None = None  # config.yaml's model.class_path (None: no config)
    _examples: dict = field(default_factory=dict, repr=False)  # evaluation -> records, read once

    def family_class(self):
        """The FamilyModule class the run trained, to ask what it is (autoregressive, ...): its
        model.class_path imported, else summary.json's family in the registry; None if neither."""
        from attnlab.families.registry import family_class

        return family_class(self.class_path, self.summary.get("family"))

    def trait(self, name: str) -> bool:
        """What the run's family says it is (`autoregressive`, `nll_is_bound`, ...): summary.json's
        record of it, else its class asked (runs from before the record); False if neither says."""
        recorded = (self.summary.get("traits") or {}).get(name)
        if isinstance(recorded, bool):
            return recorded
        cls = self.family_class()
        return cls is not None and bool(getattr(cls, name, False))

    def final(self, key: str) -> float | None:
        """The last logged value of a metric."""
        values = self.series(key)
        return values[-1][1] if values else None

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(int(row.get("step", i)), row[key]) for i, row in enumerate(self.history) if key in row]

    def best_validation(self) -> dict[str, float] | None:
        """The validation row of the run's best checkpoint: the first with the best value of the
        metric its checkpoints were chosen by (summary.json "monitor"; val/nll, lowest, for a run
        written before it said), as ModelCheckpoint keeps only a strictly better one."""
        monitor = self.summary.get("monitor") or {"metric": "val/nll", "mode": "min"}
        key = monitor["metric"]
        rows = [row for row in self.history if key in row and math.isfinite(row[key])]
        if not rows:
            return None
        pick = max if monitor["mode"] == "max" else min
        best = pick(row[key] for row in rows)
        return next(row for row in rows if row[key] == best)

    def at_best(self, key: str) -> float | None:
        """A validation metric at the run's best checkpoint (`best_validation`)."""
        row = self.best_validation()
        return None if row is None else row.get(key)

    def train_tokens_per_s(self) -> float | None:
        """Median over logged steps: robust to the slow first steps and to evaluation pauses."""
        values = [v for _, v in self.series("train/tokens_per_s")]
        return statistics.median(values) if values else None

    def gen_tokens_per_s(self) -> float | None:
        """Generation speed: the test evaluation's, else the last validation's."""
        test = self.evaluations.get("test", {}).get("test/gen_tokens_per_s")
        return test if test is not None else self.final("val/gen_tokens_per_s")

    def ledger(self, key: str) -> float | None:
        """A total of the fit's budget ledger (summary.json "ledger", attnlab.training.ledger): flops,
        tokens, unique_tokens, epochs or train_seconds; None for a run written before the ledger."""
        return (self.summary.get("ledger") or {}).get(key)

    def budget(self) -> dict | None:
        """The fit's run.budget and what it derived (summary.json "budget"), e.g. {"flops": 2e13,
        "max_steps": 412, "flops_per_step": ..., "tokens_per_step": ..., "steps_per_epoch": ...} or
        {"time": "00:02:00:00", "max_time_seconds": 7200}; None for a fit without a budget."""
        return self.summary.get("budget")

    def examples(self, evaluation: str) -> list[dict] | None:
        """The per-example records an evaluation saved (examples.jsonl), or None."""
        from attnlab.training.examples_file import read_examples

        if evaluation not in self._examples:
            folder = self.evaluation_dirs.get(evaluation)
            self._examples[evaluation] = read_examples(folder) if folder is not None else None
        return self._examples[evaluation]

    def metric(self, key: str) -> float | None:
        """`val/x` from the history, `test/x` from the evaluation named test, `name:test/x` from another."""
        if ":" in key:
            evaluation, key = key.split(":", 1)
            return self.evaluations.get(evaluation, {}).get(key)
        if key.startswith("test/") and "test" in self.evaluations:
            return self.evaluations["test"].get(key)
        return self.final(key)


def read_metrics(path: Path, fix: str = "rerun the run that wrote it") -> list[dict[str, float]]:
    """The rows of a metrics.csv as numbers; an empty cell is a metric that row did not log.

    A file that cannot be what Lightning's CSVLogger wrote (bytes that are not text, no header, a
    row with another number of fields than the header, a cell that is not a number) is a
    DataError naming the file, the line and `fix`: read leniently it made a report of empty
    columns that said nothing."""
    def damaged(line: int | None, what: str) -> DataError:
        return DataError(f"{path}{f': line {line}' if line else ''}: {what}, so it is not a metrics.csv "
                         f"attnlab can read (damaged?); {fix}")

    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise damaged(data[: err.start].count(b"\n") + 1, "bytes that are not UTF-8 text") from None
    if "\0" in text:
        raise damaged(text[: text.index("\0")].count("\n") + 1, "NUL bytes")
    if not text.strip():
        raise damaged(None, "the file is empty")
    complete, partial = complete_lines(text)
    if partial and complete:  # every row ends with its line end: this one's append was cut short
        print(f"attnlab: {path}: line {complete.count(chr(10)) + 1} is partial (the run stopped while writing it); "
              "left out", file=sys.stderr, flush=True)
        text = complete
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    try:
        header = next(reader)
        unnamed = [name for name in header if not name.strip() or is_number(name)]
        if unnamed:
            raise damaged(1, f"no header (its first line holds {unnamed[0]!r} where a metric name goes)")
        for cells in reader:
            if not cells:
                continue  # a blank line
            if len(cells) != len(header):
                raise damaged(reader.line_num, f"{len(cells)} fields where the header has {len(header)}")
            parsed = {}
            for key, value in zip(header, cells):
                if value == "":
                    continue
                if not is_number(value):
                    raise damaged(reader.line_num, f"{key} is {value[:40]!r}, not a number")
                parsed[key] = float(value)
            rows.append(parsed)
    except csv.Error as err:
        raise damaged(reader.line_num, f"unreadable CSV ({err})") from None
    return rows


def is_number(text: str) -> bool:
    """Whether `text` reads as a number (a CSV cell, a negative value among command-line arguments)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def last_values(history: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in history:
        out.update(row)
    return out


def class_path_of(folder: Path) -> str | None:
    """The run's model.class_path from its config.yaml (None without one)."""
    config = folder / "config.yaml"
    if config.is_file():
        model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
        if isinstance(model, dict) and model.get("class_path"):
            return str(model["class_path"])
    return None


def _is_fit(history: list[dict[str, float]]) -> bool:
    return any(key.startswith("train/") for row in history for key in row)


def _unfinished_sweep_run(folder: Path) -> bool:
    """A sweep point's fit or evaluation folder whose point has no done.json yet."""
    return (folder.parent / "fit").is_dir() and not (folder.parent / "done.json").is_file()


def _rerun_advice(folder: Path, root: Path) -> str:
    """How to replace a damaged metrics.csv: a sweep reruns a point whose folder is gone."""
    if (folder.parent / "done.json").is_file():
        return (f"delete {folder.parent} and rerun `attnlab sweep` with its sweep file (it skips the finished "
                "points and reruns this one), then report again")
    return f"rerun the command that wrote {folder}, or move that folder out of {root}, then report again"


def collect_runs(root: str | Path) -> list[RunRecord]:
    """Every fit run under `root` (hidden folders such as .incomplete/ are skipped), in sweep then name order."""
    root = Path(root)
    if not root.is_dir():
        raise AttnlabError(f"{root} is not a folder of runs")
    # A sweep's tuning trials (<sweep>/tune/, beside its tune.db) are the report's tuning section, not rows.
    tuning = [db.parent for db in root.rglob("tune.db") if db.parent != root]
    folders = [p.parent for p in sorted(root.rglob("metrics.csv"))
               if not any(part.startswith(".") for part in p.relative_to(root).parts)
               and not any(folder in p.parents for folder in tuning)]
    histories = {}
    for folder in list(folders):
        try:
            histories[folder] = read_metrics(folder / "metrics.csv", _rerun_advice(folder, root))
        except DataError:
            if not _unfinished_sweep_run(folder):
                raise
            folders.remove(folder)  # still being written, perhaps: skipped like any unfinished point
            print(f"report: skipped {folder} (unfinished: no done.json yet; rerun the sweep to finish it)",
                  file=sys.stderr)
    fits = [f for f in folders if _is_fit(histories[f])]
    fits_by_parent: dict[Path, list[Path]] = {}
    for folder in fits:
        fits_by_parent.setdefault(folder.parent, []).append(folder)
    records: dict[Path, RunRecord] = {}
    for folder in folders:
        done_file = folder.parent / "done.json"
        done = json.loads(done_file.read_text()) if done_file.is_file() else {}
        # A sweep point trains in <point>/[seedK/]fit and writes done.json beside it last.
        if folder.name == "fit" and not done and folder in fits:
            print(f"report: skipped {folder} (unfinished: no done.json yet; rerun the sweep to finish it)",
                  file=sys.stderr)
            continue
        siblings = fits_by_parent.get(folder.parent, [])
        if folder in fits or len(siblings) != 1:
            name = done.get("point") or str(folder.relative_to(root))
            summary_file = folder / "summary.json"
            summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
            class_path = class_path_of(folder)
            family = class_path.rsplit(".", 1)[-1] if class_path else summary.get("family", "?")  # the column
            record = RunRecord(name, folder, family, histories[folder], swept=done.get("swept", {}),
                               seconds=done.get("seconds", {}), order=done.get("index", 0), seed=done.get("seed"),
                               frontier=done.get("frontier", {}), frontier_reference=done.get("frontier_reference"),
                               reference=done.get("reference"), facet=done.get("facet"),
                               checkpoints=done.get("checkpoints", {}), class_path=class_path,
                               tuned=None if "tuned" not in done else bool(done["tuned"]), summary=summary)
            if folder not in fits:  # an evaluation with no fit run to attach to
                record.evaluations["test"] = last_values(histories[folder])
                record.evaluation_dirs["test"] = folder
            records[folder] = record
    for folder in folders:
        siblings = fits_by_parent.get(folder.parent, [])
        if folder not in fits and len(siblings) == 1 and siblings[0] in records:
            records[siblings[0]].evaluations[folder.name] = last_values(histories[folder])
            records[siblings[0]].evaluation_dirs[folder.name] = folder
    return sorted(records.values(), key=lambda r: (r.order, r.name, -1 if r.seed is None else r.seed))
