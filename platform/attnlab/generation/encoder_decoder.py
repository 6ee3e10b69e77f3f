"""Generation for the encoder-decoder: greedy / sampled and beam search, over the KV cache.

The decoder starts from bos, or from a prefix per row (`prefixes`: `[bos] prompt` of a model
trained on plain text, whose continuation is wanted). The source's cross-attention keys and
values are computed once and shared by its beams (`EncoderDecoderModel.start_state`).
"""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.loop import capacity_for, decoding, left_pad, token_loop
from attnlab.generation.sampling import SamplingConfig


def _capacity(prefixes, max_lengths: torch.Tensor) -> int:
    """Slots of the decoder's caches: bos (or the longest prefix) plus the longest budget."""
    return capacity_for(1 if prefixes is None else max(len(p) for p in prefixes), max_lengths)


def _start(model, state, prefixes, bos_id: int, pad_id: int, rows: int, device):
    """Logits (rows, V) after the decoder has read bos, or each row's prefix (left-padded)."""
    if prefixes is None:
        tokens, valid = torch.full((rows, 1), bos_id, dtype=torch.long, device=device), None
    else:
        tokens, valid = left_pad(prefixes, pad_id, device)
    return state.forward(model.decoder, tokens, valid, last_only=True)


@decoding
def translate_greedy(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, pad_id: int,
                     prefixes: list[list[int]] | None = None, sampling: SamplingConfig = SamplingConfig(),
                     generator: torch.Generator | None = None, return_logits: bool = False, compact: bool = True,
                     compiled: bool = False):
    """Token by token after bos (or each row's prefix), each row within its budget `max_lengths` (B,);
    `compact`: in greedy decoding finished rows leave the batch (the same outputs, less compute).
    `compiled`: each step compiled (no compaction)."""
    state = model.start_state(encoded, _capacity(prefixes, max_lengths), compiled=compiled)
    first = _start(model, state, prefixes, bos_id, pad_id, len(max_lengths), encoded.memory.device)

    def step(tokens, valid):
        return state.forward(model.decoder, tokens[:, None], valid[:, None], last_only=True)

    return token_loop(step, first, max_lengths, eos_id=eos_id, pad_id=pad_id, sampling=sampling,
                      generator=generator, return_logits=return_logits,
                      compact=state.keep if compact and not compiled else None)


@decoding
def translate_beam(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, beam_size: int,
                   alpha: float, prefixes: list[list[int]] | None = None, pad_id: int = 0, compact: bool = True,
                   compiled: bool = False):
    """Beam search after bos (or each row's prefix), each source within its budget
    `max_lengths` (B,). `compiled`: as in `translate_greedy` (compiled beams keep finished sources
    in the batch)."""
    n = encoded.memory.shape[0]
    capacity = _capacity(prefixes, max_lengths)
    if prefixes is None:  # every beam reads bos
        state = model.start_state(encoded, capacity, beams=beam_size, compiled=compiled)
        first = _start(model, state, None, bos_id, pad_id, n * beam_size, encoded.memory.device)
    else:  # read each prefix once, then copy its cache to each beam
        state = model.start_state(encoded, capacity, compiled=compiled)
        first = _start(model, state, prefixes, bos_id, pad_id, n, encoded.memory.device).repeat_interleave(beam_size, 0)
        state.expand_beams(beam_size)

    def log_probs(last, st):
        return state.forward(model.decoder, last, last_only=True).log_softmax(dim=-1)

    return beam_search(log_probs, first.log_softmax(dim=-1), state, n, beam_size, bos_id, eos_id, max_lengths, alpha,
                       compact=compact and not compiled)
