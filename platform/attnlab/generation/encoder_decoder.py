"""Generation for the encoder-decoder: greedy / sampled and beam search, over the KV cache."""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.loop import token_loop
from attnlab.generation.sampling import SamplingConfig


def _next_logits(model, state):
    """Logits (N, V) after feeding `tokens` (N,) to the decoder state."""
    def step(tokens, valid=None):
        hidden, _ = model.decode(tokens[:, None], state=state)
        return model.logits(hidden[:, -1])

    return step


@torch.no_grad()
def translate_greedy(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int, pad_id: int,
                     sampling: SamplingConfig = SamplingConfig(), generator: torch.Generator | None = None,
                     return_logits: bool = False):
    """Token by token after bos, each row within its budget `max_lengths` (B,)."""
    state = model.start_state(encoded)
    step = _next_logits(model, state)
    bos = torch.full((len(max_lengths),), bos_id, dtype=torch.long, device=encoded.memory.device)
    return token_loop(step, step(bos), max_lengths, eos_id=eos_id, pad_id=pad_id, sampling=sampling,
                      generator=generator, return_logits=return_logits)


@torch.no_grad()
def translate_beam(model, encoded, *, max_lengths: torch.Tensor, bos_id: int, eos_id: int,
                   beam_size: int, alpha: float):
    state = model.start_state(encoded, repeat=beam_size)
    step = _next_logits(model, state)
    n = encoded.memory.shape[0]
    return beam_search(lambda last, st: step(last[:, 0]).log_softmax(dim=-1), state, n, beam_size,
                       bos_id, eos_id, max_lengths, alpha)
