"""Generation for the encoder-decoder: greedy / sampled and beam search, over the KV cache.

The decoder starts from bos, or from a prefix per row (`prefixes`: `[bos] prompt` of a model
trained on plain text, whose continuation is wanted).
"""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.compiled_step import fixed_stepper
from attnlab.generation.loop import fixed_capacity, left_pad, token_loop
from attnlab.generation.sampling import SamplingConfig


def _next_logits(model, state, compiled: bool = False):
    """Logits (N, V) after feeding `tokens` (N,) to the state. A finished row's pad is hidden only
    once the state has padding anyway (prefixes): otherwise no mask is needed, as in translation.
    A fixed state always masks (its step is compiled, or may be)."""
    if state.capacity is not None:
        fixed_step = fixed_stepper(model.decoder, state, compiled)
        return lambda tokens, valid=None: fixed_step(tokens[:, None], None if valid is None else valid[:, None])

    def step(tokens, valid=None):
        keep = valid[:, None] if valid is not None and state.padded else None
        hidden, _ = model.decode(tokens[:, None], state=state, valid=keep)
        return model.logits(hidden[:, -1])

    return step


def _capacity(prefixes, max_lengths: torch.Tensor, fixed: bool) -> int | None:
    """Slots of a fixed cache (None: a growing one): bos (or the longest prefix) plus the longest budget."""
    return fixed_capacity(1 if prefixes is None else max(len(p) for p in prefixes), max_lengths, fixed)


def _start(model, state, prefixes, bos_id: int, pad_id: int, rows: int, device):
    """Logits (rows, V) after the decoder has read bos, or each row's prefix (left-padded)."""
    if prefixes is None:
        hidden, _ = model.decode(torch.full((rows, 1), bos_id, dtype=torch.long, device=device), state=state)
    else:
        tokens, valid = left_pad(prefixes, pad_id, device)
        hidden, _ = model.decode(tokens, state=state, valid=valid)
    return model.logits(hidden[:, -1])


@torch.no_grad()
def translate_greedy(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, pad_id: int,
                     prefixes: list[list[int]] | None = None, sampling: SamplingConfig = SamplingConfig(),
                     generator: torch.Generator | None = None, return_logits: bool = False, compact: bool = True,
                     fixed: bool = False, compiled: bool = False):
    """Token by token after bos (or each row's prefix), each row within its budget `max_lengths` (B,);
    `compact`: in greedy decoding finished rows leave the batch (the same outputs, less compute).
    `fixed`: a fixed-capacity cache; `compiled`: that, and each step compiled (no compaction)."""
    state = model.start_state(encoded, capacity=_capacity(prefixes, max_lengths, fixed or compiled))
    first = _start(model, state, prefixes, bos_id, pad_id, len(max_lengths), encoded.memory.device)
    return token_loop(_next_logits(model, state, compiled), first, max_lengths, eos_id=eos_id, pad_id=pad_id,
                      sampling=sampling, generator=generator, return_logits=return_logits,
                      compact=state.reorder if compact and not compiled else None)


@torch.no_grad()
def translate_beam(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, beam_size: int,
                   alpha: float, prefixes: list[list[int]] | None = None, pad_id: int = 0, compact: bool = True,
                   fixed: bool = False, compiled: bool = False):
    n = encoded.memory.shape[0]
    capacity = _capacity(prefixes, max_lengths, fixed or compiled)
    if prefixes is None:
        state = model.start_state(encoded, repeat=beam_size, capacity=capacity)
        pending = []
    else:  # read each prefix once, then copy its cache to each beam
        state = model.start_state(encoded, capacity=capacity)
        after = _start(model, state, prefixes, bos_id, pad_id, n, encoded.memory.device).log_softmax(dim=-1)
        state.reorder(torch.arange(n, device=after.device).repeat_interleave(beam_size))
        pending = [after.repeat_interleave(beam_size, dim=0)]
    step = _next_logits(model, state, compiled)

    def log_probs(last, st):
        return pending.pop() if pending else step(last[:, 0]).log_softmax(dim=-1)

    return beam_search(log_probs, state, n, beam_size, bos_id, eos_id, max_lengths, alpha,
                       compact=compact and not compiled)
