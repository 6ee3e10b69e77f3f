"""A decoding call compiled once, for every family.

Eager decoding pays PyTorch's per-module dispatch at every token, which at batch 1 on a CPU is
most of a step. `step_runner(True)` compiles the call `DecodeState.forward` makes
(`cached_forward`: the mask, the stack and, for a token step, the output projection) into one
graph (Inductor's C++ backend on CPU). It is compiled with dynamic shapes: batch size, the
attended prefix and the caches' capacity are symbols, so a decode's steps, new batch sizes (a
beam, the last batch of a split) and longer prefixes reuse the graph instead of recompiling.
Attention reads only the filled prefix of the caches, so a compiled step costs what an eager one
does in matmuls, at any batch size; only Python bookkeeping (which slots, growth) stays outside.

Inductor's C++ wrapper (`cpp_wrapper`) calls the kernels from C++ rather than from generated
Python, and a call shaped like the one before it checks only the guards that tell the compiled
graphs apart (see `step_runner`): at batch 1 on 2 CPU cores these took a step from 1.34 to 1.06 ms.
"""
from __future__ import annotations

import torch

from attnlab.components.kv_cache import cached_forward
from attnlab.generation.model_calls import count_compiled_call

# generation.compile "auto": compile a run's decoding when it makes at least this many calls. The
# bench's generation tables give, per batch, a compiled row's compile seconds and the calls whose
# saving over eager wins them back (docs/results/bench.md). On 2 CPU cores, for its 4-layer
# 256-wide model, greedy decoding at batch 1 compiled in about 28-32 s and paid after about 27,000
# (EncoderDecoder) and 33,000 (DecoderOnly) calls, in the run of d37c341 (earlier runs: up to
# 59,000); a decoding that saves less per call (block diffusion with 1 step a block: 81,000)
# needs more, and auto may compile such a run at a loss.
COMPILE_PAYS_FROM_CALLS = 50_000

BACKEND = "inductor"  # tests may swap in a cheaper one ("eager" runs the same captured graph)
INDUCTOR_OPTIONS = {"cpp_wrapper": True}
# Every decoding call of attnlab's families is one graph (tests/test_compiled_decoding.py compiles
# each kind with FULLGRAPH on): a graph break splits a call into graphs with Python between them,
# which once made block diffusion's compiled calls 20 % slower than eager. Off here, so that a
# component of a user's own that breaks a graph decodes slower rather than not at all.
FULLGRAPH = False
_COMPILED: dict = {}  # (kind of call, backend) -> the compiled call, for every stack


# One function per kind of call, because Dynamo keeps its graphs per function and, past 8 of them,
# runs a function eagerly (silently): each kind has its variants (a batch of one row, padded rows,
# a trial block with or without clean tokens, beams folded over their source), and together they
# would pass the limit in one process.
def _decoder_call(*args):
    return cached_forward(*args)


def _cross_attention_call(*args):
    return cached_forward(*args)


def _block_call(*args):
    return cached_forward(*args)


def _compiled(kind):
    """The call of that kind compiled, made on first use and kept for the process, so every
    generation reuses it. The stack is an argument, not a closure's cell nor a key of the cache: a
    compiled function that held its model would keep it alive for good (a model is collected once
    its decoding is over; nothing is stored on the module, which stays picklable and deep-copyable)."""
    key = (kind, BACKEND)
    if key not in _COMPILED:
        options = INDUCTOR_OPTIONS if BACKEND == "inductor" else None
        _COMPILED[key] = torch.compile(kind, backend=BACKEND, dynamic=True, fullgraph=FULLGRAPH, options=options)
    return _COMPILED[key]


def compile_pays(setting: bool | str, calls: float) -> bool:
    """generation.compile for a decode: true or false as set; "auto": whether `calls` (the decoding
    calls a run will make, a bound) win a compile back."""
    return setting if isinstance(setting, bool) else calls >= COMPILE_PAYS_FROM_CALLS


def step_runner(compiled: bool):
    """The `run` of `DecodeState.forward`: `cached_forward` itself, or compiled (one runner per decode).

    Compiled, a decode's first call (the prompt, which allocates the caches) runs eagerly, and
    tensor arguments are made contiguous: a view's strides (a column of beam search's token
    matrix) would be guarded on and recompile the step as they change. A call with the structure
    of the one before it (the same flags and token count: only values, lengths and kept rows
    change) checks only the guards that tell the compiled graphs apart (`skip_guard_eval_unsafe`):
    the full check costs about a tenth of a batch-1 step on a CPU. Where that check finds no graph
    (a length the first graph specialised on, say one equal to a weight's dimension, has
    changed), Dynamo refuses before running anything, and the call is made again with every guard."""
    if not compiled:
        return cached_forward
    previous = None

    def run(stack, tokens, valid, slots, row_end, keys, caches, context_mask, noisy, causal, masked, last_only):
        nonlocal previous
        if caches and caches[0].self_attn.buffers is None:
            return cached_forward(stack, tokens, valid, slots, row_end, keys, caches, context_mask, noisy, causal,
                                  masked, last_only)
        structure = (tokens.shape[1], noisy, causal, masked, last_only, caches[0].self_attn.slots is None)
        tensors = [x.contiguous() for x in (tokens, valid, slots, row_end, keys)]
        # Generation runs under "force_eager" when the stacks were compiled for training; this
        # step is compiled for decoding.
        kind = _block_call if noisy else _cross_attention_call if context_mask is not None else _decoder_call
        step = _compiled(kind)
        args = (stack, *tensors, caches, context_mask, noisy, causal, masked, last_only)
        out = None
        if structure == previous:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    out = step(*args)
            except RuntimeError as err:  # a size the last graph specialised on changed: compile again
                if "skip_guard_eval_unsafe" not in str(err):
                    raise
        if out is None:
            with torch.compiler.set_stance("default"):
                out = step(*args)
        previous = structure
        count_compiled_call(stack)
        return out

    return run
