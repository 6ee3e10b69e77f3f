"""Block-diffusion sampling: blocks left to right, each denoised from all-mask in a few steps.

Each step proposes a token for every masked position and keeps the k most confident (or k
random) ones, or every one whose probability passes a threshold (adaptive: as many calls as the
block needs), or (first_hitting, BD3-LM's sampler) reveals one uniformly chosen masked position
with a token drawn from its distribution; once the block is clean, its keys and values join the
cache in the first call of the next block.
"""
from __future__ import annotations

import math

import torch

from attnlab.generation.loop import compaction_due, fixed_capacity, left_pad, row_budgets, strip_after_eos
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


def denoise_block(block, logits_of, steps: int, mask_id: int, sampling: SamplingConfig, unmasking: str,
                  generator: torch.Generator | None = None, threshold: float = 0.9) -> torch.Tensor:
    """Turn an all-mask (B, n) block into tokens: in `steps` model calls (confidence, random), or,
    with unmasking "threshold", revealing each call every masked position whose proposal has
    probability >= `threshold` (at least the most confident one per row), until the block is clean."""
    if unmasking == "threshold":
        return _denoise_by_threshold(block, logits_of, mask_id, sampling, threshold, generator)
    if unmasking == "first_hitting":
        return _denoise_first_hitting(block, logits_of, mask_id, sampling, generator)
    for count in unmask_schedule(block.shape[1], steps):
        proposal, score = propose(logits_of(block), sampling, unmasking, generator)
        score = score.masked_fill(block != mask_id, float("-inf"))
        reveal = score.topk(count, dim=1).indices
        block = block.scatter(1, reveal, proposal.gather(1, reveal))
    return block


def _denoise_by_threshold(block, logits_of, mask_id: int, sampling: SamplingConfig, threshold: float,
                          generator: torch.Generator | None) -> torch.Tensor:
    """Adaptive parallel decoding (Fast-dLLM's rule): easy blocks finish in one call, hard ones
    take up to one call per token. A row whose block is clean waits for the others unchanged."""
    floor = math.log(threshold) if threshold > 0 else float("-inf")
    while True:
        masked = block == mask_id
        if not bool(masked.any()):
            return block
        proposal, score = propose(logits_of(block), sampling, "threshold", generator)
        score = score.masked_fill(~masked, float("-inf"))
        # tau = 1 is one token a call even where float32 rounds a probability to exactly 1
        reveal = masked & (score >= floor) if threshold < 1 else torch.zeros_like(masked)
        best = score.argmax(dim=1, keepdim=True)
        reveal = reveal.scatter(1, best, masked.gather(1, best))  # progress on every row still masked
        block = torch.where(reveal, proposal, block)


def _denoise_first_hitting(block, logits_of, mask_id: int, sampling: SamplingConfig,
                           generator: torch.Generator | None) -> torch.Tensor:
    """BD3-LM's first-hitting sampler: each call reveals exactly one masked position per row,
    chosen uniformly at random, its token drawn (per `sampling`) from that position's
    distribution alone. Unlike confidence ordering it does not favour low-entropy tokens."""
    rows = torch.arange(block.shape[0], device=block.device)
    for _ in range(block.shape[1]):
        logits = logits_of(block)
        pick = torch.rand(block.shape, generator=generator, device=block.device)
        position = pick.masked_fill(block != mask_id, -1.0).argmax(dim=1)
        token = choose_next(logits[rows, position], sampling, generator)
        block = block.clone()
        block[rows, position] = token
    return block


@torch.no_grad()
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
    fixed: bool = False,
    compiled: bool = False,
) -> list[list[int]]:
    """Generate after each prompt until every row has produced eos or its budget of tokens
    (`max_new_tokens`: one int, or one per row) is out; a row is cut to its own budget.
    `compact`: in greedy decoding finished rows leave the batch (the same outputs, less compute).
    `fixed`: a fixed-capacity cache; `compiled`: that, and each model call compiled (no compaction)."""
    device = next(model.parameters()).device
    mask_id = model.mask_id
    tokens, valid = left_pad(prompts, pad_id, device)
    rows = len(prompts)
    budgets = row_budgets(max_new_tokens, rows, device)
    n_blocks = max(int(budgets.max()) + block_size - 1, 0) // block_size if rows else 0
    # A fixed cache holds the prompt and every block, the last one's trial included.
    capacity = fixed_capacity(tokens.shape[1], torch.tensor([n_blocks * block_size]), fixed or compiled)
    state = model.new_state(rows, device, capacity)
    to_commit = [(tokens, valid)]  # joins the cache in the next call

    def logits_of(x):
        clean, clean_valid = to_commit.pop() if to_commit else (None, None)
        return model.advance(clean, clean_valid, x, state, compiled)

    done = budgets <= 0
    compact = compact and not compiled
    deterministic = sampling.temperature == 0.0 and unmasking not in ("random", "first_hitting")  # see token_loop on sampling
    out = torch.full((rows, n_blocks * block_size), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the original row of each row in the batch
    for b in range(n_blocks):
        empty = torch.full((len(live), block_size), mask_id, dtype=torch.long, device=device)
        block = denoise_block(empty, logits_of, steps, mask_id, sampling, unmasking, generator, threshold)
        out[live, b * block_size : (b + 1) * block_size] = block
        done = done | (block == eos_id).any(dim=1) | ((b + 1) * block_size >= budgets[live])
        if bool(done.all()):
            break
        if compact and deterministic and compaction_due(done):  # finished rows leave the batch and its caches
            keep = (~done).nonzero().squeeze(1)
            state.reorder(keep)
            live, block, done = live[keep], block[keep], done[keep]
        to_commit.append((block, torch.ones_like(block, dtype=torch.bool)))
    if not n_blocks:
        return [[] for _ in prompts]
    return strip_after_eos(out, eos_id, budgets)
