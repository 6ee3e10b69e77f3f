"""The report's section on a sweep's tune stage, read from the record the tune stage writes
(`<sweep>/tune/tune.json`, see attnlab.sweeps.tune): every trial, the values chosen, and the
chosen values that lie on the edge of the range searched."""
from __future__ import annotations

import json
import math
from pathlib import Path

FOLDER = "tune"  # under the sweep folder: tune.db, tune.json and one folder of trials per point


def number(value) -> bool:
    """A finite int or float (not a bool): what a range's ends and a numeric choice must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def on_edge(param: dict, value) -> bool:
    """A chosen value at an end of its searched range (a list's smallest or largest number, or within a
    twentieth of a range's width from an end, on the log scale for a log range), where the best may
    lie beyond what was searched."""
    if param.get("choices") is not None:
        numbers = [c for c in param["choices"] if number(c)]
        return number(value) and len(numbers) > 1 and value in (min(numbers), max(numbers))
    low, high, log = param["low"], param["high"], param.get("log", False)
    scale = math.log if log else (lambda x: x)
    span = scale(high) - scale(low)
    return min(scale(value) - scale(low), scale(high) - scale(value)) <= span / 20


def tuning_section(sweep_dir: Path, rows: list[str] | None = None) -> list[str]:
    """The report's words on the tune stage (from tune/tune.json): per point, every trial's values and
    score, the values chosen (flagged where on the edge of the range searched), what the tuning spent,
    and which of the report's `rows` were not tuned; [] for a sweep without one."""
    record_file = Path(sweep_dir) / FOLDER / "tune.json"
    if not record_file.is_file():
        return []
    record = json.loads(record_file.read_text())
    if not record:
        return []
    first = next(iter(record.values()))
    keys = list(first["space"])
    counts = {len(point["trials"]) for point in record.values()}
    untuned = [name for name in rows or [] if name not in record]
    who = (f"Every point was tuned alike before its seeds ran" if not untuned else
           f"Tuned before their seeds ran: {', '.join(record)}; not tuned: {', '.join(untuned)} (the table labels each "
           "row, and tuned rows are not tested against untuned ones: their difference would include the tuning)")
    lines = ["## Tuning", "",
             f"{who}: {'/'.join(map(str, sorted(counts)))} trial(s) of `attnlab fit` each ({first['sampler']} sampler) "
             f"over the same space, chosen by the {'highest' if first['direction'] == 'maximize' else 'lowest'} "
             f"{first['metric']} a trial validated (validation data only)"
             + (f", every trial with tune seed {first['seed']}, which no evaluation run shares" if "seed" in first else "")
             + ". The seeds of a tuned point then ran with its chosen values.", ""]
    header = ["point", "trial", *(k.rsplit(".", 1)[-1] for k in keys), first["metric"], "state", "fit seconds"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    edges = []
    for name, point in record.items():
        chosen = point.get("chosen")
        for trial in point["trials"]:
            won = chosen is not None and trial["state"] == "COMPLETE" and trial["params"] == chosen
            value = "" if trial["value"] is None else f"{trial['value']:.4f}"
            cells = [name, str(trial["number"]), *(short(trial["params"].get(k, "")) for k in keys),
                     f"**{value}**" if won else value, trial["state"].lower(),
                     "" if trial["seconds"] is None else f"{trial['seconds']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
        edges += [f"{name}: {k.rsplit('.', 1)[-1]} = {short(v)}" for k, v in (chosen or {}).items()
                  if k in point["space"] and on_edge(point["space"][k], v)]
    spent = sum(t["seconds"] or 0 for point in record.values() for t in point["trials"])
    lines += ["", f"Bold: the trial each point kept. The tuning spent {spent / 60:.1f} minutes of fits "
                  f"({sum(len(p['trials']) for p in record.values())} trials)."]
    if edges:
        lines += ["", "On the edge of the range searched (the best may lie beyond it, so the optimum is not "
                      f"bracketed): {'; '.join(edges)}."]
    return lines
