"""Generation for the encoder-decoder: greedy / sampled and beam search, over the KV cache.

The decoder starts from bos, or from a prefix per row (`prefixes`: `[bos] prompt` of a model
trained on plain text, whose continuation is wanted). The source's cross-attention keys and
values are computed once and shared by its beams (`EncoderDecoderModel.start_state`).
"""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.compiled_step import step_runner
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
    state = model.start_state(encoded, _capacity(prefixes, max_lengths))
    first = _start(model, state, prefixes, bos_id, pad_id, len(max_lengths), encoded.memory.device)
    run = step_runner(compiled)

    def step(tokens, valid):
        return state.forward(model.decoder, tokens[:, None], valid[:, None], last_only=True, run=run)

    return token_loop(step, first, max_lengths, eos_id=eos_id, pad_id=pad_id, sampling=sampling,
                      generator=generator, return_logits=return_logits,
                      compact=state.keep if compact and not compiled else None)


@decoding
def translate_beam(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, beam_size: int,
                   alpha: float, prefixes: list[list[int]] | None = None, pad_id: int = 0, compact: bool = True,
                   compiled: bool = False):
    n = encoded.memory.shape[0]
    capacity = _capacity(prefixes, max_lengths)
    if prefixes is None:
        state = model.start_state(encoded, capacity, beams=beam_size)
        pending = []
    else:  # read each prefix once, then copy its cache to each beam
        state = model.start_state(encoded, capacity)
        after = _start(model, state, prefixes, bos_id, pad_id, n, encoded.memory.device).log_softmax(dim=-1)
        state.reorder(torch.arange(n, device=after.device).repeat_interleave(beam_size))
        pending = [after.repeat_interleave(beam_size, dim=0)]
    run = step_runner(compiled)

    def log_probs(last, st):
        if pending:
            return pending.pop()
        return state.forward(model.decoder, last, last_only=True, run=run).log_softmax(dim=-1)

    return beam_search(log_probs, state, n, beam_size, bos_id, eos_id, max_lengths, alpha,
                       compact=compact and not compiled)
