"""p by draft position: the main job's converted model decoded by draft-and-verify with drafts of
several block sizes (issue 47, item 2: how often a drafted token equals the AR view's choice, by its
place after the AR view's own token).

For every seed of the sweep's `block_diffusion_from_ar` point, its `verify` evaluation is run again
(`attnlab test` with that evaluation's config.yaml: the same checkpoint, data and batch) with
`model.init_args.block_size` set to each of BLOCKS: the same weights, trained on blocks of 4,
drafting shorter or longer blocks. Into SWEEP_draft_positions/seed<k>/block<n>/ (beside the sweep folder, whose
report would read them as rows); runs already there are kept.
The table gives per block size the seeds' mean of test BLEU, k (tokens per call), p over every
draft reached and p by draft position, and checks that every block size decoded the same text
(greedy draft-and-verify is the AR view's greedy decoding whatever the drafts).
With `--page FILE` the markdown replaces what FILE holds between `<!-- generated: draft_positions -->`
and `<!-- /generated -->`.
Run (from the repository root the sweep ran in): python scripts/draft_positions.py runs/compare_families [--page docs/results/draft_positions.md]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from attnlab.reports.provenance import context, measured_on
from attnlab.reports.publish import replace_generated
from attnlab.reports.runs import last_values, read_metrics
from attnlab.training.examples_file import read_examples

POINT = "block_diffusion_from_ar"


def evaluations(sweep: Path) -> list[Path]:
    """The verify evaluation folders of the converted point, one per seed."""
    found = sorted((sweep / POINT).glob("seed*/verify/config.yaml"))
    if not found:
        raise SystemExit(f"error: {sweep / POINT} has no seed*/verify/config.yaml: run the main job "
                         "(attnlab sweep experiments/compare_families.yaml) first")
    return [f.parent for f in found]


def decode(verify: Path, out: Path, block: int) -> Path:
    """`attnlab test` of the verify evaluation's config with drafts of `block` tokens, into `out`."""
    folder = out / verify.parent.name / f"block{block}"
    if (folder / "metrics.csv").is_file():
        return folder
    command = [sys.executable, "-m", "attnlab", "test", "--config", str(verify / "config.yaml"),
               "--model.init_args.block_size", str(block), "--model.init_args.denoising_steps", "null",
               "--run.root", str(out.parent),
               "--run.name", f"{out.name}/{verify.parent.name}", "--run.version", f"block{block}",
               "--run.wandb", "disabled"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    return folder


def draft_width(metrics) -> int:
    """The last draft position (`test/draft_p<i>`) any of these evaluations' metrics logged."""
    return max(int(key.removeprefix("test/draft_p")) for m in metrics for key in m
               if re.fullmatch(r"test/draft_p\d+", key))


def table(folders: dict[int, list[Path]]) -> list[str]:
    metrics = {b: [last_values(read_metrics(f / "metrics.csv")) for f in fs] for b, fs in folders.items()}
    width = draft_width(m for ms in metrics.values() for m in ms)
    lines = ["| drafts (block size) | seeds | test BLEU | k (tokens/call) | p (all drafts) | "
             + " | ".join(f"p{i}" for i in range(1, width + 1)) + " |", "|---|---|---|---|---|" + "---|" * width]
    for block, ms in metrics.items():
        def cell(key: str, spread: bool = False) -> str:
            values = [m[key] for m in ms if key in m and m[key] == m[key]]  # nan: no call reached it
            if not values:
                return "—"
            mean = f"{statistics.fmean(values):.2f}"
            return mean + (f" ± {statistics.stdev(values):.2f}" if spread and len(values) > 1 else "")
        lines.append(f"| {block} | {len(ms)} | {cell('test/bleu', True)} | {cell('test/tokens_per_call', True)} | "
                     f"{cell('test/draft_p', True)} | " + " | ".join(cell(f"test/draft_p{i}") for i in range(1, width + 1))
                     + " |")
    same = all(len({tuple(e["hypothesis"] for e in read_examples(fs[i])) for fs in folders.values()}) == 1
               for i in range(len(next(iter(folders.values())))))
    lines += ["", "Mean over the seeds (± their std). p_i: the share of the i-th drafts after the AR view's own token "
              "that the AR view agreed with, among those a call reached (every draft before them agreed); — where "
              "no call reached one. Every block size decoded the same text in each seed (greedy draft-and-verify "
              f"is the AR view's greedy decoding): {'yes' if same else 'NO'}."]
    return lines


def main(sweep: Path, blocks: list[int], page: Path | None) -> None:
    verifies = evaluations(sweep)
    out = sweep.parent / f"{sweep.name}_draft_positions"  # beside the sweep: its report reads every run inside it
    folders = {b: [decode(v, out, b) for v in verifies] for b in blocks}
    record = context(f"python scripts/draft_positions.py {sweep} --blocks {' '.join(map(str, blocks))}")
    markdown = "\n".join([f"**Command.** `{record['command']}`", "",
                          f"**Measured** {record['date']} on {measured_on(record)}; the checkpoints of "
                          f"`{sweep / POINT}` (seeds {', '.join(v.parent.name.removeprefix('seed') for v in verifies)}), "
                          "each decoding the test split at its verify evaluation's batch.", "", *table(folders)])
    print(markdown)
    if page is not None:
        replace_generated(page, "draft_positions", markdown)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="the main job's sweep folder (runs/compare_families)")
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4, 8, 16], help="block sizes (default 2 4 8 16)")
    parser.add_argument("--page", type=Path, help="a results page whose generated block to replace")
    args = parser.parse_args()
    main(args.sweep, args.blocks, args.page)
