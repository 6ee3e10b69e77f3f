"""Generation for the decoder-only model: greedy / sampled and beam search, over the KV cache."""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.loop import left_pad, row_budgets, token_loop
from attnlab.generation.sampling import SamplingConfig


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int | torch.Tensor,
    eos_id: int,
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    return_logits: bool = False,
    compact: bool = True,
):
    """Continue each prompt until eos or its budget (`max_new_tokens`: one int, or one per row);
    returns token lists without eos (and the (B, steps, V) logits with `return_logits`).
    `compact`: in greedy decoding finished rows leave the batch (the same outputs, less compute)."""
    device = next(model.parameters()).device
    tokens, valid = left_pad(prompts, pad_id, device)
    state = model.new_state(len(prompts), device)
    first = model(tokens, valid, state)[:, -1]
    return token_loop(lambda token, ok: model(token[:, None], ok[:, None], state)[:, -1], first,
                      row_budgets(max_new_tokens, len(prompts), device), eos_id=eos_id, pad_id=pad_id,
                      sampling=sampling, generator=generator, return_logits=return_logits,
                      compact=state.reorder if compact else None)


@torch.no_grad()
def generate_beam(model, prompts: list[list[int]], *, max_new_tokens: int | torch.Tensor, eos_id: int, pad_id: int,
                  beam_size: int, alpha: float, compact: bool = True) -> list[list[int]]:
    """Beam search after the prompts: each prompt runs once, then its cache is copied to each beam."""
    device = next(model.parameters()).device
    n = len(prompts)
    tokens, valid = left_pad(prompts, pad_id, device)
    state = model.new_state(n, device)
    after_prompt = model(tokens, valid, state)[:, -1].log_softmax(dim=-1)
    state.reorder(torch.arange(n, device=device).repeat_interleave(beam_size))
    pending = [after_prompt.repeat_interleave(beam_size, dim=0)]

    def step(last_tokens, st):
        if pending:  # the first step continues the prompt, already computed
            return pending.pop()
        return model(last_tokens, None, st)[:, -1].log_softmax(dim=-1)

    return beam_search(step, state, n, beam_size, pad_id, eos_id, row_budgets(max_new_tokens, n, device), alpha,
                       compact=compact)
