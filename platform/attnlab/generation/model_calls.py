"""Counting model calls (NFE): the number a diffusion model's speed claim is about.

One call is one forward of the transformer stack that produces the logits (the decoder's, for
an encoder-decoder: the encoder runs once per source and is not a decoding call), whatever a
family's generator does around it, so every family is counted the same way.
"""
from __future__ import annotations

import contextlib


class CallCounter(contextlib.AbstractContextManager):
    """`with CallCounter(stack) as calls: ...` then `calls.calls`: forward calls of `stack`."""

    def __init__(self, stack):
        self.calls = 0
        self._stack, self._handle = stack, None

    def __enter__(self) -> "CallCounter":
        self._handle = self._stack.register_forward_hook(self._count)
        return self

    def _count(self, *_) -> None:
        self.calls += 1

    def __exit__(self, *exc) -> None:
        self._handle.remove()
