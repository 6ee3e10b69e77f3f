"""`attnlab ablate-heads`: how much each attention head matters to a trained model.

Evaluates a metric on the validation split with all heads, with each head masked in turn, with
each module's heads all masked, and while heads are pruned cumulatively from the least
important (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"). A masked head's
output is zeroed before the output projection (`MultiHeadAttention.mask_heads`), so masking
every head of a module leaves only that projection's bias. Every evaluation sees the same
batches and, for BlockDiffusion, the same noise: differences come from the mask alone.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from attnlab.errors import AttnlabError
from attnlab.probes.attention_maps import evaluating

HIGHER_IS_BETTER = {"nll": False, "chrf": True, "bleu": True, "exact_match": True}
DESCRIPTION = """Measure each attention head's importance in a trained checkpoint.

The metric is evaluated on the validation split with all heads, then with each head masked
(modules are named like decoder.0.self, encoder.1.self, decoder.0.cross), then with each
module's heads all masked, then while heads are pruned cumulatively from the least important
(the change when masked alone), as in Michel et al. (2019). nll (default) is the teacher-forced
val NLL per target token; chrf, bleu and exact_match generate, which is much slower.

The data module is rebuilt from the run's config.yaml (next to the checkpoints/ folder) or
from --config; relative data paths in it are read from the current directory. Writes
head_ablation.md, head_ablation.json and pruning_curve.png to <run>/head_ablation/ (or --output).
"""


def attention_modules(module) -> dict:
    """Every MultiHeadAttention of a family, by name: `<stack>.<layer>.<self|cross>`."""
    named = {}
    for stack_name, stack in module.attention_stacks().items():
        for kind in ("self", "cross"):
            for layer, attention in enumerate(stack.attention_modules(kind)):
                named[f"{stack_name}.{layer}.{kind}"] = attention
    return named


def apply_mask(modules: dict, masked) -> None:
    """Mask exactly the (module name, head) pairs given; an empty list restores every head."""
    by_module = {name: [] for name in modules}
    for name, head in masked:
        by_module[name].append(head)
    for name, attention in modules.items():
        attention.mask_heads(by_module[name])


def make_batches(module, examples, batch_size: int) -> list[dict]:
    """The evaluation batches, collated once and moved to the module's device."""
    return [module.collate_on_device(examples[start : start + batch_size]) for start in range(0, len(examples), batch_size)]


def evaluate(module, batches: list[dict], metric: str = "nll") -> float:
    """The metric over the batches, with fixed noise (BlockDiffusion) and a fixed sampling seed."""
    from attnlab.families.metrics import EvalMetrics

    module.reset_eval_noise()
    torch.manual_seed(0)
    with evaluating(module):
        if metric == "nll":
            nll, tokens = 0.0, 0
            for batch in batches:
                terms = module.loss_terms(batch)
                nll, tokens = nll + float(terms.nll.sum()), tokens + int(terms.targets.sum())
            return nll / max(tokens, 1)
        metrics = EvalMetrics()
        for batch in batches:
            hypotheses = module.tokenizer.decode_batch(module.generate_ids(batch))
            metrics.update_generation(hypotheses, batch["target_text"], 0, 1.0)
        return metrics.compute("val")[f"val/{metric}"]


def ablate(module, batches: list[dict], metric: str = "nll", log=lambda line: None) -> dict:
    """All the measurements, as plain data; every head is restored afterwards."""
    modules = attention_modules(module)
    sign = -1.0 if HIGHER_IS_BETTER[metric] else 1.0  # damage = sign * (masked - base)
    try:
        base = evaluate(module, batches, metric)
        log(f"all heads: {metric} {base:.4f}")
        heads, whole = [], []
        for name, attention in modules.items():
            for head in range(attention.n_heads):
                apply_mask(modules, [(name, head)])
                value = evaluate(module, batches, metric)
                heads.append({"module": name, "head": head, "value": value, "delta": value - base})
            apply_mask(modules, [(name, h) for h in range(attention.n_heads)])
            value = evaluate(module, batches, metric)
            whole.append({"module": name, "value": value, "delta": value - base})
            log(f"{name}: all heads masked {metric} {value:.4f}")
        order = sorted(heads, key=lambda r: sign * r["delta"])  # least important first
        pruning, pruned = [{"pruned": 0, "head": None, "value": base}], []
        for row in order:
            pruned.append((row["module"], row["head"]))
            apply_mask(modules, pruned)
            pruning.append({"pruned": len(pruned), "head": f"{row['module']}:{row['head']}",
                            "value": evaluate(module, batches, metric)})
        log(f"pruned every head: {metric} {pruning[-1]['value']:.4f}")
    finally:
        apply_mask(modules, [])
    return {"metric": metric, "higher_is_better": HIGHER_IS_BETTER[metric], "base": base,
            "heads": heads, "modules": whole, "pruning": pruning}


def markdown(result: dict, title: str) -> str:
    metric, base = result["metric"], result["base"]
    better = "higher" if result["higher_is_better"] else "lower"
    n_heads = max(r["head"] for r in result["heads"]) + 1
    lines = [f"# Head ablation: {title}", "",
             f"{metric} ({better} is better) with all heads: **{base:.4f}** "
             f"on {result.get('examples', '?')} validation examples.",
             "", f"Change of {metric} when one head (or a module's every head) is masked:", "",
             "| module | " + " | ".join(f"head {h}" for h in range(n_heads)) + " | all heads |",
             "|---" * (n_heads + 2) + "|"]
    deltas = {(r["module"], r["head"]): r["delta"] for r in result["heads"]}
    for row in result["modules"]:
        cells = [f"{deltas[(row['module'], h)]:+.4f}" if (row["module"], h) in deltas else "" for h in range(n_heads)]
        lines.append(f"| {row['module']} | " + " | ".join(cells) + f" | {row['delta']:+.4f} |")
    total = len(result["pruning"]) - 1
    shown = sorted({round(total * f) for f in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1)})
    lines += ["", "Heads pruned cumulatively, least important first (Michel et al., 2019):", "",
              f"| heads pruned | {metric} | last head pruned |", "|---|---|---|"]
    for point in (result["pruning"][k] for k in shown):
        lines.append(f"| {point['pruned']} / {total} | {point['value']:.4f} | {point['head'] or ''} |")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, output: Path, title: str) -> list[Path]:
    from attnlab.reports.plots import pyplot

    output.mkdir(parents=True, exist_ok=True)
    table, data, plot = output / "head_ablation.md", output / "head_ablation.json", output / "pruning_curve.png"
    table.write_text(markdown(result, title), encoding="utf-8")
    data.write_text(json.dumps(result, indent=2), encoding="utf-8")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    total = len(result["pruning"]) - 1
    ax.plot([p["pruned"] / total for p in result["pruning"]], [p["value"] for p in result["pruning"]], marker=".")
    ax.axhline(result["base"], color="grey", linestyle=":", label="all heads")
    ax.set_xlabel(f"fraction of the {total} heads pruned (least important first)")
    ax.set_ylabel(f"val {result['metric']}")
    ax.set_title(title, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    plt.close(fig)
    return [table, data, plot]


def find_config(checkpoint: Path, explicit: str | None) -> Path:
    if explicit:
        if not Path(explicit).is_file():
            raise AttnlabError(f"--config {explicit} does not exist: pass the YAML the checkpoint was trained with")
        return Path(explicit)
    candidate = checkpoint.resolve().parent.parent / "config.yaml"
    if not candidate.is_file():
        raise AttnlabError(
            f"no run config at {candidate} (a checkpoint in <run>/checkpoints/ has the run's config.yaml "
            "next to that folder): pass the experiment YAML it was trained with as --config FILE"
        )
    return candidate


def load_datamodule(config_path: Path):
    """Only the `data` section of a saved LightningCLI config, built the way LightningCLI builds it
    (the full CLI would also build a trainer, which may ask for an accelerator this machine lacks)."""
    from jsonargparse import ArgumentParser

    from data_modules.base import TokenizedDataModule

    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    if not isinstance(config, dict) or "data" not in config:
        raise AttnlabError(
            f"{config_path} has no data section: pass the experiment YAML the checkpoint was trained with as --config"
        )
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(TokenizedDataModule, "data")
    try:
        parsed = parser.parse_object({"data": config["data"]})
    except argparse.ArgumentError as err:
        raise AttnlabError(f"{config_path}: bad data section ({str(err).splitlines()[0]})") from None
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    return instantiate(parsed).data


def ablate_heads_main(argv: list[str]) -> int:
    from attnlab.checkpoints.reading import load_checkpoint

    parser = argparse.ArgumentParser(prog="attnlab ablate-heads", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a .ckpt written by attnlab fit (in <run>/checkpoints/)")
    parser.add_argument("--config", help="the run's YAML (default: <run>/config.yaml next to checkpoints/)")
    parser.add_argument("--metric", choices=sorted(HIGHER_IS_BETTER), default="nll", help="default: nll")
    parser.add_argument("--max-examples", type=int, help="evaluate on the first N validation examples only")
    parser.add_argument("--batch-size", type=int, help="default: the data module's eval_batch_size")
    parser.add_argument("--output", help="output folder (default: <run>/head_ablation)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda when available)")
    args = parser.parse_args(argv)
    for flag, value in (("--max-examples", args.max_examples), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise AttnlabError(f"{flag} {value} must be >= 1")
    checkpoint = Path(args.checkpoint)
    module, _ = load_checkpoint(checkpoint)
    config = find_config(checkpoint, args.config)
    datamodule = load_datamodule(config)
    if module.tokenizer is None:
        module.tokenizer = datamodule.tokenizer
    elif module.tokenizer.model_proto != datamodule.tokenizer.model_proto:
        raise AttnlabError(
            f"the data of {config} is tokenized differently from {checkpoint}: pass the config it was trained with"
        )
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    module.to(device)
    examples = datamodule.examples("val")[: args.max_examples]
    batches = make_batches(module, examples, args.batch_size or datamodule.eval_batch_size)
    result = ablate(module, batches, args.metric, log=lambda line: print(f"[ablate-heads] {line}", flush=True))
    result.update(checkpoint=str(checkpoint), config=str(config), examples=len(examples))
    output = Path(args.output) if args.output else checkpoint.resolve().parent.parent / "head_ablation"
    written = write_outputs(result, output, f"{module.family}, {checkpoint}")
    print("\n" + written[0].read_text(encoding="utf-8"))
    print(f"written: {', '.join(str(p) for p in written)}")
    return 0
