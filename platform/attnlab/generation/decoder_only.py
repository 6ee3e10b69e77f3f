"""Autoregressive generation for the decoder-only model, with or without the KV cache."""
from __future__ import annotations

import torch

from attnlab.generation.beam import beam_search
from attnlab.generation.sampling import SamplingConfig, choose_next


def left_pad(prompts: list[list[int]], pad_id: int, device=None):
    """Left-pad so every row's next token lands in the same column; returns tokens and validity."""
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, width - len(p):] = True
    return tokens, valid


def strip_after_eos(rows: torch.Tensor, eos_id: int, budgets: torch.Tensor | None = None) -> list[list[int]]:
    """Each row up to its eos (excluded), and to at most its budget of tokens when given."""
    out = []
    limits = budgets.tolist() if budgets is not None else [None] * len(rows)
    for row, limit in zip(rows.tolist(), limits):
        row = row[:limit]
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def row_budgets(max_new_tokens, rows: int, device) -> torch.Tensor:
    """(rows,) token budgets from one int for the batch or one per row, so a row's length limit
    never depends on which other rows share its batch (greedy and beam outputs then do not
    either; sampled ones still share the batch's random stream)."""
    return torch.as_tensor(max_new_tokens, dtype=torch.long, device=device).expand(rows).clone()


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int | torch.Tensor,
    eos_id: int,
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    return_logits: bool = False,
):
    """Continue each prompt until eos or its budget (`max_new_tokens`: one int, or one per row);
    returns token lists without eos.

    With `use_cache=False` every step recomputes the whole sequence: the reference that the
    cached path must match. `return_logits` also returns the (B, steps, V) logits.
    """
    device = next(model.parameters()).device
    tokens, valid = left_pad(prompts, pad_id, device)
    state = model.new_state(len(prompts), device) if use_cache else None
    logits = model(tokens, valid, state)[:, -1]
    budgets = row_budgets(max_new_tokens, len(prompts), device)
    finished = budgets <= 0
    chosen, all_logits = [], []
    for step in range(int(budgets.max()) if len(prompts) else 0):
        all_logits.append(logits)
        next_token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        chosen.append(next_token)
        step_valid = ~finished
        finished = finished | (next_token == eos_id) | (step + 1 >= budgets)
        if bool(finished.all()):
            break
        if use_cache:
            logits = model(next_token[:, None], step_valid[:, None], state)[:, -1]
        else:
            tokens = torch.cat((tokens, next_token[:, None]), dim=1)
            valid = torch.cat((valid, step_valid[:, None]), dim=1)
            logits = model(tokens, valid)[:, -1]
    out = strip_after_eos(torch.stack(chosen, dim=1), eos_id, budgets) if chosen else [[] for _ in prompts]
    return (out, torch.stack(all_logits, dim=1)) if return_logits else out


@torch.no_grad()
def generate_beam(model, prompts: list[list[int]], max_new_tokens: int | torch.Tensor, eos_id: int, pad_id: int,
                  beam_size: int, alpha: float) -> list[list[int]]:
    """Beam search after the prompts: the prompt is run once per source, then its cache is
    copied to each beam."""
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

    return beam_search(step, state, n, beam_size, pad_id, eos_id, row_budgets(max_new_tokens, n, device), alpha)
