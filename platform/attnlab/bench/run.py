"""`attnlab bench`: training tokens/s with MFU, the decoding table (tokens/s, model calls and
latency per token of every decoding, eager and compiled) and attention memory against sequence
length, for the families and their references, as tables and JSON (and on a results page)."""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import time
import os
import platform as host
import re
import statistics
from dataclasses import asdict, fields, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnlab.bench.calls import bench_calls
from attnlab.bench.contenders import (
    REFERENCE_OF,
    Options,
    bench_lengths,
    family_flops_per_token,
    generation_steps,
    platform_module,
    training_steps,
)
from attnlab.families import FAMILIES, DecoderOnly
from attnlab.training.flops import PEAK_SIZES, matmul_step, table_peak
from attnlab.training.mfu import precision_dtype
from attnlab.bench.memory import kv_cache_bytes, peak_bytes
from attnlab.bench.report import check_targets, format_report
from attnlab.bench.shapes import SIZES, BenchShape, resolve_shape
from attnlab.bench.timing import interleaved_rounds
from attnlab.errors import AttnlabError
from attnlab.reports.provenance import commit, context, measured_on
from attnlab.generation.model_calls import CallCounter

LIST_FIELDS = ("memory_lengths", "gen_batches")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="attnlab bench",
        description="Measure the families against Hugging Face GPT-2, torch.nn.Transformer and each other, "
        "interleaved in one process; prints a table and writes JSON. Ratios are what to compare across "
        "machines, not absolute times.",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu",
                        help="cpu: REFERENCE.md's CPU configuration (default); gpt2-small: the GPU goal")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument("--precision", choices=("32", "bf16-mixed"), default=None,
                        help="default: bf16-mixed on GPU, 32 on CPU (bf16 matmuls are far slower than fp32 on CPUs without native bf16)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model (the nn.Module, in place)")
    parser.add_argument("--no-fused-qkv", action="store_true", help="separate query and key/value projections")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--only", nargs="+", choices=("train", "generate", "calls", "memory"),
                        default=["train", "generate", "calls", "memory"],
                        help="calls: milliseconds per decoding call by kind and width (AR step, block and verify "
                             "calls of 4, 8 and 16 tokens), eager and compiled")
    parser.add_argument("--no-references", action="store_true", help="the families alone")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face GPT-2 (no transformers installed)")
    parser.add_argument("--warmup", type=int, default=8,
                        help="untimed training steps per contender (default 8: on CPU torch.nn.Transformer's step "
                             "settles only after about 8); generation warms up with one call")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed training rounds; the median is reported, and a ratio of two rows is the median of "
                             "their per-round ratios (default 5). Generation times "
                             "max(3, ROUNDS) rounds after one warm-up call, and gen_few_rounds (preset 3) after a "
                             "short warm-up call at batches of gen_few_rounds_from rows or more (preset 256)")
    parser.add_argument("--batch", type=int, help="decoder rows per training step (preset: 16)")
    parser.add_argument("--seq-len", type=int, help="decoder tokens per row (preset: 256 on cpu)")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="override any shape field of the preset, e.g. --set gen_new=64 ed_batch=32 "
                        f"(fields: {', '.join(f.name for f in fields(BenchShape))})")
    parser.add_argument("--output", "-o", default="bench.json", help="where to write the JSON (default bench.json)")
    parser.add_argument("--page", type=Path, metavar="PATH",
                        help="a markdown page whose block between the lines <!-- generated: bench --> and "
                        "<!-- /generated --> (added at its end if absent) to replace with the command, date, "
                        "machine, commit, torch and the tables")
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.rounds < 1:
        parser.error("--warmup must be >= 0 and --rounds >= 1")
    if args.page is not None:
        check_page(args.page)
    wants_hf = DecoderOnly.family in args.families and not (args.no_hf or args.no_references)
    if wants_hf and importlib.util.find_spec("transformers") is None:
        raise AttnlabError("the GPT-2 reference needs Hugging Face transformers: pip install -e '.[bench]' "
                           "(or pass --no-hf to bench without it)")
    return args


def parse_overrides(items: list[str]) -> dict:
    """`--set field=value` pairs, typed like the BenchShape field (lengths as comma lists)."""
    known = {f.name: f for f in fields(BenchShape)}
    overrides = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in known or not value:
            raise AttnlabError(f"--set {item}: expected FIELD=VALUE with FIELD one of {', '.join(known)}")
        try:
            overrides[name] = tuple(int(v) for v in value.split(",")) if name in LIST_FIELDS else int(value)
        except ValueError:
            raise AttnlabError(f"--set {item}: {name} takes an integer" + (
                " list such as 1024,2048" if name in LIST_FIELDS else "")) from None
        if min(overrides[name] if name in LIST_FIELDS else (overrides[name],)) < 1:
            raise AttnlabError(f"--set {item}: {name} must be positive")
    return overrides


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AttnlabError(f"--device {name}: torch sees no CUDA device here (use --device cpu)")
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.get_num_threads()} threads"


def cpu_model() -> str:
    """The CPU's marketing name where Linux tells it (/proc/cpuinfo), else the architecture."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{host.machine()} CPU"


def bench_training(shape, options, args, peaks, say):
    """Training steps of every contender, interleaved with square matmuls of several sizes: the
    fastest matmul is the measured peak, taken under the same conditions as the models. A model
    faster still raises the peak to its own rate (flagged), so MFU never reads above 100 %."""
    steps, tokens, modules = training_steps(shape, options, args.families, not args.no_references, not args.no_hf)
    dtype = precision_dtype(options.precision)
    matmuls = {}
    for size in PEAK_SIZES.get(options.device.type, PEAK_SIZES["cuda"]):
        matmuls[f"matmul {size}"] = matmul_step(size, options.device, dtype)
    say(f"training: {', '.join(steps)} ({args.rounds} interleaved rounds after {args.warmup} warm-up steps)")
    times = interleaved_rounds({**steps, **{n: step for n, (step, _) in matmuls.items()}},
                               args.warmup, args.rounds, options.device, say)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    peaks["by_size"] = {name: flops / seconds.pop(name) for name, (_, flops) in matmuls.items()}
    peaks["measured"] = max(peaks["by_size"].values())
    results = {}
    for name, s in seconds.items():
        family = REFERENCE_OF.get(name, name)
        flops = family_flops_per_token(family, modules[family].model, shape.vocab, *bench_lengths(shape, family))
        results[name] = {"seconds_per_step": s, "tokens_per_step": tokens[name],
                         "tokens_per_s": tokens[name] / s, "flops_per_token": flops, "round_seconds": times[name]}
    fastest = max(r["tokens_per_s"] * r["flops_per_token"] for r in results.values())
    peaks["raised_to_fastest_model"] = fastest > peaks["measured"]
    peaks["measured"] = max(peaks["measured"], fastest)
    for r in results.values():
        r.update({f"mfu_{kind}": r["tokens_per_s"] * r["flops_per_token"] / peaks[kind]
                  for kind in ("measured", "table") if peaks.get(kind)})
    return results, modules


def generation_rounds(shape: BenchShape, batch: int, rounds: int) -> tuple[int, int]:
    """(timed rounds, new tokens of the warm-up call) at `batch`: max(3, rounds) rounds after a
    full-length warm-up call (the targets compare rows within a few per cent of each other, and a
    round's ratios scatter on a shared CPU), or, from gen_few_rounds_from rows on,
    gen_few_rounds after a short one (two blocks of tokens: enough for every compiled step to run,
    so any compiling happens there)."""
    if batch >= shape.gen_few_rounds_from:
        return shape.gen_few_rounds, min(shape.gen_new, 2 * shape.block_size)
    return max(3, rounds), shape.gen_new


def counting(decoding, counter: CallCounter | None, calls: dict):
    """`decoding.run`, putting the model calls `counter` (open on its stack) sees into
    `calls[name]` the first time it runs."""

    def run():
        before = None if counter is None or decoding.name in calls else counter.calls
        decoding.run()
        if before is not None:
            calls[decoding.name] = counter.calls - before
    return run


def compile_costs(first_call: float, compiled: dict, eager: dict) -> dict:
    """What compiling costs a compiled row: `compile_s`, its first call's seconds over a timed one's
    (the graphs of this batch's shapes that earlier batches did not compile), and `pays_after_calls`,
    the decoding calls that win those seconds back at the per-call saving measured against its
    eager twin (None where compiled is not faster)."""
    compile_s = max(0.0, first_call - compiled["seconds"])
    saved = (eager["seconds"] - compiled["seconds"]) / compiled["calls"] if compiled.get("calls") else 0.0
    return {"compile_s": compile_s, "pays_after_calls": math.ceil(compile_s / saved) if saved > 0 else None}


def bench_generation(shape, options, modules, args, say):
    """At each batch size of `gen_batches` (keys: the batch size), every contender's median seconds
    per call (gen_new new tokens per row), new tokens/s, model calls per new token of a row and
    milliseconds per new token (what one row waits: seconds per call / gen_new)."""
    results = {}
    references, hf = not args.no_references, not args.no_hf
    for batch in shape.gen_batches:
        contenders = generation_steps(shape, options, modules, references, hf, batch)
        rounds, warmup_new = generation_rounds(shape, batch, args.rounds)
        say(f"generation at batch {batch}: {', '.join(contenders)} ({shape.gen_new} new tokens per row; "
            f"{rounds} timed round{'s' * (rounds > 1)} after a warm-up call of {warmup_new} new tokens)")
        calls: dict[str, int] = {}
        warmup = int(warmup_new == shape.gen_new)
        # Stacks compiled for training (--compile) run eagerly here, as attnlab's evaluation runs
        # them; the `_compiled` rows compile their own decode step (compiled_step.py). Warm-up:
        # one call each, which is where the decode steps compile. Calls are counted in each
        # contender's first full-length call: the warm-up, or after a short warm-up the timed one.
        # The counters stay open on every stack from the warm-up to the last round: Dynamo guards
        # on a module's hooks, so a step compiled with a counter's hook and timed without it
        # would compile again in the first timed round.
        with contextlib.ExitStack() as hooks, torch.compiler.set_stance("force_eager"):
            stacks = {id(d.stack): d.stack for d in contenders.values() if d.stack is not None}
            counters = {key: hooks.enter_context(CallCounter(stack)) for key, stack in stacks.items()}
            steps = {name: counting(decoding, counters.get(id(decoding.stack)), calls)
                     for name, decoding in contenders.items()}
            if warmup_new != shape.gen_new:
                for name, decoding in generation_steps(shape, options, modules, references, hf, batch,
                                                       new=warmup_new).items():
                    say(f"  warming up {name} ({warmup_new} new tokens)")
                    decoding.run()
            first: dict[str, float] = {}
            times = interleaved_rounds(steps, warmup, rounds, options.device, say, first)
        rows = {}
        for name, t in times.items():
            decoding, s = contenders[name], statistics.median(t)
            n_calls = calls.get(name)
            rows[name] = {
                "family": decoding.family, "decoding": decoding.decoding,
                "mode": "compiled" if decoding.compiled else "eager",
                "seconds": s, "tokens_per_s": batch * shape.gen_new / s,
                "calls": n_calls, "calls_per_token": None if n_calls is None else n_calls / shape.gen_new,
                "ms_per_token": 1000 * s / shape.gen_new, "round_seconds": t,
            }
        for name, row in rows.items():
            eager = rows.get(name.removesuffix("_compiled"))
            if row["mode"] == "compiled" and name in first:
                row.update(compile_costs(first[name], row, eager))
        results[str(batch)] = rows
    return results


def bench_memory(shape, options, dtype, say):
    results = {}
    for backend in ("sdpa", "math"):
        lengths = [n for n in shape.memory_lengths if backend == "sdpa" or n <= shape.memory_math_max]
        say(f"attention memory ({backend}): lengths {lengths}")
        results[backend] = {n: peak_bytes(n, shape.d_model, shape.n_heads, backend, options.device, dtype) for n in lengths}
    results["gqa"] = bench_gqa_memory(shape, options, dtype, say)
    return results


def bench_gqa_memory(shape, options, dtype, say):
    """KV cache bytes of a DecoderOnly decode (the largest generation batch, prompt + new tokens)
    and one sdpa attention layer's peak (fwd + bwd, the first memory length) at n_kv_heads 1, 2
    and n_heads: GQA shrinks both by storing and reading only the KV heads."""
    batch, tokens, length = max(shape.gen_batches), shape.gen_prompt + shape.gen_new, shape.memory_lengths[0]
    results = {}
    for n_kv in sorted({1, 2, shape.n_heads}):
        if shape.n_heads % n_kv:
            continue
        say(f"GQA memory: n_kv_heads {n_kv}")
        model = platform_module(DecoderOnly.family, replace(shape, n_kv_heads=n_kv), options).model.eval()
        results[str(n_kv)] = {
            "cache_bytes": kv_cache_bytes(model, batch, tokens), "cache_batch": batch, "cache_tokens": tokens,
            "attention_peak_bytes": peak_bytes(length, shape.d_model, shape.n_heads, "sdpa", options.device, dtype,
                                               n_kv_heads=n_kv),
            "attention_length": length,
        }
    return results


PAGE_MARKERS = ("<!-- generated: bench -->", "<!-- /generated -->")
_PAGE_BLOCK = re.compile(re.escape(PAGE_MARKERS[0]) + r"\n(?:.*?\n)?" + re.escape(PAGE_MARKERS[1]), re.S)


def _read_page(page: Path) -> str:
    with open(page, encoding="utf-8", newline="") as text:  # newline="": line ends as they are
        return text.read()


def check_page(page: Path) -> None:
    """Fail before any work where --page could not be rewritten at the end."""
    where = f"--page {page}:"
    if not page.parent.is_dir():
        raise AttnlabError(f"{where} no folder {page.parent}")
    if page.exists():
        if not page.is_file():
            raise AttnlabError(f"{where} not a file")
        if not os.access(page, os.R_OK | os.W_OK):
            raise AttnlabError(f"{where} not writable")
        try:
            text = _read_page(page)
        except UnicodeDecodeError:
            raise AttnlabError(f"{where} not UTF-8 text") from None
        if PAGE_MARKERS[0] in text and not _PAGE_BLOCK.search(text):
            raise AttnlabError(f"{where} has a {PAGE_MARKERS[0]} line without a {PAGE_MARKERS[1]} line after it")
    elif not os.access(page.parent, os.W_OK):
        raise AttnlabError(f"{where} folder {page.parent} not writable")


def page_markdown(result: dict) -> str:
    """The generated block: how and where the run was made, then the report's tables."""
    record, s = result["provenance"], result["shape"]
    shape = (f"vocab {s['vocab']}, d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads, d_ff {s['d_ff']}, "
             f"training batch {s['batch']} x {s['seq_len']} tokens; encoder-decoder {s['ed_layers']} + {s['ed_layers']} "
             f"layers, batch {s['ed_batch']} x {s['ed_len']}; generation: {s['gen_prompt']}-token prompts, "
             f"{s['gen_new']} new tokens, block size {s['block_size']}, beam {s['gen_beam']}")
    return "\n".join([
        f"Generated by `{record['command']}` on {record['date']} ({result['minutes']:.0f} min); measured on "
        f"{measured_on(record)}; device {result['device']}, precision {result['options']['precision']}.", "",
        f"Shape: {shape}.", "", format_report(result)])


def write_page(page: Path, markdown: str) -> None:
    """Replace the page's generated block (or add one at its end); the text around it stays byte for byte."""
    text = _read_page(page) if page.exists() else ""
    block = f"{PAGE_MARKERS[0]}\n{markdown}\n{PAGE_MARKERS[1]}"
    if _PAGE_BLOCK.search(text):
        text = _PAGE_BLOCK.sub(lambda _: block, text, count=1)
    else:
        text += ("\n" if text and not text.endswith("\n") else "") + ("\n" if text else "") + block + "\n"
    with open(page, "w", encoding="utf-8", newline="") as out:
        out.write(text)


def bench_main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32")
    options = Options(device, precision, args.compile, not args.no_fused_qkv)
    shape = resolve_shape(args.size, batch=args.batch, seq_len=args.seq_len, **parse_overrides(args.set))
    say = lambda message: print(message, flush=True)  # noqa: E731
    started = time.perf_counter()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    dtype = precision_dtype(precision)
    say(f"attnlab bench on {device_name(device)}, precision {precision}, compile {args.compile}")
    peaks = {"table": table_peak(device, precision)}  # bench_training adds the measured peak
    command = "attnlab bench " + " ".join(argv)
    # The commit of the attnlab checkout that runs, whatever the working folder.
    provenance = {**context(command), "commit": commit(Path(__file__).resolve().parent)}
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device_name(device),
        "torch": torch.__version__, "size": args.size, "shape": asdict(shape),
        "options": {"precision": precision, "compile": args.compile, "fused_qkv": options.fused_qkv},
        "peak_flops": peaks, "command": command, "provenance": provenance,
    }
    modules = {}
    if "train" in args.only:
        result["training"], modules = bench_training(shape, options, args, peaks, say)
    if "generate" in args.only:
        modules = modules or {f: platform_module(f, shape, options) for f in args.families}
        result["generation"] = bench_generation(shape, options, modules, args, say)
    if "calls" in args.only:
        result["calls"] = bench_calls(shape, options, args.rounds, say)
    if "memory" in args.only:
        result["memory"] = bench_memory(shape, options, dtype, say)
    result["targets"] = check_targets(result)
    result["minutes"] = (time.perf_counter() - started) / 60
    print(format_report(result))
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    if args.page is not None:
        write_page(args.page, page_markdown(result))
        print(f"rewrote the generated block of {args.page}")
    return 0
