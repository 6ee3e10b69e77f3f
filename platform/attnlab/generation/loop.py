"""What every generator shares: left padding, per-row budgets, the token-by-token loop, stripping."""
from __future__ import annotations

import functools
from typing import Callable

import torch

from attnlab.components.linear import decode_layout
from attnlab.generation.sampling import SamplingConfig, choose_next


def decoding(generator: Callable) -> Callable:
    """A generator `f(model, ...)` run without gradients and with the model's wide weights laid out
    for decoding (`decode_layout`) for the whole call."""
    @functools.wraps(generator)
    def decode(model, *args, **kwargs):
        with torch.no_grad(), decode_layout(model):
            return generator(model, *args, **kwargs)
    return decode


def left_pad(prompts: list[list[int]], pad_id: int, device=None):
    """Left-pad so every row's next token lands in the same column; returns tokens and validity."""
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, width - len(p):] = True
    return tokens, valid


def row_budgets(max_new_tokens, rows: int, device) -> torch.Tensor:
    """(rows,) token budgets from one int or one per row, so a row's length limit never depends on
    its batch-mates (greedy and beam outputs then do not either)."""
    return torch.as_tensor(max_new_tokens, dtype=torch.long, device=device).expand(rows).clone()


def capacity_for(prefix: int, budgets: torch.Tensor) -> int:
    """Slots a decode's caches need so that they never grow: the prefix plus the longest budget
    (the last token chosen is never fed back, but one spare slot costs nothing)."""
    return prefix + max(int(budgets.max()), 0) if len(budgets) else prefix


def strip_after_eos(rows: torch.Tensor, eos_id: int, budgets: torch.Tensor | None = None) -> list[list[int]]:
    """Each row up to its eos (excluded), and to at most its budget of tokens when given."""
    out = []
    limits = budgets.tolist() if budgets is not None else [None] * len(rows)
    for row, limit in zip(rows.tolist(), limits):
        row = row[:limit]
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def compaction_due(finished: torch.Tensor) -> bool:
    """Drop finished rows once they are at least an eighth of the batch: each compaction copies
    the caches, so it waits until there is compute to save."""
    n = int(finished.sum())
    return n > 0 and n >= max(1, len(finished) // 8)


def token_loop(
    next_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    first_logits: torch.Tensor,
    budgets: torch.Tensor,
    *,
    eos_id: int,
    pad_id: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    return_logits: bool = False,
    compact: Callable[[torch.Tensor], None] | None = None,
):
    """Greedy / sampled decoding, one token per step, for any model with a cache.

    `first_logits` (B, V) predict the first token; `next_logits(tokens (b,), valid (b,))` feeds the
    chosen tokens of the rows still in the batch back (a finished row gets pad, marked not valid)
    and returns their next (b, V). With `compact(index)` (the state's reorder), finished rows of a
    greedy decoding leave the batch and its caches (see `compaction_due`), so they stop costing
    compute; its outputs do not change. (Sampling keeps every row: the random draws of a smaller
    batch would differ, and seeded samples would depend on which rows ended first.) Stops when every row has produced eos or used its budget; returns
    token lists without eos (and the (B, steps, V) logits with `return_logits`, never compacted).
    """
    rows = len(budgets)
    steps = max(int(budgets.max()), 0) if rows else 0
    out = torch.full((rows, steps), pad_id, dtype=torch.long, device=budgets.device)
    live = torch.arange(rows, device=budgets.device)  # the original row of each row in the batch
    finished = budgets <= 0
    all_logits = []
    logits = first_logits
    step = -1
    for step in range(steps):
        all_logits.append(logits)
        token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        out[live, step] = token
        valid = ~finished
        finished = finished | (token == eos_id) | (step + 1 >= budgets[live])
        if bool(finished.all()):
            break
        if compact is not None and not return_logits and sampling.temperature == 0.0 and compaction_due(finished):
            keep = (~finished).nonzero().squeeze(1)
            compact(keep)
            live, token, valid, finished = live[keep], token[keep], valid[keep], finished[keep]
        logits = next_logits(token, valid)
    if not steps:
        return ([[] for _ in range(rows)], None) if return_logits else [[] for _ in range(rows)]
    result = strip_after_eos(out[:, : step + 1], eos_id, budgets)
    return (result, torch.stack(all_logits, dim=1)) if return_logits else result
