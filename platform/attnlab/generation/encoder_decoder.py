"""Generation for the encoder-decoder: greedy / sampled or beam search, with or without the KV cache."""
from __future__ import annotations

import torch

from attnlab.generation.beam import beam_search
from attnlab.generation.decoder_only import strip_after_eos
from attnlab.generation.sampling import SamplingConfig, choose_next


def _step_log_probs(model, state):
    def step(last_tokens, st):
        hidden, _ = model.decode(last_tokens, st.source, st)
        return model.logits(hidden[:, -1]).log_softmax(dim=-1)

    return step


@torch.no_grad()
def translate_greedy(model, encoded, max_lengths: torch.Tensor, bos_id: int, eos_id: int, pad_id: int,
                     sampling: SamplingConfig = SamplingConfig(), use_cache: bool = True,
                     generator: torch.Generator | None = None, return_logits: bool = False):
    """Token by token; `use_cache=False` re-decodes the whole prefix each step (the reference)."""
    n = encoded.memory.shape[0]
    device = encoded.memory.device
    tokens = torch.full((n, 1), bos_id, dtype=torch.long, device=device)
    state = model.start_state(encoded) if use_cache else None
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    all_logits = []
    for t in range(int(max_lengths.max())):
        if use_cache:
            hidden, _ = model.decode(tokens[:, -1:], state.source, state)
        else:
            hidden, _ = model.decode(tokens, encoded)
        logits = model.logits(hidden[:, -1])
        all_logits.append(logits)
        next_token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        finished = finished | (next_token == eos_id) | (t + 1 >= max_lengths)
        if bool(finished.all()):
            break
    out = strip_after_eos(tokens[:, 1:], eos_id, max_lengths)
    return (out, torch.stack(all_logits, dim=1)) if return_logits else out


@torch.no_grad()
def translate_beam(model, encoded, max_lengths: torch.Tensor, bos_id: int, eos_id: int,
                   beam_size: int, alpha: float):
    state = model.start_state(encoded, repeat=beam_size)
    n = encoded.memory.shape[0]
    return beam_search(_step_log_probs(model, state), state, n, beam_size, bos_id, eos_id, max_lengths, alpha)
