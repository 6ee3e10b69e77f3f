"""The table of scripts/multi30k_from_ar.sh: every test evaluation under runs/multi30k, with
sacreBLEU's paired bootstrap against DecoderOnly greedy.

One seed per recipe, so the p-values compare these trained models on these test sentences, not
recipes. An evaluation is a folder `<row>/<version>@b<batch>/` holding metrics.csv and
examples.jsonl; rows whose outputs differ between batch sizes are flagged (each row should have one
BLEU: decoding is deterministic).
Run: python scripts/multi30k_table.py [ROOT] [BASELINE]   (defaults: runs/multi30k, decoder_only/*greedy@b64)
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from attnlab.experiment.runs import last_values, read_metrics
from attnlab.experiment.stats import sacrebleu_paired_p
from attnlab.training.per_example import read_examples


def main(root: Path, baseline_glob: str) -> None:
    folders = sorted(p.parent for p in root.glob("*/*@b*/metrics.csv"))
    baselines = sorted(root.glob(baseline_glob))
    if not folders or len(baselines) != 1:
        raise SystemExit(f"error: need test evaluations under {root} and exactly one baseline {baseline_glob} "
                         f"(found {len(baselines)}): run scripts/multi30k_from_ar.sh first")
    examples = {f: read_examples(f) for f in folders}
    references = [e["reference"] for e in examples[baselines[0]]]
    outputs = {f: [e["hypothesis"] for e in rows] for f, rows in examples.items() if rows}
    others = {str(f.relative_to(root)): outputs[f] for f in folders if f != baselines[0] and f in outputs}
    p = {metric: sacrebleu_paired_p(metric, references, outputs[baselines[0]], others) for metric in ("bleu", "chrf")}
    by_decoding = defaultdict(set)  # the same decoding at several batch sizes should give the same outputs
    for f in outputs:
        by_decoding[_decoding(f)].add(tuple(outputs[f]))
    print("| evaluation | BLEU | p | chrF | p | calls/token | tok/s | same outputs at every batch |")
    print("|---|---|---|---|---|---|---|---|")
    for f in folders:
        name = str(f.relative_to(root))
        row = last_values(read_metrics(f / "metrics.csv"))
        same = len(by_decoding[_decoding(f)]) == 1
        cells = [f"{row.get('test/bleu', float('nan')):.2f}", _p(p["bleu"].get(name)),
                 f"{row.get('test/chrf', float('nan')):.2f}", _p(p["chrf"].get(name)),
                 f"{row.get('test/nfe_per_token', float('nan')):.2f}",
                 f"{row.get('test/gen_tokens_per_s', float('nan')):,.0f}", "yes" if same else "NO"]
        print(f"| {name}{' (baseline)' if f == baselines[0] else ''} | " + " | ".join(cells) + " |")


def _decoding(folder: Path) -> tuple[Path, str]:
    """(row folder, version without its batch size): `budget-tau=0.9@b64` -> `budget-tau=0.9`."""
    return folder.parent, folder.name.rsplit("@b", 1)[0]


def _p(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/multi30k"),
         sys.argv[2] if len(sys.argv) > 2 else "decoder_only/*greedy@b64")
