"""Counting model calls (NFE): the number a diffusion model's speed claim is about.

One call is one forward of the transformer stack that produces the logits (the decoder's, for
an encoder-decoder: the encoder runs once per source and is not a decoding call), whatever a
family's generator does around it, so every family is counted the same way.

An eager call is seen by a forward hook. A compiled decoding call runs the stack inside a graph,
where the hook is not called (or, traced, would be replayed unreliably): the compiled runner
reports each call it makes instead (`count_compiled_call`), and the hook ignores calls made
while compiling.
"""
from __future__ import annotations

import contextlib

import torch

_COUNTING: dict[int, list["CallCounter"]] = {}  # id(stack) -> the counters open on it


class CallCounter(contextlib.AbstractContextManager):
    """`with CallCounter(stack) as calls: ...` then `calls.calls`: forward calls of `stack`."""

    def __init__(self, stack):
        self.calls = 0
        self._stack, self._handle = stack, None

    def __enter__(self) -> "CallCounter":
        self._handle = self._stack.register_forward_hook(self._count)
        _COUNTING.setdefault(id(self._stack), []).append(self)
        return self

    def _count(self, *_) -> None:
        if not torch.compiler.is_compiling():
            self.calls += 1

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        counters = _COUNTING[id(self._stack)]
        counters.remove(self)
        if not counters:
            del _COUNTING[id(self._stack)]


def count_compiled_call(stack) -> None:
    """One call of `stack` made by a compiled graph, for every counter open on it."""
    for counter in _COUNTING.get(id(stack), ()):
        counter.calls += 1
