"""Adjacent rows of an lm/compare_families sweep against each other: is block 4 below block 8,
block 8 below block 16, ...? `attnlab report` tests every row against the best one only.

Paired on (seed, test chunk) from each test's examples.jsonl, pooled over the seeds both rows
ran, with the report's own sign-flip permutation test on the per-chunk NLL.
Run: python scripts/lm_adjacent_pairs.py runs/lm/compare_families
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.experiment.stats import paired_permutation_p

ROWS = ["decoder_only", "block_diffusion_4", "block_diffusion_8", "block_diffusion_16", "mdlm"]


def pooled(root: Path, row: str, seeds: list[str]) -> list[dict]:
    out = []
    for seed in seeds:
        out += [json.loads(line) for line in (root / row / seed / "test" / "examples.jsonl").read_text().splitlines()]
    return out


def main(root: Path) -> None:
    for a, b in zip(ROWS, ROWS[1:]):
        seeds = sorted({p.name for p in (root / a).glob("seed*")} & {p.name for p in (root / b).glob("seed*")})
        x, y = pooled(root, a, seeds), pooled(root, b, seeds)
        if [(e["index"], e["tokens"]) for e in x] != [(e["index"], e["tokens"]) for e in y]:
            raise SystemExit(f"{a} and {b} were tested on different chunks")
        nll = [sum(e["nll"] for e in rows) / sum(e["tokens"] for e in rows) for rows in (x, y)]
        p = paired_permutation_p([e["nll"] for e in x], [e["nll"] for e in y])
        print(f"| {a} | {b} | {nll[0]:.4f} | {nll[1]:.4f} | {p:.4f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lm/compare_families"))
