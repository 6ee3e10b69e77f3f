"""The bench's verdicts (the ratios issues 6 and 33 set as targets) and its printed tables."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """`metric` of the row at path `top` over that of the row at path `bottom` (paths of keys into
    the result: section, then batch for generation, then row); `target`: the least acceptable
    ratio, or with `at_most` the most; None: informative only."""
    what: str
    top: tuple[str, ...]
    bottom: tuple[str, ...]
    target: float | None
    metric: str = "tokens_per_s"
    at_most: bool = False


TRAINING_TARGETS = [
    Target("DecoderOnly training vs HF GPT2LMHeadModel", ("training", "decoder_only"), ("training", "hf_gpt2"), 1.5),
    Target("EncoderDecoder training vs torch.nn.Transformer", ("training", "encoder_decoder"),
           ("training", "torch_transformer"), 1.2),
    Target("BlockDiffusion training vs DecoderOnly", ("training", "block_diffusion"), ("training", "decoder_only"),
           0.45),
]
COMPILED_AT_LEAST_EAGER = [("DecoderOnly greedy", "decoder_only/greedy"), ("DecoderOnly beam", "decoder_only/{beam}"),
                           ("EncoderDecoder greedy", "encoder_decoder/greedy"),
                           ("EncoderDecoder beam", "encoder_decoder/{beam}")]
HF_SPEEDUP = 2.5  # DecoderOnly compiled greedy over HF generate at batch 1
THRESHOLD_CALLS_GROWTH = 1.1  # BlockDiffusion tau 0.9: calls per token at batch 16 over batch 1, at most
MEMORY_GROWTH_LIMIT = 2.2  # sdpa peak at 2L over peak at L: linear growth is 2


def generation_targets(result: dict) -> list[Target]:
    """The generation targets at the batches the run measured (beam rows are named after their width)."""
    batches = list(result.get("generation", {}))
    beam = f"beam{result.get('shape', {}).get('gen_beam', 4)}"
    rows = lambda batch, name: ("generation", batch, name.format(beam=beam))  # noqa: E731
    targets = [
        Target(f"{what}, compiled vs eager, batch {b}", rows(b, name + "_compiled"), rows(b, name), 1.0)
        for b in batches for what, name in COMPILED_AT_LEAST_EAGER
    ]
    targets += [
        Target("DecoderOnly compiled greedy vs HF generate greedy, batch 1", rows("1", "decoder_only/greedy_compiled"),
               rows("1", "hf_generate/greedy"), HF_SPEEDUP),
        Target("DecoderOnly eager greedy vs HF generate greedy, batch 1", rows("1", "decoder_only/greedy"),
               rows("1", "hf_generate/greedy"), None),
        Target("DecoderOnly compiled beam vs HF generate beam, batch 1", rows("1", "decoder_only/{beam}_compiled"),
               rows("1", "hf_generate/{beam}"), None),
        Target("EncoderDecoder KV-cached greedy vs nn.Transformer (no cache), batch 1",
               rows("1", "encoder_decoder/greedy"), rows("1", "torch_transformer/greedy"), None),
        Target("BlockDiffusion tau 0.9 vs DecoderOnly greedy, batch 1", rows("1", "block_diffusion/tau0.9"),
               rows("1", "decoder_only/greedy"), None),
        Target("BlockDiffusion tau 0.9 calls per token, batch 16 over batch 1", rows("16", "block_diffusion/tau0.9"),
               rows("1", "block_diffusion/tau0.9"), THRESHOLD_CALLS_GROWTH, metric="calls_per_token", at_most=True),
    ]
    return targets


def _row(result: dict, path: tuple[str, ...]) -> dict | None:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def round_ratios(top: dict, bottom: dict) -> list[float] | None:
    """The tokens/s ratio of two rows in each round they were timed in together (None unless both
    have the same rounds). A slow spell of a shared machine that lasts a round slows both rows of
    that round, so these ratios scatter less than the rows' own times do."""
    a, b = top.get("round_seconds"), bottom.get("round_seconds")
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return None
    work_a = top["tokens_per_s"] * statistics.median(a)  # tokens a call (or step)
    work_b = bottom["tokens_per_s"] * statistics.median(b)
    return [(work_a / ta) / (work_b / tb) for ta, tb in zip(a, b)]


def check_targets(result: dict) -> list[dict]:
    """Each ratio the run can compute, its target (None: informative only) and whether it holds.
    A tokens/s ratio of rows timed in the same rounds is the median of its per-round ratios (their
    range beside it); otherwise, the ratio of the rows' values."""
    checks = []
    for t in TRAINING_TARGETS + generation_targets(result):
        top, bottom = _row(result, t.top), _row(result, t.bottom)
        if top is None or bottom is None or not top.get(t.metric) or not bottom.get(t.metric):
            continue  # no rows (or no measure), no verdict
        rounds = round_ratios(top, bottom) if t.metric == "tokens_per_s" else None
        ratio = statistics.median(rounds) if rounds else top[t.metric] / bottom[t.metric]
        check = {"what": t.what, "ratio": ratio, "target": t.target,
                 "holds": None if t.target is None else (ratio <= t.target if t.at_most else ratio >= t.target)}
        if rounds:
            check["round_range"] = [min(rounds), max(rounds)]
        checks.append(check | ({"at_most": True} if t.at_most else {}))
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


def _generation_table(batch: str, rows: dict, new_tokens) -> str:
    """One row per (family, decoding): tokens/s and ms per token eager and compiled, calls per token."""
    def cell(row, key, spec):
        return "-" if row is None or row.get(key) is None else format(row[key], spec)

    lines = []
    for name, eager in rows.items():
        if eager.get("mode") == "compiled":
            continue
        compiled = rows.get(name + "_compiled")
        lines.append([name, cell(eager, "tokens_per_s", ",.0f"), cell(compiled, "tokens_per_s", ",.0f"),
                      cell(eager, "calls_per_token", ".2f"), cell(eager, "ms_per_token", ".2f"),
                      cell(compiled, "ms_per_token", ".2f"), cell(compiled, "compile_s", ".1f"),
                      cell(compiled, "pays_after_calls", ",")])
    header = [f"generation, batch {batch} ({new_tokens} new tokens a row)", "tokens/s eager", "tokens/s compiled",
              "calls/token", "ms/token eager", "ms/token compiled", "compile s", "compiled pays after (calls)"]
    return _table(header, lines)


def _calls_rows(batch: str, rows: dict) -> list[list[str]]:
    """The per-call table's rows at one batch: kind, ms and b / a, eager then compiled."""
    def cell(row, key):
        return "-" if row is None or row.get(key) is None else f"{row[key]:.2f}"

    return [[f"{name}, batch {batch}", cell(eager, "ms_per_call"), cell(eager, "ratio_to_ar"),
             cell(rows.get(name + "_compiled"), "ms_per_call"), cell(rows.get(name + "_compiled"), "ratio_to_ar")]
            for name, eager in rows.items() if not name.endswith("_compiled")]


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
        new_tokens = result.get("shape", {}).get("gen_new", "?")
        for batch, rows in result["generation"].items():
            out += ["", _generation_table(batch, rows, new_tokens)]
        out += ["", "calls/token: model calls (forwards of the decoding stack, the prompt's included) per new token "
                    "of a row, counted in its first full-length call (a compiled row's by its runner). ms/token: seconds per "
                    "call over the new tokens of a row, what one row waits per token. compile s: a compiled row's "
                    "first call over a timed one (the graphs this batch's shapes add; the first batch compiles "
                    "the most); pays after: the decoding calls whose saving over eager wins those seconds back."]
    if result.get("calls"):
        rows = [row for batch, per in result["calls"].items() for row in _calls_rows(batch, per)]
        out += ["", _table(["decoding call", "ms eager", "b / a eager", "ms compiled", "b / a compiled"], rows),
                "", "One call's milliseconds over a cache half way through a decode: ar_step, one token a row; "
                    "blockN, N masked tokens (block diffusion's denoising call); verifyN, N candidates and N masks "
                    "(draft-and-verify's call). b / a: a call over the AR step of the same mode, the median of "
                    "the rounds' ratios; draft-and-verify at k tokens a call is k · a / b times AR's speed."]
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
            spread = "" if "round_range" not in check else " ({:.2f}-{:.2f})".format(*check["round_range"])
            rows.append([check["what"], f"{check['ratio']:.2f}x{spread}", target, verdict])
        out += ["", _table(["ratio", "measured", "target", ""], rows),
                "", "measured: for two rows timed in the same rounds, the median of the ratios of each round "
                    "(in brackets, their range); otherwise the ratio of the two rows."]
    return "\n".join(out)
