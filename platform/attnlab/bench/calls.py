"""What one decoding call costs, by kind and width, side by side (the bench's `calls` table).

Draft-and-verify is faster than AR decoding by S = k · a / b: k tokens a call, a the cost of an
AR step, b the cost of its call. This table measures a and b in the same rounds: an AR step (one
token per row over a cache of `gen_prompt + gen_new / 2` tokens), a block call of n masked tokens
(block diffusion's denoising call) and a verify call (n candidates and n masks, draft-and-verify's
call, its rejected keys taken back after it) for n in `CALL_WIDTHS`, eager and compiled, at the
generation batches up to `reference_max_batch`. Each timed round makes `CALLS_PER_ROUND` calls of
each kind; the ratios to the AR step are the medians of each round's ratios.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from attnlab.bench.contenders import Options, platform_module
from attnlab.bench.shapes import BenchShape
from attnlab.bench.timing import interleaved_rounds
from attnlab.families import BlockDiffusion, DecoderOnly
from attnlab.components.linear import decode_layout

CALL_WIDTHS = (4, 8, 16)
CALLS_PER_ROUND = 20


def _filled_state(model, batch: int, tokens: int, vocab: int, device, compiled: bool):
    """A decoding state whose rows already hold `tokens` keys (a decode half way through)."""
    state = model.new_state(batch, tokens + 2 * max(CALL_WIDTHS) + 1, device, compiled=compiled)
    prompt = torch.randint(6, vocab, (batch, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    state.forward(model.stack, prompt, last_only=True)
    return state


def _call_kinds(shape: BenchShape, options: Options, batch: int, compiled: bool) -> dict[str, Callable[[], None]]:
    """{kind: one call of it}; each call leaves its state as it found it."""
    device, filled = options.device, shape.gen_prompt + shape.gen_new // 2
    ar = platform_module(DecoderOnly.family, shape, options).model.eval()
    bd = platform_module(BlockDiffusion.family, shape, options).model.eval()
    bd.shift, bd.causal = True, True  # the AR view draft-and-verify needs (the same weights and cost)
    token = torch.full((batch, 1), 7, dtype=torch.long, device=device)
    one = torch.ones(batch, dtype=torch.long, device=device)
    kinds = {}
    ar_state = _filled_state(ar, batch, filled, shape.vocab, device, compiled)

    def ar_step():
        ar_state.forward(ar.stack, token, last_only=True)
        ar_state.retract(one)
    kinds["ar_step"] = ar_step
    for n in CALL_WIDTHS:
        state = _filled_state(bd, batch, filled, shape.vocab, device, compiled)
        state.last_clean_hidden = torch.zeros(batch, shape.d_model, device=device)
        masks = torch.full((batch, n), bd.mask_id, dtype=torch.long, device=device)
        candidates = torch.full((batch, n), 7, dtype=torch.long, device=device)
        fed = torch.ones(batch, n, dtype=torch.bool, device=device)

        def block_call(state=state, masks=masks):
            bd.advance(None, None, masks, state)

        def verify_call(state=state, candidates=candidates, fed=fed, n=n):
            bd.draft_call(candidates, fed, n, state, first=0)
            state.retract(one * n)
        kinds[f"block{n}"], kinds[f"verify{n}"] = block_call, verify_call
    models = (ar, bd)

    def repeated(call):
        def run():
            with torch.no_grad(), decode_layout(models[0]), decode_layout(models[1]):
                for _ in range(CALLS_PER_ROUND):
                    call()
        return run
    return {kind: repeated(call) for kind, call in kinds.items()}


def bench_calls(shape: BenchShape, options: Options, rounds: int, say) -> dict:
    """{batch: {kind or kind_compiled: ms_per_call, ratio_to_ar (median of the rounds' ratios to the
    AR step of the same mode), round_ms}}."""
    results = {}
    for batch in [b for b in shape.gen_batches if b <= shape.reference_max_batch]:
        steps = {}
        for compiled in (False, True):
            suffix = "_compiled" if compiled else ""
            steps.update({kind + suffix: call for kind, call in _call_kinds(shape, options, batch, compiled).items()})
        say(f"call costs at batch {batch}: {', '.join(steps)} ({CALLS_PER_ROUND} calls a round)")
        times = interleaved_rounds(steps, 1, max(3, rounds), options.device, say)
        rows = {}
        for name, seconds in times.items():
            reference = times["ar_step_compiled" if name.endswith("_compiled") else "ar_step"]
            rows[name] = {"ms_per_call": 1000 * statistics.median(seconds) / CALLS_PER_ROUND,
                          "ratio_to_ar": statistics.median(s / r for s, r in zip(seconds, reference)),
                          "round_ms": [1000 * s / CALLS_PER_ROUND for s in seconds]}
        results[str(batch)] = rows
    return results
