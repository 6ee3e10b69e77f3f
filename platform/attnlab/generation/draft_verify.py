"""Draft-and-verify decoding: block diffusion drafts, the same model's AR view checks (after TiDAR).

A BlockDiffusion model with `shift` and a causal clean context holds an exact AR model: a clean
token's hidden state predicts the next token as a decoder-only model's does (the AR loss trains
it). A verifying call feeds n candidates as clean tokens (the token the AR view chose last, then
n - 1 drafted tokens after it) and a block of n masks after them. In that one pass the AR view's
prediction after each candidate checks the next candidate, and the masked block drafts what
follows the candidates: its first position is predicted from the last candidate's hidden state,
which is the AR view's own next token. The call keeps the longest run of drafts the AR view agrees
with and adds the AR view's token after it (the correction at the first disagreement, or the next
token when every draft agreed): 1 to n tokens a call. The cache keeps the kept candidates' keys;
the rejected ones are taken back (`DecodeState.retract`) and their slots written over.

When every draft agreed, the block drafted in the same call follows the new token: it is the next
call's candidates. After a rejection there is no draft made after the correction, so the row's
next call drafts only: the correction as its one clean token, a block of masks after it (one token
made: the AR view's next, with fresh drafts after it). TiDAR instead drafts a block after every
possible rejection point in each call (n + n² tokens a call); one more small call after a rejection
is the cheaper trade on a CPU, where a call's cost grows with its tokens. Rows of a batch verify or
draft each on their own; a call is n tokens wide while any row verifies.

Greedy: the output is the AR view's greedy decoding, token for token. Sampling (temperature > 0):
the speculative rule (Leviathan et al. 2023, Chen et al. 2023): a draft x drawn from q is kept with
probability min(1, p(x) / q(x)), else the token is drawn from max(0, p - q) renormalised; the output
is then distributed as the AR view's own sampling, p and q both after temperature, top-k and top-p.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from attnlab.generation.loop import compaction_due, decoding, left_pad, row_budgets, strip_after_eos
from attnlab.generation.sampling import SamplingConfig, choose_next, filtered_probs

# A test double for the diffusion view: (drafts (B, k), each row's index among the prompts (B,), the
# output index of its first draft (B,)) -> drafts.
Drafter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# Slots past a row's budget its calls may reach, in blocks: a row may end up to a block past its
# budget, and a finished row still in the batch (sampling, compiled) is fed a masked block and a
# block of padding after its end.
DRAFT_SPAN = 3


def replayed_drafts(truth: torch.Tensor, kept: bool, vocab: int, mask_id: int) -> Drafter:
    """A drafter that replays the AR view's own greedy tokens `truth` (rows, enough tokens to reach
    past each row's budget): every draft kept, or, with `kept` False, a token next to each (never
    the mask), so no draft is. The bench times draft-and-verify's fastest and slowest cases with
    it: untrained weights draft nothing a trained model would."""
    def draft(drafts: torch.Tensor, rows: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        at = (start[:, None] + torch.arange(drafts.shape[1], device=drafts.device)).clamp(max=truth.shape[1] - 1)
        right = truth.to(drafts.device)[rows[:, None], at]
        if kept:
            return right
        wrong = (right + 1) % vocab
        return torch.where(wrong == mask_id, (right + 2) % vocab, wrong)
    return draft


@dataclass
class DraftStats:
    """What a decoding's drafts did, by draft position 1 .. n - 1 after the AR view's token:
    `checked` (drafts a call reached: every draft before them agreed) and `agreed` (of those, equal
    to the AR view's choice, greedy; kept by the speculative rule, sampling), summed over rows. `calls`: model calls; `row_calls`: calls times
    the rows in them still decoding; `tokens`: tokens made (eos included), so tokens per call, k,
    is `tokens / row_calls` whatever the batch."""

    calls: int = 0
    row_calls: int = 0
    tokens: int = 0
    checked: list[int] = field(default_factory=list)
    agreed: list[int] = field(default_factory=list)

    def add(self, other: "DraftStats") -> None:
        for name in ("calls", "row_calls", "tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("checked", "agreed"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, [a + b for a, b in zip(mine, theirs)] if mine else list(theirs))

    @property
    def agreement(self) -> list[float]:
        """p by draft position: the share of drafts reached that agreed with the AR view."""
        return [a / c if c else float("nan") for a, c in zip(self.agreed, self.checked)]

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.row_calls if self.row_calls else float("nan")


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, k, V) logits -> tokens (B, k) and, when sampling, the distributions they were drawn from."""
    if sampling.temperature == 0.0:
        return logits.argmax(-1), None
    probs = filtered_probs(logits, sampling)
    rows, k, vocab = probs.shape
    return torch.multinomial(probs.view(rows * k, vocab), 1, generator=generator).view(rows, k), probs


def accept(candidates: torch.Tensor, n_clean: torch.Tensor, drafted_from: torch.Tensor | None,
           logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None = None):
    """One call's verification. `candidates` (B, c): the AR view's last token, then drafts, of which
    each row fed its first `n_clean` (B,) (1: a row that only drafts); `drafted_from` (B, c, V): when
    sampling, the distribution each draft was drawn from (column 0 unused); `logits`
    (B, c + n - 1, V): the call's, the AR view's after each candidate, then the block's masks'.

    Returns `kept` m (B,): drafts kept; `emitted` (B, c): the call's tokens, the first m + 1 real
    (the kept drafts, then the AR view's token); `checked` and `agreed` (B, c - 1): which drafts
    were reached (every draft before them agreed) and which of those agreed; the next candidates (B, n): the new token, then when every draft
    was kept the block drafted after it (else anything: the row drafts next), their distributions
    (None when greedy), and whether every draft was kept (B,)."""
    rows, c = candidates.shape
    n = logits.shape[1] - c + 1
    drafts = candidates[:, 1:]
    checked = torch.arange(c - 1, device=candidates.device) < (n_clean - 1)[:, None]
    ar_logits = logits[:, :c]
    if sampling.temperature == 0.0:
        ar = ar_logits.argmax(-1)  # the AR view's token after each candidate
        agreed = (drafts == ar[:, :-1]) & checked
        kept = agreed.long().cumprod(1).sum(1)
        new = ar.gather(1, kept[:, None])
    else:
        p = filtered_probs(ar_logits, sampling)
        p_draft = p[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)
        q_draft = drafted_from[:, 1:].gather(-1, drafts[..., None]).squeeze(-1)  # > 0: each draft was drawn from it
        agreed = (torch.rand(drafts.shape, generator=generator, device=drafts.device) * q_draft < p_draft) & checked
        kept = agreed.long().cumprod(1).sum(1)
        vocab = p.shape[-1]
        at = kept[:, None, None].expand(-1, 1, vocab)
        p_new = p.gather(1, at).squeeze(1)
        q_new = drafted_from.gather(1, (at + 1).clamp(max=c - 1)).squeeze(1)
        q_new = q_new.masked_fill((kept == n_clean - 1)[:, None], 0.0)  # all kept: the next token is drawn from p
        residual = (p_new - q_new).clamp(min=0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_new)  # p == q: never rejected
        new = torch.multinomial(residual, 1, generator=generator)
    all_kept = kept == n_clean - 1
    position = torch.arange(c - 1, device=candidates.device)
    # A draft after a rejected one is checked against a prediction made after a wrong token: only
    # the drafts a call reached (all before them agreed) count, so p is the AR view's agreement.
    checked, agreed = checked & (position <= kept[:, None]), position < kept[:, None]
    # The block's masks follow each row's last clean token; the first is the AR view's `new`.
    block, block_from = _choose(logits[:, c:], sampling, generator)  # (B, n - 1): offsets 2 .. n after `new`
    emitted = torch.where(torch.arange(c, device=candidates.device) == kept[:, None], new,
                          torch.cat((drafts, new), dim=1))
    next_candidates = torch.cat((new, block), dim=1)
    next_from = None if block_from is None else torch.cat((torch.zeros_like(block_from[:, :1]), block_from), dim=1)
    return kept, emitted, checked, agreed, next_candidates, next_from, all_kept


@decoding
def draft_and_verify(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int | torch.Tensor,
    block_size: int,
    eos_id: int,
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    compact: bool = True,
    compiled: bool = False,
    stats: DraftStats | None = None,
    drafter: Drafter | None = None,
) -> list[list[int]]:
    """Generate after each prompt until eos or its budget (`max_new_tokens`: one int, or one per
    row), drafting blocks of `block_size` (see the module's doc). `compact`: in greedy decoding
    finished rows leave the batch; `compiled`: each model call compiled (no compaction). `stats`:
    filled with what the drafts did. `drafter` (tests, greedy only): replaces the diffusion view's
    drafts."""
    device = next(model.parameters()).device
    n = block_size
    if n < 2:
        raise ValueError(f"draft-and-verify needs blocks of at least 2 tokens (block_size={n})")
    if drafter is not None and sampling.temperature != 0.0:
        raise ValueError("a drafter replaces greedy drafts only: sampling needs the distributions drafts come from")
    tokens, valid = left_pad(prompts, pad_id, device)
    rows = len(prompts)
    budgets = row_budgets(max_new_tokens, rows, device)
    longest = max(int(budgets.max()), 0) if rows else 0
    if not longest:
        return [[] for _ in prompts]
    state = model.new_state(rows, tokens.shape[1] + longest + DRAFT_SPAN * n, device, compiled=compiled)
    compact = compact and sampling.temperature == 0.0 and not compiled
    out = torch.full((rows, longest + 2 * n), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the original row of each row in the batch
    checked_sum = agreed_sum = torch.zeros(n - 1, dtype=torch.long, device=device)

    # The prompt's call drafts only: the AR view's first token, and a block after it.
    logits = model.draft_call(tokens, valid, n, state, first=tokens.shape[1] - 1)
    first, _ = _choose(logits[:, :1], sampling, generator)
    drafts, drafted_from = _choose(logits[:, 1:], sampling, generator)
    if drafted_from is not None:
        drafted_from = torch.cat((torch.zeros_like(drafted_from[:, :1]), drafted_from), dim=1)
    candidates = torch.cat((first, drafts), dim=1)
    verifying = torch.ones(rows, dtype=torch.bool, device=device)
    out[:, 0] = first[:, 0]
    length = torch.ones(rows, dtype=torch.long, device=device)  # tokens written per row
    done = (first[:, 0] == eos_id) | (length >= budgets)
    calls, row_calls = 1, rows
    while not bool(done.all()):
        if compact and compaction_due(done):  # finished rows leave the batch and its caches
            keep = (~done).nonzero().squeeze(1)
            state.keep(keep)
            live, candidates, length, done, verifying = (x[keep] for x in (live, candidates, length, done, verifying))
        active = ~done
        if drafter is not None:  # the drafts after the AR view's last token, at output index length
            candidates[:, 1:] = drafter(candidates[:, 1:], live, length)
        width = n if bool((verifying & active).any()) else 1
        n_clean = torch.where(verifying, n, 1)
        fed = (torch.arange(width, device=device) < n_clean[:, None]) & active[:, None]
        logits = model.draft_call(candidates[:, :width], fed, n, state, first=0)
        calls += 1
        row_calls += int(active.sum())
        kept, emitted, checked, agreed, candidates, next_from, verifying = accept(
            candidates[:, :width], n_clean, None if drafted_from is None else drafted_from[:, :width], logits,
            sampling, generator)
        drafted_from = next_from
        # A finished row's call wrote nothing (its tokens were not valid); the others keep m + 1 keys.
        state.retract(torch.where(active, n_clean - 1 - kept, 0))
        place = torch.arange(width, device=device)
        out[live[:, None], length[:, None] + place] = emitted  # past the real: cut later
        is_eos = emitted == eos_id
        # Draft i lands at place i of `emitted`: it counts while the row has neither ended nor run out.
        counts = active[:, None] & ((is_eos.long().cumsum(1) - is_eos.long()) == 0) \
            & (length[:, None] + place < budgets[live][:, None])
        checked_sum = checked_sum + _by_position(checked & counts[:, :-1], n)
        agreed_sum = agreed_sum + _by_position(agreed & counts[:, :-1], n)
        ended = (is_eos & (place <= kept[:, None])).any(1)
        length = length + torch.where(active, kept + 1, 0)
        done = done | (active & ended) | (length >= budgets[live])
    result = strip_after_eos(out, eos_id, budgets)
    if stats is not None:
        produced = sum(len(r) + (1 if len(r) < b else 0) for r, b in zip(result, budgets.tolist()))  # eos counts
        stats.add(DraftStats(calls, row_calls, produced, checked_sum.tolist(), agreed_sum.tolist()))
    return result


def _by_position(flags: torch.Tensor, n: int) -> torch.Tensor:
    """(B, c - 1) flags of draft positions 1 .. c - 1 -> their counts over rows, as (n - 1,)."""
    counts = flags.long().sum(0)
    return torch.nn.functional.pad(counts, (0, n - 1 - len(counts)))
