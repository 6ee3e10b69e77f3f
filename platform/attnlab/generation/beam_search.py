"""Batched beam search with the GNMT length penalty, over any model that decodes step by step."""
from __future__ import annotations

from typing import Callable

import torch

from attnlab.generation.loop import compaction_due


def length_penalty(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """GNMT (Wu et al., 2016): ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + lengths.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    step: Callable[[torch.Tensor, object], torch.Tensor],
    first_log_probs: torch.Tensor,
    state,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    max_lengths: torch.Tensor,
    alpha: float = 0.6,
    compact: bool = True,
) -> list[list[int]]:
    """Best hypothesis per source, without bos / eos.

    `first_log_probs` (batch_size * beam_size, V) predict the first token (each source's row
    repeated for its beams, as `token_loop` takes its `first_logits`). `state` holds
    batch_size * beam_size rows (beams of one source adjacent) and has a `reorder(rows,
    sources=None)` method (a DecodeState: rows move within their sources at each step, and sources
    leave with their rows at compaction); `step(last_tokens (N, 1), state) -> log-probabilities
    (N, V)` advances it by one token. A finished beam (eos, or max_lengths tokens) keeps its score
    and only extends with eos. Beams are ranked by raw log-probability while searching and by
    score / length penalty at the end. With beam_size 1 this is exactly greedy decoding.
    `compact`: a source whose beams have all finished leaves the batch and the state (see
    `compaction_due`); its hypotheses can no longer change, so the outputs are the same.
    """
    if len(first_log_probs) != batch_size * beam_size:
        raise ValueError(f"first_log_probs has {len(first_log_probs)} rows for {batch_size} sources x "
                         f"{beam_size} beams")
    device = max_lengths.device
    n, k = batch_size, beam_size
    scores = torch.full((n, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step is not k copies
    tokens = torch.full((n * k, 1), bos_id, dtype=torch.long, device=device)
    finished = torch.zeros(n * k, dtype=torch.bool, device=device)
    lengths = torch.zeros(n * k, dtype=torch.long, device=device)
    row_max = max_lengths.repeat_interleave(k)
    live = torch.arange(n, device=device)  # the original source of each source in the batch
    best: dict[int, list[int]] = {}
    log_probs = first_log_probs
    for t in range(int(max_lengths.max())):
        if t:
            log_probs = step(tokens[:, -1:], state)
        log_probs = log_probs.float()
        vocab = log_probs.shape[-1]
        eos_only = torch.full_like(log_probs, float("-inf"))
        eos_only[:, eos_id] = 0.0
        log_probs = torch.where(finished[:, None], eos_only, log_probs)
        candidates = (scores.view(n * k, 1) + log_probs).view(n, k * vocab)
        scores, flat = candidates.topk(k, dim=-1)
        beam = torch.div(flat, vocab, rounding_mode="floor")
        token = flat % vocab
        index = (beam + torch.arange(n, device=device)[:, None] * k).view(-1)
        state.reorder(index)
        token = token.view(-1)
        tokens = torch.cat((tokens.index_select(0, index), token[:, None]), dim=1)
        was_finished = finished.index_select(0, index)
        lengths = lengths.index_select(0, index) + (~was_finished).long()
        finished = was_finished | (token == eos_id) | (lengths >= row_max)
        if bool(finished.all()):
            break
        sources_done = finished.view(n, k).all(dim=1)
        if compact and compaction_due(sources_done):
            best.update(_best(tokens, scores, lengths, live, sources_done, k, alpha, eos_id))
            keep = (~sources_done).nonzero().squeeze(1)
            rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            state.reorder(rows, sources=keep)
            tokens, finished, lengths, row_max = (x.index_select(0, rows) for x in (tokens, finished, lengths, row_max))
            scores, live, n = scores.index_select(0, keep), live[keep], len(keep)
    best.update(_best(tokens, scores, lengths, live, torch.ones(n, dtype=torch.bool, device=device), k, alpha, eos_id))
    return [best[i] for i in range(batch_size)]


def _best(tokens, scores, lengths, live, chosen, k: int, alpha: float, eos_id: int) -> dict[int, list[int]]:
    """The best-scoring hypothesis (score / length penalty) of each chosen source, by original source."""
    n = len(live)
    final = scores / length_penalty(lengths, alpha).view(n, k)
    winners = final.argmax(dim=-1) + torch.arange(n, device=final.device) * k
    out = {}
    for source, row, take in zip(live.tolist(), tokens.index_select(0, winners)[:, 1:].tolist(), chosen.tolist()):
        if take:
            out[source] = row[: row.index(eos_id)] if eos_id in row else row
    return out
