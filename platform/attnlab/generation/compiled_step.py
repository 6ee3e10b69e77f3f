"""A decoding step compiled once, over a fixed-capacity cache.

Eager decoding pays PyTorch's per-module dispatch at every token, which at batch 1 on a CPU is
most of a step. With a fixed-capacity state (`DecodeState.fixed`) the cache is written in place
and attention reads the whole buffer under a mask, so a step compiles into one graph (Inductor's
C++ backend on CPU) that serves every step. It is compiled with dynamic shapes: batch size,
capacity and query length are symbols, so new batch sizes (a beam, the last batch of a split)
reuse the graph instead of recompiling.

A token's whole step is in the graph (`fixed_stepper`): its positions, the state's validity and
position records, the slot mask, the stack and the output projection; only Python bookkeeping
(which slots, the capacity check) stays outside. Inductor's C++ wrapper (`cpp_wrapper`) calls
the kernels from C++ rather than from generated Python, and after a decode's first step only the
guards that tell its graphs apart are checked (see `_runner`): at batch 1 on 2 CPU cores these
took a step from 1.34 to 1.06 ms. Block diffusion's trial blocks compile the stack alone
(`stack_step`): their query lengths vary within a decode.
"""
from __future__ import annotations

import functools

import torch

from attnlab.components import DecodeState

BACKEND = "inductor"  # tests may swap in a cheaper one ("eager" runs the same captured graph)
INDUCTOR_OPTIONS = {"cpp_wrapper": True}
_COMPILED: dict = {}  # (step function, backend) -> its compiled function, for every stack


def _stack_forward(stack, tokens, positions, mask, key_positions, caches, context_mask):
    hidden, _ = stack(tokens, positions, mask=mask, key_positions=key_positions, caches=caches,
                      context_mask=context_mask)
    return hidden


def _token_forward(stack, tokens, valid, slots, next_position, key_valid, key_positions, caches, context_mask):
    """Logits (B, V) of the last token, and the next position of each row."""
    positions = DecodeState.positions_after(next_position, valid)
    DecodeState.write_slots(key_valid, key_positions, slots, valid, positions)
    hidden, _ = stack(tokens, positions, mask=DecodeState.mask_at(key_valid, slots), key_positions=key_positions,
                      caches=caches, context_mask=context_mask)
    return stack.embedding.logits(hidden[:, -1]), next_position + valid.long().sum(1)


def _compiled(forward):
    """`forward` compiled, made on first use and kept for the process, so every generation reuses
    it. The stack is an argument, not a closure's cell nor a key of the cache: a compiled function
    that held its model would keep it alive for good (a model is collected once its decoding is
    over; nothing is stored on the module, which stays picklable and deep-copyable)."""
    key = (forward, BACKEND)
    if key not in _COMPILED:
        options = INDUCTOR_OPTIONS if BACKEND == "inductor" else None
        _COMPILED[key] = torch.compile(forward, backend=BACKEND, dynamic=True, options=options)
    return _COMPILED[key]


def _runner(stack, forward, compiled: bool, settles: bool = False):
    """`forward` over `stack`, eager or compiled. Compiled, the first call (which allocates the cache
    buffers) runs eagerly, and tensor arguments are made contiguous: a view's strides (a column
    of beam search's token matrix) would be guarded on and recompile the step as they change.

    `settles`: every call has the structure of the first (one decode: the same state, model and
    token count; only values and the kept rows change), so after the first compiled call checks
    every guard, later ones check only those that tell this function's graphs apart
    (`skip_guard_eval_unsafe`): the full check costs about a tenth of a batch-1 step on a CPU."""
    eager = functools.partial(forward, stack)
    if not compiled:
        return eager
    step = _compiled(forward)
    checked = False

    def run(*args):
        nonlocal checked
        caches = args[-2]  # every step function ends with (caches, context_mask)
        if caches and caches[0].self_attn.k is None:
            return eager(*args)
        args = [arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args]
        # Generation runs under "force_eager" when the stacks were compiled for training; this
        # step is compiled for decoding.
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=checked):
            out = step(stack, *args)
        checked = settles
        return out

    return run


def stack_step(stack, compiled: bool):
    """The stack's forward over a fixed state (returns the hidden states), eager or compiled."""
    return _runner(stack, _stack_forward, compiled)


def fixed_stepper(stack, state: DecodeState, compiled: bool):
    """`next_logits(tokens (B, 1), valid (B, 1) or None: all real)`: logits (B, V) after feeding one
    token per row to the fixed `state`, compiled or eagerly (the same function: the eager one is
    the reference in tests). One stepper serves one decode."""
    step = _runner(stack, _token_forward, compiled, settles=True)
    limit = stack.positional.max_positions

    def next_logits(tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid
        slots = state.reserve(tokens.shape[1])
        if limit is not None and state.filled > limit:  # a position never exceeds its slot: only now can one overflow
            stack.positional.check_positions(state.positions_of(valid))
        logits, state.next_position = step(tokens, valid, slots, state.next_position, state.key_valid,
                                           state.key_positions, state.caches, state.context_mask)
        return logits

    return next_logits
