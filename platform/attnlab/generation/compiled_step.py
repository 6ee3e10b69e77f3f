"""Decoding calls compiled, for every family (`generation.compile`, off unless set).

Eager decoding pays PyTorch's per-module dispatch at every token, which at small batches is much of
a step. The compiled runner turns the call `DecodeState.forward` makes (`cached_forward`: the mask,
the stack and, for a token step, the output projection) into one graph (Inductor's C++ backend on
a CPU). It is compiled with dynamic shapes: batch size, the attended prefix and the caches'
capacity are symbols, so a decode's steps, new batch sizes (a beam, the last batch of a split) and
longer prefixes reuse the graph instead of recompiling. Attention reads only the filled prefix of
the caches, so a compiled step costs what an eager one does in matmuls, at any batch size; only
Python bookkeeping (which slots, growth) stays outside.

Compiling costs each process seconds to minutes per kind of call before the first token, and how
many calls win that back depends on the device, the model and the batch (the bench's generation
tables measure it for their shapes). No rule measured on one machine holds on another, so
decoding stays eager unless `generation.compile` is true, as in litgpt.
"""
from __future__ import annotations

import inspect

import torch

from attnlab.components.kv_cache import StepInputs, cached_forward
from attnlab.errors import ConfigError
from attnlab.generation.model_calls import count_compiled_call

BACKEND = "inductor"  # tests may swap in a cheaper one ("eager" runs the same captured graph)
# The kernels are called from C++ rather than from generated Python: less overhead at every call.
INDUCTOR_OPTIONS = {"cpp_wrapper": True}
# Every decoding call of attnlab's families is one graph (tests/test_compiled_decoding.py compiles
# each kind with FULLGRAPH on): a graph break splits a call into graphs with Python between them.
# Off here, so that a component of a user's own that breaks a graph decodes slower rather than not
# at all.
FULLGRAPH = False
_COMPILED: dict = {}  # (kind of call, backend) -> `cached_forward` compiled for it, for every stack
# Each kind of call is compiled as a region of its own (see `_compiled`), which older torch lacks.
ISOLATES_RECOMPILES = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def _kind(step: StepInputs) -> str:
    """A decoder's call, a decoder's call against a source (cross-attention), or a block call."""
    return "block" if step.noisy else "cross_attention" if step.context_mask is not None else "decoder"


def check_compilable() -> None:
    """One clear line where this torch cannot compile decoding as attnlab does."""
    if not ISOLATES_RECOMPILES:
        raise ConfigError(f"generation.compile=true needs a torch whose torch.compile takes isolate_recompiles "
                          f"(2.13 has it); this is torch {torch.__version__}: upgrade torch, or set "
                          "generation.compile false")


def _compiled(kind: str):
    """`cached_forward` compiled for one kind of call, made on first use and kept for the
    process, so every generation reuses it.

    Each kind has its variants, each a graph of its own (a batch of one row, padded rows, a trial
    block with or without clean tokens, beams folded over their source). Dynamo keeps at most a
    few graphs per compiled region and runs it eagerly past them, silently: `isolate_recompiles`
    gives each kind its own region, so the kinds never crowd one another out. The stack is an
    argument, not a closure's cell nor a key of this cache: a compiled function that held its model
    would keep it alive for good (a model is collected once its decoding is over; nothing is stored
    on the module, which stays picklable and deep-copyable)."""
    key = (kind, BACKEND)
    if key not in _COMPILED:
        options = INDUCTOR_OPTIONS if BACKEND == "inductor" else None
        _COMPILED[key] = torch.compile(cached_forward, backend=BACKEND, dynamic=True, fullgraph=FULLGRAPH,
                                       options=options, isolate_recompiles=True)
    return _COMPILED[key]


def compiled_call(stack, step: StepInputs):
    """`cached_forward`, compiled for the kind of `step`.

    A decode's first call (the prompt, which allocates the caches) runs eagerly, and tensor inputs
    are made contiguous: a view's strides (a column of beam search's token matrix) would be guarded
    on and recompile the step as they change. Every call checks all of its graph's guards."""
    if step.caches and step.caches[0].self_attn.buffers is None:
        return cached_forward(stack, step)
    step = StepInputs(*(x.contiguous() if isinstance(x, torch.Tensor) else x for x in step))
    # Generation runs under "force_eager" when the stacks were compiled for training; this call is
    # compiled for decoding.
    with torch.compiler.set_stance("default"):
        out = _compiled(_kind(step))(stack, step)
    count_compiled_call(stack)
    return out


def step_runner(compiled: bool):
    """What a decoding state runs its calls with (`DecodeState.run`): `cached_forward`, or
    compiled."""
    if not compiled:
        return cached_forward
    check_compilable()
    return compiled_call
