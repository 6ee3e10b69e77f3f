"""`attnlab sample-quality`: how good are a language model's samples, and what did they cost?

Likelihood bounds do not say what a diffusion model's samples look like when it is given fewer
model calls. This draws N unconditional continuations of `[bos]` of a fixed length from each
checkpoint (at several denoising steps per block for block diffusion), scores them with a
chosen autoregressive checkpoint ("generative perplexity", BD3-LM Table 7) and reports it beside
the number of model calls (NFE), the tokens/s and the unigram entropy of the samples (a sample
that repeats itself has low entropy and often a flattering perplexity).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from pathlib import Path

import torch

from attnlab.errors import AttnlabError, ConfigError
from attnlab.reports.provenance import context, measured_on
from attnlab.generation.model_calls import CallCounter
from data_modules.batch import pad_sequences

DESCRIPTION = __doc__.split("\n\n")[1].replace("\n", " ")
DEFAULT_STEPS = "1,2,4,8,16,32,64,128"


def unigram_entropy(sample: list[int]) -> float:
    """Entropy (nats) of the token frequencies within one sample; 0 for a single repeated token."""
    counts = Counter(sample)
    n = len(sample)
    return -sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0


@torch.no_grad()
def sample_nll(scorer, samples: list[list[int]], bos_id: int, pad_id: int, batch_size: int = 32) -> tuple[float, int]:
    """(summed NLL in nats, token count) of `samples` under a decoder-only model fed `[bos] sample`."""
    device = next(scorer.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(samples), batch_size):
        rows = [[bos_id] + s for s in samples[start : start + batch_size] if s]
        if not rows:
            continue
        tokens, lengths = (t.to(device) for t in pad_sequences(rows, pad_id))
        logits = scorer(tokens[:, :-1])  # right padding: causal attention keeps it out of every real position
        targets = tokens[:, 1:]
        real = torch.arange(tokens.shape[1] - 1, device=device)[None, :] < (lengths - 1)[:, None]
        nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
        total += float(nll[real].sum())
        count += int(real.sum())
    return total, count


def draw(module, n: int, length: int, setting: dict, sampling, seed: int, batch_size: int) -> tuple[list[list[int]], float, float]:
    """(samples of exactly `length` tokens, model calls per batch, seconds) from `[bos]`; eos does
    not stop a sample (it is the line break of the training text), so every sample has the same
    length. `setting`: one of the family's `sample_decodings` ({} for AR; unmasking, steps and
    threshold for block diffusion)."""
    ids = module.special
    generator = torch.Generator(device=next(module.model.parameters()).device).manual_seed(seed)
    samples: list[list[int]] = []
    start = time.perf_counter()
    with CallCounter(module.decoding_stack()) as counter:
        for first in range(0, n, batch_size):
            prompts = [[ids.bos]] * min(batch_size, n - first)
            common = dict(max_new_tokens=length, eos_id=-1, pad_id=ids.pad, sampling=sampling, generator=generator)
            samples += module.continue_ids(prompts, setting, **common)
    seconds = time.perf_counter() - start
    return samples, counter.calls / math.ceil(n / batch_size), seconds


def rescore_ids(samples: list[list[int]], source_tokenizer, scorer_tokenizer) -> list[list[int]]:
    """The samples in the scorer's pieces: the same ids when the tokenizers are one, else the
    decoded text re-encoded (lines joined by eos, as the training text was)."""
    if scorer_tokenizer.model_proto == source_tokenizer.model_proto:
        return samples
    from data_modules.token_files import chunk_text, join_lines

    return [join_lines(scorer_tokenizer.encode_batch(chunk_text(sample, source_tokenizer).split("\n")))
            for sample in samples]


UNMASKINGS = ("first_hitting", "confidence", "random")


def _continuing_families() -> str:
    """The registered families that continue text, for a refusal's words."""
    from attnlab.families import FAMILIES, FamilyModule

    return " or ".join(cls.__name__ for cls in FAMILIES.values() if cls.continue_ids is not FamilyModule.continue_ids)


def evaluate(checkpoints: list[Path], scorer_path: Path, *, n: int, length: int, steps: list[int],
             thresholds: list[float], sampling, seed: int, batch_size: int, device: str, log=print,
             unmasking: str = "first_hitting") -> list[dict]:
    from attnlab.checkpoints.reading import load_checkpoint

    scorer_module, _ = load_checkpoint(scorer_path)
    if not scorer_module.causal_lm or not scorer_module.plain_lm:
        raise ConfigError(f"--scorer {scorer_path}: a {scorer_module.family} checkpoint"
                          f"{'' if scorer_module.plain_lm else ' trained on pairs'}; the scorer must be a causal "
                          "language model (DecoderOnly) checkpoint trained on plain text (e.g. the "
                          "lm/compare_families decoder_only run)")
    scorer = scorer_module.model.to(device).eval()
    modules = []
    for path in checkpoints:
        module, _ = load_checkpoint(path)
        # the family's decodings to try ([] where it cannot continue text; for block diffusion,
        # first-hitting or confidence / random unmasking at each requested steps, then each threshold)
        settings = module.sample_decodings(steps, thresholds, unmasking)
        if not settings or not module.plain_lm:
            raise ConfigError(f"{path}: a {module.family} checkpoint{'' if module.plain_lm else ' trained on pairs'}; "
                              f"sample-quality draws from {_continuing_families()} checkpoints trained on plain text")
        modules.append((path, module.to(device).eval(), settings))
    rows = []
    for path, module, settings in modules:
        for setting in settings:
            samples, calls, seconds = draw(module, n, length, setting, sampling, seed, batch_size)
            scored = rescore_ids(samples, module.tokenizer, scorer_module.tokenizer)
            total, count = sample_nll(scorer, scored, scorer_module.special.bos, scorer_module.special.pad, batch_size)
            threshold = setting.get("threshold")
            row = {
                "checkpoint": str(path), "family": module.family, "autoregressive": module.autoregressive,
                "block_size": module.block_size,
                "unmasking": setting.get("unmasking", "autoregressive"),
                "steps_per_block": None if threshold is not None else setting.get("steps", 1),
                "threshold": threshold, "nfe": calls,
                "gen_ppl": math.exp(total / count) if count else float("nan"),
                "entropy": sum(map(unigram_entropy, samples)) / len(samples),
                "tokens_per_s": n * length / seconds, "samples": n, "length": length,
            }
            rows.append(row)
            log(f"{_label(row)}: NFE {calls:.1f}, generative perplexity {row['gen_ppl']:.1f}, "
                f"entropy {row['entropy']:.2f}, {row['tokens_per_s']:.0f} tokens/s")
    return rows


def _label(row: dict) -> str:
    if row["autoregressive"]:
        return "AR"
    return f"BD block {row['block_size']}, {_decoding(row)}"


def _decoding(row: dict) -> str:
    if row["autoregressive"]:
        return "one token a call"
    if row["threshold"] is not None:
        return f"threshold {row['threshold']:g}"
    return f"{row['steps_per_block']} steps/block ({row['unmasking']})"


def markdown(rows: list[dict], scorer: Path, measured: dict | None = None) -> str:
    """The table, after a line saying how it was measured (`measured`: provenance.context)."""
    lines = []
    if measured:
        lines += [f"`{measured['command']}`, {measured['date']}, {measured_on(measured)}.", ""]
    lines += [f"Generative perplexity under {scorer} ({rows[0]['samples']} samples of {rows[0]['length']} tokens "
             "each); NFE: model calls per batch of samples (threshold decoding: a block takes the calls its "
             "hardest row needs); entropy: the mean unigram entropy of a sample, in nats.", "",
             "| model | block | decoding | NFE | gen. PPL | entropy | tokens/s |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        model = "AR" if r["autoregressive"] else "BD"
        lines.append(f"| {model} | {r['block_size']} | {_decoding(r)} | {r['nfe']:.1f} | {r['gen_ppl']:.1f} | "
                     f"{r['entropy']:.2f} | {r['tokens_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> Path:
    """Generative perplexity and sample entropy against model calls, one line per checkpoint
    (threshold decoding dashed); AR is a star: it has one point, one call a token."""
    from attnlab.reports.plots import pyplot

    plt = pyplot()
    fig, (quality, entropy) = plt.subplots(1, 2, figsize=(11, 4.2))
    for checkpoint in dict.fromkeys(r["checkpoint"] for r in rows):
        mine = [r for r in rows if r["checkpoint"] == checkpoint]
        first = mine[0]
        if first["autoregressive"]:
            name, styles = "AR", (("*", "black"),)
        else:
            name = f"BD block {first['block_size']}" + (" (MDLM)" if first["block_size"] >= first["length"] else "")
            styles = None
        for adaptive, style in ((False, "-o"), (True, "--^")):
            line = sorted((r for r in mine if (r["threshold"] is not None) == adaptive), key=lambda r: r["nfe"])
            if not line:
                continue
            label = f"{name}{', threshold' if adaptive else ''}"
            for ax, key in ((quality, "gen_ppl"), (entropy, "entropy")):
                xs, ys = [r["nfe"] for r in line], [r[key] for r in line]
                if styles:
                    ax.plot(xs, ys, styles[0][0], color=styles[0][1], markersize=14, label=label, zorder=5)
                else:
                    ax.plot(xs, ys, style, label=label)
    for ax, ylabel in ((quality, "generative perplexity (AR scorer, log)"), (entropy, "unigram entropy of a sample (nats)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"model calls (NFE) for {rows[0]['length']} tokens")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    quality.set_yscale("log")
    entropy.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{flag} {value} must be >= 1")


def sample_quality_main(argv: list[str]) -> int:
    from attnlab.cli.preflight import check_run_root
    from attnlab.generation.sampling import SamplingConfig

    parser = argparse.ArgumentParser(prog="attnlab sample-quality", description=DESCRIPTION)
    parser.add_argument("checkpoints", nargs="+", help="DecoderOnly / BlockDiffusion .ckpt files trained on plain text")
    parser.add_argument("--scorer", required=True, help="the DecoderOnly plain-text checkpoint that scores every sample")
    parser.add_argument("--samples", type=int, default=64, help="continuations per point (default: 64)")
    parser.add_argument("--length", type=int, default=128, help="tokens per sample (default: 128)")
    parser.add_argument("--unmasking", choices=UNMASKINGS, default="first_hitting",
                        help="block diffusion's sampler: first_hitting (BD3-LM's, one uniformly chosen position a "
                             "call, as its Table 7 samples), or confidence / random at each of --steps (default: first_hitting)")
    parser.add_argument("--steps", default=DEFAULT_STEPS,
                        help=f"with --unmasking confidence or random: denoising steps per block to try, those a block allows (default: {DEFAULT_STEPS})")
    parser.add_argument("--thresholds", default="",
                        help="also decode block diffusion adaptively with these thresholds, e.g. 0.5,0.7,0.9 (default: none)")
    parser.add_argument("--temperature", type=float, default=1.0, help="default: 1.0 (0 = greedy)")
    parser.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling as BD3-LM samples (default: 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default: 0)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples drawn at once (default: 64)")
    parser.add_argument("--output", default="runs/sample_quality", help="folder for the table, JSON and plot (default: runs/sample_quality)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda when available)")
    args = parser.parse_args(argv)
    for flag, value in (("--samples", args.samples), ("--length", args.length), ("--batch-size", args.batch_size)):
        _positive(flag, value)
    try:
        steps = [int(s) for s in args.steps.split(",")]
    except ValueError:
        raise ConfigError(f"--steps {args.steps!r}: must be comma-separated integers, e.g. 1,2,4,8") from None
    for s in steps:
        _positive("--steps", s)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--thresholds {args.thresholds!r}: must be comma-separated probabilities, e.g. 0.5,0.9") from None
    for t in thresholds:
        if not 0.0 <= t <= 1.0:
            raise ConfigError(f"--thresholds: {t} is not a probability in [0, 1]")
    paths = [Path(p) for p in args.checkpoints]
    for path in [*paths, Path(args.scorer)]:
        if not path.is_file():
            raise AttnlabError(f"checkpoint {path}: no such file; pass a .ckpt written by attnlab fit")
    check_run_root(args.output, "--output")
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rows = evaluate(paths, Path(args.scorer), n=args.samples, length=args.length, steps=steps,
                    thresholds=thresholds, sampling=sampling, unmasking=args.unmasking,
                    seed=args.seed, batch_size=args.batch_size, device=device,
                    log=lambda line: print(f"[sample-quality] {line}", flush=True))
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, Path(args.scorer), context("attnlab sample-quality " + " ".join(argv)))
    (output / "sample_quality.md").write_text(table, encoding="utf-8")
    (output / "sample_quality.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    figure = plot(rows, output / "sample_quality.png")
    print("\n" + table)
    print(f"written: {output / 'sample_quality.md'}, {output / 'sample_quality.json'}, {figure}")
    return 0
