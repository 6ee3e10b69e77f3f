"""Adjacent rows of an lm/compare_families report against each other: is block 4 below block 8,
block 8 below block 16, ...? `attnlab report` tests every row against the reference (AR) only.

The same test as the report's: a paired t-test over the seeds both rows ran on their per-seed test
bpb (3 or more), Holm-adjusted over the adjacent pairs, from the report.json the sweep wrote.
Run: python scripts/lm_adjacent_pairs.py runs/lm/compare_families/report/report.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.reports.stats import MIN_SEEDS, holm, paired_t

ROWS = ["decoder_only", "block_diffusion_4_from_mdlm", "block_diffusion_8_from_mdlm", "block_diffusion_16_from_mdlm", "mdlm"]
COLUMN = "test bpb (best)"


def main(report: Path) -> None:
    rows = {row["run"]: row for row in json.loads(report.read_text())["rows"]}
    tests = []
    for a, b in zip(ROWS, ROWS[1:]):
        mine, theirs = (dict(zip(rows[n]["seeds"], rows[n][COLUMN]["values"])) for n in (a, b))
        shared = [s for s in mine if s in theirs]
        if len(shared) < MIN_SEEDS:
            raise SystemExit(f"{a} and {b} share {len(shared)} seeds; a test over training runs needs {MIN_SEEDS}")
        tests.append((a, b, paired_t([mine[s] for s in shared], [theirs[s] for s in shared])))
    print(f"| row | next row | {COLUMN} difference [95 % t interval] | p (Holm over {len(tests)}) |\n|---|---|---|---|")
    for (a, b, t), p in zip(tests, holm([t.p for *_, t in tests])):
        print(f"| {a} | {b} | {t.difference:+.4f} [{t.low:+.4f}, {t.high:+.4f}] | {p:.3g} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lm/compare_families/report/report.json"))
