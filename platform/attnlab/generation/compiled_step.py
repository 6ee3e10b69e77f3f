"""A decoding step compiled once, over a fixed-capacity cache.

Eager decoding pays PyTorch's per-module dispatch at every token, which at batch 1 on a CPU is
most of a step. With a fixed-capacity state (`DecodeState.fixed`) the cache is written in place
and attention reads the whole buffer under a mask, so the stack's forward compiles into one
graph (Inductor's C++ backend on CPU) that serves every step. It is compiled with dynamic shapes:
batch size, capacity and query length are symbols, so new batch sizes (a beam, the last batch
of a split) reuse the graph instead of recompiling. What changes between steps (slots, mask,
positions) is computed eagerly around it and passed in as tensors.
"""
from __future__ import annotations

import weakref

import torch

from attnlab.components import DecodeState

BACKEND = "inductor"  # tests may swap in a cheaper one ("aot_eager" computes the same graph)
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # stack -> its compiled step


def _forward(stack):
    def forward(tokens, positions, mask, key_positions, caches, context_mask):
        hidden, _ = stack(tokens, positions, mask=mask, key_positions=key_positions, caches=caches,
                          context_mask=context_mask)
        return hidden

    return forward


def stack_step(stack, compiled: bool):
    """The stack's forward over a fixed state, eager or compiled (the compiled one made on first
    use and kept for the stack's lifetime, so every generation with this model reuses it; not
    on the module, which stays picklable and deep-copyable)."""
    if not compiled:
        return _forward(stack)
    if stack not in _COMPILED:
        _COMPILED[stack] = torch.compile(_forward(stack), backend=BACKEND, dynamic=True)
    step, eager = _COMPILED[stack], _forward(stack)

    def run(tokens, positions, mask, key_positions, caches, context_mask):
        if caches and caches[0].self_attn.k is None:  # the first call allocates the buffers: eagerly
            return eager(tokens, positions, mask, key_positions, caches, context_mask)
        # Contiguous inputs: a view's strides (a column of beam search's token matrix) would be
        # guarded on and recompile the step as they change. Generation runs under "force_eager"
        # when the stacks were compiled for training; this step is compiled for decoding.
        tokens, positions, mask, key_positions = (t.contiguous() for t in (tokens, positions, mask, key_positions))
        with torch.compiler.set_stance("default"):
            return step(tokens, positions, mask, key_positions, caches, context_mask)

    return run


def step_fixed(stack, project, tokens: torch.Tensor, valid: torch.Tensor | None, state: DecodeState,
               compiled: bool) -> torch.Tensor:
    """Logits (B, V) after feeding one token per row (`valid` None: all real) to a fixed state,
    compiled or eagerly (the same function: the eager call is the reference in tests)."""
    positions = state.place(torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid)
    stack.positional.check_positions(positions)
    hidden = stack_step(stack, compiled)(tokens, positions, state.slot_mask(), state.key_positions, state.caches,
                                         state.context_mask)
    return project(hidden[:, -1])
