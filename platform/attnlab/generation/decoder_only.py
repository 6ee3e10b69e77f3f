"""Generation for the decoder-only model: greedy / sampled and beam search, over the KV cache."""
from __future__ import annotations

import torch

from attnlab.generation.beam_search import beam_search
from attnlab.generation.loop import capacity_for, decoding, left_pad, row_budgets, token_loop
from attnlab.generation.sampling import SamplingConfig


@decoding
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
    compiled: bool = False,
):
    """Continue each prompt until eos or its budget (`max_new_tokens`: one int, or one per row);
    returns token lists without eos (and the (B, steps, V) logits with `return_logits`).
    `compact`: in greedy decoding finished rows leave the batch (the same outputs, less compute).
    `compiled`: each token's step compiled (no compaction then: a smaller batch would be a new
    shape to compile)."""
    device = next(model.parameters()).device
    tokens, valid = left_pad(prompts, pad_id, device)
    budgets = row_budgets(max_new_tokens, len(prompts), device)
    state = model.new_state(len(prompts), capacity_for(tokens.shape[1], budgets), device, compiled=compiled)
    first = state.forward(model.stack, tokens, valid, last_only=True)

    def step(token, ok):
        return state.forward(model.stack, token[:, None], ok[:, None], last_only=True)

    return token_loop(step, first, budgets, eos_id=eos_id, pad_id=pad_id, sampling=sampling, generator=generator,
                      return_logits=return_logits, compact=state.keep if compact and not compiled else None)


@decoding
def generate_beam(model, prompts: list[list[int]], *, max_new_tokens: int | torch.Tensor, eos_id: int, pad_id: int,
                  beam_size: int, alpha: float, compact: bool = True, compiled: bool = False) -> list[list[int]]:
    """Beam search after the prompts: each prompt runs once, then its cache is copied to each beam.
    `compiled`: as in `generate` (compiled beams keep finished sources in the batch)."""
    device = next(model.parameters()).device
    n = len(prompts)
    tokens, valid = left_pad(prompts, pad_id, device)
    budgets = row_budgets(max_new_tokens, n, device)
    state = model.new_state(n, capacity_for(tokens.shape[1], budgets), device, compiled=compiled)
    after_prompt = state.forward(model.stack, tokens, valid, last_only=True).log_softmax(dim=-1)
    state.expand_beams(beam_size)

    def step(last_tokens, st):
        return state.forward(model.stack, last_tokens, last_only=True).log_softmax(dim=-1)

    return beam_search(step, after_prompt.repeat_interleave(beam_size, dim=0), state, n, beam_size, pad_id, eos_id,
                       budgets, alpha, compact=compact and not compiled)
