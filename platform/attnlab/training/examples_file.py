"""examples.jsonl, the per-example records of an evaluation (training/per_example.py), written
and read here without torch: `attnlab report` reads them for its paired tests.
"""
from __future__ import annotations

import json
from pathlib import Path

FILE = "examples.jsonl"


def write_examples(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in sorted(records, key=lambda r: r["index"]):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_examples(folder: Path) -> list[dict] | None:
    """The records of a run folder's examples.jsonl, in split order, or None if it has none."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
