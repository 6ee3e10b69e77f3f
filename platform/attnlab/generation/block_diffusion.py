"""Block-diffusion sampling: blocks left to right, each denoised from all-mask in a few calls.

Each call proposes a token for every masked position and keeps the k most confident (or k
random) ones, or every one whose probability passes a threshold (adaptive: as many calls as the
block needs), or (first_hitting, BD3-LM's sampler) reveals one uniformly chosen masked position
with a token drawn from its distribution; once a row's block is clean, its keys and values join
the cache in the row's next call, which already denoises its next block. Rows are ragged: each
moves through its own blocks, so with a threshold no row waits for a harder one.
"""
from __future__ import annotations

import math

import torch

from attnlab.generation.loop import compaction_due, decoding, left_pad, row_budgets, strip_after_eos
from attnlab.generation.sampling import SamplingConfig, choose_next

UNMASKING = ("confidence", "random", "threshold", "first_hitting")


def unmask_schedule(block_size: int, steps: int) -> list[int]:
    """How many tokens each step reveals: `steps` near-equal counts that sum to the block size."""
    return [block_size // steps + (1 if s < block_size % steps else 0) for s in range(steps)]


def propose(logits: torch.Tensor, sampling: SamplingConfig, unmasking: str,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, n, V) logits -> a token for every position and its score: the token's log-probability
    (confidence, threshold) or a uniform draw (random)."""
    rows, n, _ = logits.shape
    if sampling.temperature == 0.0 and unmasking != "random":
        score, proposal = logits.float().log_softmax(-1).max(-1)  # greedy: the proposal is the most likely
        return proposal, score
    proposal = choose_next(logits.reshape(rows * n, -1), sampling, generator).view(rows, n)
    if unmasking == "random":
        return proposal, torch.rand(rows, n, generator=generator, device=logits.device)
    return proposal, logits.float().log_softmax(-1).gather(-1, proposal[..., None]).squeeze(-1)


def reveal(block, logits, calls: int, steps: int, mask_id: int, sampling: SamplingConfig, unmasking: str,
           generator: torch.Generator | None = None, threshold: float = 0.9) -> torch.Tensor:
    """One denoising call's choice: the (B, n) block with some masked positions revealed from the
    call's logits (B, n, V); `calls`: how many calls this block has had (the schedule's step).

    confidence / random: the schedule's count of the most confident (or random) positions, so a
    block takes `steps` calls; threshold: every masked position whose proposal has probability
    >= `threshold`, and at least the most confident one per row (Fast-dLLM's rule: easy blocks
    finish in one call, hard ones take up to one per token); first_hitting (BD3-LM's sampler): one
    uniformly chosen masked position per row, its token drawn (per `sampling`) from that
    position's distribution alone, unlike confidence ordering, which favours low-entropy tokens.
    A row with nothing masked is left as it is."""
    masked = block == mask_id
    if unmasking == "first_hitting":
        rows = torch.arange(block.shape[0], device=block.device)
        pick = torch.rand(block.shape, generator=generator, device=block.device)
        position = pick.masked_fill(~masked, -1.0).argmax(dim=1)
        token = choose_next(logits[rows, position], sampling, generator)
        return block.index_put((rows, position), torch.where(masked[rows, position], token, block[rows, position]))
    proposal, score = propose(logits, sampling, unmasking, generator)
    score = score.masked_fill(~masked, float("-inf"))
    if unmasking == "threshold":
        floor = math.log(threshold) if threshold > 0 else float("-inf")
        # tau = 1 is one token a call even where float32 rounds a probability to exactly 1
        chosen = masked & (score >= floor) if threshold < 1 else torch.zeros_like(masked)
        best = score.argmax(dim=1, keepdim=True)
        chosen = chosen.scatter(1, best, masked.gather(1, best))  # progress on every row still masked
        return torch.where(chosen, proposal, block)
    count = unmask_schedule(block.shape[1], steps)[calls]
    chosen = score.topk(count, dim=1).indices
    return block.scatter(1, chosen, torch.where(masked.gather(1, chosen), proposal.gather(1, chosen),
                                                 block.gather(1, chosen)))


@decoding
def sample_blocks(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int | torch.Tensor,
    block_size: int,
    steps: int,
    eos_id: int,
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    unmasking: str = "confidence",
    threshold: float = 0.9,
    generator: torch.Generator | None = None,
    compact: bool = True,
    ragged: bool = True,
    compiled: bool = False,
) -> list[list[int]]:
    """Generate after each prompt until every row has produced eos or its budget of tokens
    (`max_new_tokens`: one int, or one per row) is out; a row is cut to its own budget.

    `ragged`: each row moves through its own blocks: a row whose block is clean commits it (in
    the next call, with the other rows' commits) and starts its next block while the others keep
    denoising, so threshold decoding makes as many calls per row as the row alone would
    (without: the batch waits for its slowest row's block). Confidence, random and first-hitting
    blocks take the same number of calls on every row, so they move in step either way.
    `compact`: in deterministic decoding finished rows leave the batch (the same outputs, less
    compute). `compiled`: each model call compiled (no compaction)."""
    device = next(model.parameters()).device
    mask_id = model.mask_id
    tokens, valid = left_pad(prompts, pad_id, device)
    rows = len(prompts)
    budgets = row_budgets(max_new_tokens, rows, device)
    n_blocks = max(int(budgets.max()) + block_size - 1, 0) // block_size if rows else 0
    if not n_blocks:
        return [[] for _ in prompts]
    # The prompt, every block, and the last one's trial (its clean predecessor joins in the same call).
    state = model.new_state(rows, tokens.shape[1] + (n_blocks + 1) * block_size, device, compiled=compiled)
    compact = compact and not compiled
    deterministic = sampling.temperature == 0.0 and unmasking not in ("random", "first_hitting")  # see token_loop on sampling
    out = torch.full((rows, n_blocks * block_size), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the original row of each row in the batch
    done = budgets <= 0
    blocks_done = torch.zeros(rows, dtype=torch.long, device=device)  # per row in the batch
    block = torch.full((rows, block_size), mask_id, dtype=torch.long, device=device)
    clean, clean_valid = tokens, valid  # joins the cache in the next call
    calls = 0  # calls on the current block (the same for every row, unless threshold-ragged)
    while True:
        logits = model.advance(clean, clean_valid, block, state)
        block = reveal(block, logits, calls, steps, mask_id, sampling, unmasking, generator, threshold)
        calls += 1
        ready = (block != mask_id).all(dim=1) & ~done
        if not bool(ready.any() if ragged else ready.any() & (ready | done).all()):  # no row commits yet
            clean = None
            continue
        columns = blocks_done[:, None] * block_size + torch.arange(block_size, device=device)
        at = ready.nonzero().squeeze(1)
        out[live[at, None], columns[at]] = block[at]
        blocks_done = blocks_done + ready.long()
        done = done | (ready & ((block == eos_id).any(dim=1) | (blocks_done * block_size >= budgets[live])))
        if bool(done.all()):
            break
        clean, clean_valid = block, (ready & ~done)[:, None].expand_as(block)
        block = torch.where(ready[:, None], mask_id, block)
        calls = 0
        if compact and deterministic and compaction_due(done):  # finished rows leave the batch and its caches
            keep = (~done).nonzero().squeeze(1)
            state.keep(keep)
            live, block, done, blocks_done = live[keep], block[keep], done[keep], blocks_done[keep]
            clean, clean_valid = clean[keep], clean_valid[keep]
    return strip_after_eos(out, eos_id, budgets)
