"""The bench's verdicts (the ratios issue 6 sets as targets) and its printed table."""
from __future__ import annotations

# (what, numerator, denominator, section, target: the least acceptable ratio, None = informative)
TARGETS = [
    ("DecoderOnly training vs HF GPT2LMHeadModel", "decoder_only", "hf_gpt2", "training", 1.5),
    ("EncoderDecoder training vs torch.nn.Transformer", "encoder_decoder", "torch_transformer", "training", 1.2),
    ("BlockDiffusion training vs DecoderOnly", "block_diffusion", "decoder_only", "training", 0.45),
    ("DecoderOnly compiled generation vs HF generate, batch 1", "decoder_only_compiled", "hf_generate",
     "generation/1", 2.0),
    ("DecoderOnly eager generation vs HF generate, batch 1", "decoder_only", "hf_generate", "generation/1", None),
    ("EncoderDecoder greedy, compiled vs eager, batch 1", "encoder_decoder_compiled", "encoder_decoder",
     "generation/1", 1.0),
    ("EncoderDecoder beam, compiled vs eager, batch 1", "encoder_decoder_beam_compiled", "encoder_decoder_beam",
     "generation/1", 1.0),
    ("EncoderDecoder KV-cached generation vs nn.Transformer (no cache), batch 1", "encoder_decoder",
     "torch_transformer", "generation/1", None),
    ("BlockDiffusion generation vs DecoderOnly, batch 1", "block_diffusion", "decoder_only", "generation/1", None),
]
MEMORY_GROWTH_LIMIT = 2.2  # sdpa peak at 2L over peak at L: linear growth is 2


def check_targets(result: dict) -> list[dict]:
    """Each ratio the run can compute, its target (None: informative only) and whether it holds."""
    checks = []
    for what, top, bottom, section, target in TARGETS:
        rows = result
        for key in section.split("/"):  # "generation/1": the batch-1 rows
            rows = rows.get(key, {})
        if top in rows and bottom in rows:
            ratio = rows[top]["tokens_per_s"] / rows[bottom]["tokens_per_s"]
            checks.append({"what": what, "ratio": ratio, "target": target,
                           "holds": None if target is None else ratio >= target})
    sdpa = result.get("memory", {}).get("sdpa", {})
    lengths = sorted(sdpa, key=int)
    if len(lengths) >= 2 and lengths[-1] == 2 * lengths[-2] and sdpa[lengths[-2]] > 0:  # tiny lengths can read 0
        growth = sdpa[lengths[-1]] / sdpa[lengths[-2]]
        checks.append({"what": f"sdpa attention peak memory, {lengths[-1]} over {lengths[-2]} tokens",
                       "ratio": growth, "target": MEMORY_GROWTH_LIMIT, "holds": growth <= MEMORY_GROWTH_LIMIT,
                       "at_most": True})
    return checks


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def format_report(result: dict) -> str:
    """Markdown tables: the README quotes this output as is."""
    out = [f"attnlab bench, {result['date']}, {result['device']}, torch {result['torch']}, "
           f"precision {result['options']['precision']}, compile {result['options']['compile']}"]
    peaks = result["peak_flops"]
    if result.get("training"):
        kinds = [k for k in ("measured", "table") if peaks.get(k)]
        header = ["training", "s/step", "tokens/s", "GFLOP/token"] + [f"MFU ({k} peak)" for k in kinds]
        rows = [[name, f"{r['seconds_per_step']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['flops_per_token'] / 1e9:.4f}"]
                + [f"{100 * r['mfu_' + k]:.1f}%" for k in kinds] for name, r in result["training"].items()]
        out += ["", _table(header, rows)]
        sizes = ", ".join(f"{name.split()[-1]}² {rate / 1e12:.3f}" for name, rate in peaks.get("by_size", {}).items())
        raised = " (raised to the fastest model's rate)" if peaks.get("raised_to_fastest_model") else ""
        out += ["", f"peak matmul TFLOP/s by size, interleaved with the models: {sizes}; "
                    f"measured peak {peaks['measured'] / 1e12:.3f}{raised}"]
    if result.get("generation"):
        batches = list(result["generation"])
        names = list(dict.fromkeys(name for per in result["generation"].values() for name in per))
        rows = [[name] + [f"{result['generation'][b][name]['tokens_per_s']:,.0f}" if name in result["generation"][b]
                          else "-" for b in batches] for name in names]
        out += ["", _table(["generation, new tokens/s"] + [f"batch {b}" for b in batches], rows)]
    if result.get("memory"):
        per_backend = {k: v for k, v in result["memory"].items() if k != "gqa"}
        lengths = sorted({n for per in per_backend.values() for n in per}, key=int)  # JSON keys are strings
        rows = [[backend] + [f"{per[n] / 2**20:,.1f}" if n in per else "-" for n in lengths]
                for backend, per in per_backend.items()]
        out += ["", _table(["attention peak MiB (fwd+bwd)"] + [str(n) for n in lengths], rows)]
        gqa = result["memory"].get("gqa")
        if gqa:
            first = next(iter(gqa.values()))
            rows = [[n_kv, f"{r['cache_bytes'] / 2**20:,.2f}", f"{r['attention_peak_bytes'] / 2**20:,.1f}"]
                    for n_kv, r in gqa.items()]
            out += ["", _table(["n_kv_heads", f"KV cache MiB (batch {first['cache_batch']} x {first['cache_tokens']} tokens)",
                                f"sdpa attention peak MiB ({first['attention_length']} tokens)"], rows)]
    if result.get("targets"):
        rows = []
        for check in result["targets"]:
            sign = "<=" if check.get("at_most") else ">="
            target = "-" if check["target"] is None else f"{sign} {check['target']}"
            verdict = {True: "holds", False: "MISSED", None: ""}[check["holds"]]
            rows.append([check["what"], f"{check['ratio']:.2f}x", target, verdict])
        out += ["", _table(["ratio", "measured", "target", ""], rows)]
    return "\n".join(out)
