"""The table of scripts/multi30k_from_ar.sh: every test evaluation under runs/multi30k, with
sacreBLEU's paired bootstrap against DecoderOnly greedy, each row's training cost, and whether
block diffusion meets the goal of issue 32 at batch 1.

One seed per recipe, so the p-values compare these trained models on these test sentences, not
recipes. An evaluation is a folder `<row>/<version>@b<batch>/` holding metrics.csv, examples.jsonl
and config.yaml (whose ckpt_path names the fit it tested); rows whose outputs differ between batch
sizes are flagged (each row should have one BLEU: decoding is deterministic).
With `--page FILE`, the markdown (provenance from ROOT/recipe.json, which the script writes when it
starts, table and goal) replaces what FILE holds between `<!-- generated: multi30k_table -->` and
`<!-- /generated -->`, so the page's numbers are never typed by hand.
Run: python scripts/multi30k_table.py [ROOT] [BASELINE] [--page FILE]
     (defaults: runs/multi30k, decoder_only/*greedy@b64)
"""
from __future__ import annotations

import argparse
import datetime
import json
from collections import defaultdict
from pathlib import Path

import yaml

from attnlab.reports.provenance import measured_on
from attnlab.reports.publish import replace_generated
from draft_positions import draft_width
from attnlab.reports.runs import last_values, read_metrics
from attnlab.reports.stats import sacrebleu_paired_p
from attnlab.training.examples_file import read_examples

# The goal of issue 32 for block diffusion, at eval batch 1 against DecoderOnly greedy.
GOAL_BLEU_GAP = 3.0  # at most this many sacreBLEU points below
GOAL_SPEEDUP = 2.0  # at least this many times its generated tokens/s
GOAL_CALLS_PER_TOKEN = 0.5  # two calls or fewer per block of 4
# Issue 47's bar for draft-and-verify, against DecoderOnly greedy at the same batch.
VERIFY_BLEU_GAP = 1.0
VERIFY_SPEEDUP = 1.5


def main(root: Path, baseline_glob: str, page: Path | None = None) -> None:
    folders = sorted(p.parent for p in root.glob("*/*@b*/metrics.csv"))
    baselines = sorted(root.glob(baseline_glob))
    if not folders or len(baselines) != 1:
        raise SystemExit(f"error: need test evaluations under {root} and exactly one baseline {baseline_glob} "
                         f"(found {len(baselines)}): run scripts/multi30k_from_ar.sh first")
    markdown = "\n".join([*_provenance(root, folders), "", *_table(root, folders, baselines[0]), "",
                          *_goal(root, folders, baselines[0]), "", *_verify_goal(root, folders, baselines[0])])
    print(markdown)
    if page is not None:
        replace_generated(page, "multi30k_table", markdown)


def _table(root: Path, folders: list[Path], baseline: Path) -> list[str]:
    examples = {f: read_examples(f) for f in folders}
    references = [e["reference"] for e in examples[baseline]]
    outputs = {f: [e["hypothesis"] for e in rows] for f, rows in examples.items() if rows}
    others = {str(f.relative_to(root)): outputs[f] for f in folders if f != baseline and f in outputs}
    p = {metric: sacrebleu_paired_p(metric, references, outputs[baseline], others) for metric in ("bleu", "chrf")}
    by_decoding = defaultdict(set)  # the same decoding at several batch sizes should give the same outputs
    for f in outputs:
        by_decoding[_decoding(f)].add(tuple(outputs[f]))
    lines = ["| evaluation | training | BLEU | p | chrF | p | calls/token | k | p (drafts) | tok/s | same outputs at every batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in folders:
        name = str(f.relative_to(root))
        row = _metrics(f)
        same = len(by_decoding[_decoding(f)]) == 1
        cells = [_training(_fit_folder(root, f)), f"{row.get('test/bleu', float('nan')):.2f}", _p(p["bleu"].get(name)),
                 f"{row.get('test/chrf', float('nan')):.2f}", _p(p["chrf"].get(name)),
                 f"{row.get('test/nfe_per_token', float('nan')):.2f}", _number(row.get("test/tokens_per_call")),
                 _number(row.get("test/draft_p")), f"{row.get('test/gen_tokens_per_s', float('nan')):,.0f}",
                 "yes" if same else "NO"]
        lines.append(f"| {name}{' (baseline)' if f == baseline else ''} | " + " | ".join(cells) + " |")
    lines += ["", "p: sacreBLEU's paired bootstrap (1,000 resamples) against the baseline; 1 where the outputs are "
              "the baseline's own. training: Lightning's training time (a converted model's includes the AR "
              "epochs it started from) and optimizer steps. k and p (draft-and-verify rows): tokens per call "
              "of a row, and the share of the drafts a call reached (every draft before them agreed) that the "
              "AR view agreed with."]
    return lines + _draft_positions(root, folders, outputs)


def _draft_positions(root: Path, folders: list[Path], outputs: dict[Path, list[str]]) -> list[str]:
    """p by draft position for the draft-and-verify evaluations, and whether they all decoded the same
    text: greedy draft-and-verify is the AR view's greedy decoding whatever the drafts and the batch."""
    rows = [f for f in folders if "test/tokens_per_call" in _metrics(f)]
    if not rows:
        return []
    width = draft_width(_metrics(f) for f in rows)
    lines = ["", "p by draft position (draft i: the i-th token after the AR view's own; — where no call reached it):", "",
             "| evaluation | k | " + " | ".join(f"p{i}" for i in range(1, width + 1)) + " |",
             "|---|---|" + "---|" * width]
    for f in rows:
        row = _metrics(f)
        cells = [_number(row.get(f"test/draft_p{i}")) for i in range(1, width + 1)]
        lines.append(f"| {f.relative_to(root)} | {_number(row.get('test/tokens_per_call'))} | " + " | ".join(cells) + " |")
    texts = {tuple(outputs[f]) for f in rows if f in outputs}
    lines += ["", f"Every draft-and-verify evaluation decoded the same text (block size and batch aside): "
              f"{'yes' if len(texts) == 1 else 'NO'}."]
    return lines


def goal_verdict(baseline: dict[str, float], candidate: dict[str, float]) -> tuple[bool, str]:
    """Does one block-diffusion decoding at batch 1 meet the goal against DecoderOnly greedy at batch 1?"""
    gap = baseline["test/bleu"] - candidate["test/bleu"]
    speedup = candidate["test/gen_tokens_per_s"] / baseline["test/gen_tokens_per_s"]
    calls = candidate["test/nfe_per_token"]
    checks = [(gap <= GOAL_BLEU_GAP, f"{gap:.2f} BLEU below (goal ≤ {GOAL_BLEU_GAP:g})"),
              (speedup >= GOAL_SPEEDUP, f"{speedup:.2f}× its tokens/s (goal ≥ {GOAL_SPEEDUP:g}×)"),
              (calls <= GOAL_CALLS_PER_TOKEN, f"{calls:.2f} calls per token (goal ≤ {GOAL_CALLS_PER_TOKEN:g})")]
    return all(ok for ok, _ in checks), ", ".join(text + ("" if ok else " ✗") for ok, text in checks)


def _goal(root: Path, folders: list[Path], baseline: Path) -> list[str]:
    reference = baseline.parent / (_decoding(baseline)[1] + "@b1")
    if not (reference / "metrics.csv").is_file():
        return [f"No goal check: {reference.relative_to(root)} (DecoderOnly greedy at batch 1) was not evaluated."]
    base = _metrics(reference)
    lines = ["**The goal** (issue 32): block diffusion within 3 sacreBLEU of DecoderOnly greedy, and at that "
             "quality at least 2× its generated tokens/s at batch 1, with two calls or fewer per block of 4. "
             f"Against {reference.relative_to(root)} ({base['test/bleu']:.2f} BLEU, "
             f"{base['test/gen_tokens_per_s']:,.0f} tok/s):", ""]
    met = []
    for f in folders:
        row = _metrics(f)
        if f.name.endswith("@b1") and "test/nfe_per_token" in row and f.parent != baseline.parent \
                and "test/tokens_per_call" not in row:
            ok, text = goal_verdict(base, row)
            met += [ok]
            lines.append(f"- {f.relative_to(root)}: {text}: {'**met**' if ok else 'not met'}")
    lines += ["", f"**The goal is {'met' if any(met) else 'not met'}** by "
              f"{sum(met)} of the {len(met)} block-diffusion decodings at batch 1."]
    return lines


def verify_verdict(baseline: dict[str, float], candidate: dict[str, float]) -> tuple[bool, str]:
    """Issue 47's check of a draft-and-verify decoding against DecoderOnly greedy at the same batch:
    within VERIFY_BLEU_GAP BLEU at VERIFY_SPEEDUP× its tokens/s or more. The speed-up is k · a / b
    (k tokens a call, a / b an AR step's cost over a verify call's), so b / a = k / speed-up, and the
    verdict names which of them keeps it under the bar."""
    gap = baseline["test/bleu"] - candidate["test/bleu"]
    speedup = candidate["test/gen_tokens_per_s"] / baseline["test/gen_tokens_per_s"]
    k = candidate["test/tokens_per_call"]
    cost = k / speedup  # b / a
    checks = [(gap <= VERIFY_BLEU_GAP, f"{gap:.2f} BLEU below (goal ≤ {VERIFY_BLEU_GAP:g})"),
              (speedup >= VERIFY_SPEEDUP, f"{speedup:.2f}× its tokens/s (goal ≥ {VERIFY_SPEEDUP:g}×)")]
    text = ", ".join(t + ("" if ok else " ✗") for ok, t in checks) + f"; k {k:.2f}, b / a {cost:.2f}"
    if speedup < VERIFY_SPEEDUP:
        text += (f" (at this b / a, k would have to reach {VERIFY_SPEEDUP * cost:.2f}; at this k, a call would "
                 f"have to cost {k / VERIFY_SPEEDUP:.2f} AR steps or less)")
    return all(ok for ok, _ in checks), text


def _verify_goal(root: Path, folders: list[Path], baseline: Path) -> list[str]:
    rows = [f for f in folders if "test/tokens_per_call" in _metrics(f)]
    if not rows:
        return []
    lines = ["**Draft-and-verify** (issue 47): within 1 sacreBLEU of DecoderOnly greedy at the same batch, at "
             f"≥ {VERIFY_SPEEDUP:g}× its tokens/s (the goal stays 2×):", ""]
    for f in rows:
        reference = baseline.parent / (_decoding(baseline)[1] + "@b" + f.name.rsplit("@b", 1)[1])
        if not (reference / "metrics.csv").is_file():
            lines.append(f"- {f.relative_to(root)}: no {reference.relative_to(root)} to compare with")
            continue
        ok, text = verify_verdict(_metrics(reference), _metrics(f))
        lines.append(f"- {f.relative_to(root)} against {reference.relative_to(root)}: {text}: "
                     f"{'**met**' if ok else 'not met'}")
    return lines


def _number(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def _provenance(root: Path, folders: list[Path]) -> list[str]:
    record_file = root / "recipe.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    stamps = [p.stat().st_mtime for p in root.glob("*/*/config.yaml")] + \
             [(f / "metrics.csv").stat().st_mtime for f in folders]
    when = [datetime.datetime.fromtimestamp(s, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            for s in (min(stamps), max(stamps))]
    return [f"**Command.** `{record.get('command', 'scripts/multi30k_from_ar.sh')}`", "",
            f"**Measured** {when[0]} to {when[1]} on {measured_on(record)}; "
            "Multi30k test2016 (1,000 sentences), cased sacreBLEU 13a and chrF; one seed."]


def _fit_folder(root: Path, evaluation: Path) -> Path | None:
    """The fit whose checkpoint `evaluation` tested (ckpt_path in its config.yaml is .../checkpoints/x.ckpt)."""
    config = yaml.safe_load((evaluation / "config.yaml").read_text()) if (evaluation / "config.yaml").is_file() else {}
    ckpt = (config or {}).get("ckpt_path")
    if not ckpt:
        return None
    for path in (Path(ckpt), root.parent.parent / ckpt):  # relative to the repository root the run started in
        if path.is_file():
            return path.parent.parent
    return None


def _training(fit: Path | None) -> str:
    summary_file = fit / "summary.json" if fit else None
    if summary_file is None or not summary_file.is_file():
        return "—"
    summary = json.loads(summary_file.read_text())
    ledger = summary.get("ledger", {})
    inherited = ledger.get("inherited")
    steps = summary["steps"]  # the inherited steps included
    total = _clock(ledger.get("train_seconds", summary["fit_seconds"]))
    split = f" ({_clock(inherited['seconds'])} AR + {_clock(ledger['train_seconds'] - inherited['seconds'])})" \
        if inherited else ""
    return f"{total}{split}, {steps:,} steps"


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _metrics(folder: Path) -> dict[str, float]:
    return last_values(read_metrics(folder / "metrics.csv"))


def _decoding(folder: Path) -> tuple[Path, str]:
    """(row folder, version without its batch size): `budget-tau=0.9@b64` -> `budget-tau=0.9`."""
    return folder.parent, folder.name.rsplit("@b", 1)[0]


def _p(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path("runs/multi30k"))
    parser.add_argument("baseline", nargs="?", default="decoder_only/*greedy@b64")
    parser.add_argument("--page", type=Path, help="a results page whose generated block to replace")
    args = parser.parse_args()
    main(args.root, args.baseline, args.page)
