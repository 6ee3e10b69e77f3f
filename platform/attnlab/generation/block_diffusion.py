"""Block-diffusion sampling: blocks left to right, each denoised from all-mask in a few steps.

Each step proposes a token for every masked position and keeps the k most confident (or k
random) ones; after the last step the block is clean, and its keys and values join the cache
in the first call of the next block.
"""
from __future__ import annotations

import torch

from attnlab.generation.loop import left_pad, row_budgets, strip_after_eos
from attnlab.generation.sampling import SamplingConfig, choose_next

UNMASKING = ("confidence", "random")


def unmask_schedule(block_size: int, steps: int) -> list[int]:
    """How many tokens each step reveals: `steps` near-equal counts that sum to the block size."""
    return [block_size // steps + (1 if s < block_size % steps else 0) for s in range(steps)]


def denoise_block(block, logits_of, steps: int, mask_id: int, sampling: SamplingConfig, unmasking: str,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Turn an all-mask (B, n) block into tokens in `steps` model calls."""
    rows, n = block.shape
    for count in unmask_schedule(n, steps):
        logits = logits_of(block)
        if sampling.temperature == 0.0 and unmasking == "confidence":
            score, proposal = logits.float().log_softmax(-1).max(-1)  # greedy: the proposal is the most likely
        else:
            proposal = choose_next(logits.reshape(rows * n, -1), sampling, generator).view(rows, n)
            if unmasking == "confidence":
                score = logits.float().log_softmax(-1).gather(-1, proposal[..., None]).squeeze(-1)
            else:
                score = torch.rand(rows, n, generator=generator, device=block.device)
        score = score.masked_fill(block != mask_id, float("-inf"))
        reveal = score.topk(count, dim=1).indices
        block = block.scatter(1, reveal, proposal.gather(1, reveal))
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
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Generate after each prompt until every row has produced eos or its budget of tokens
    (`max_new_tokens`: one int, or one per row) is out; a row is cut to its own budget."""
    device = next(model.parameters()).device
    mask_id = model.mask_id
    tokens, valid = left_pad(prompts, pad_id, device)
    rows = len(prompts)
    state = model.new_state(rows, device)
    to_commit = [(tokens, valid)]  # joins the cache in the next call

    def logits_of(x):
        clean, clean_valid = to_commit.pop() if to_commit else (None, None)
        return model.advance(clean, clean_valid, x, state)

    budgets = row_budgets(max_new_tokens, rows, device)
    done = budgets <= 0
    blocks = []
    for b in range((int(budgets.max()) + block_size - 1) // block_size if rows else 0):
        empty = torch.full((rows, block_size), mask_id, dtype=torch.long, device=device)
        block = denoise_block(empty, logits_of, steps, mask_id, sampling, unmasking, generator)
        to_commit.append((block, torch.ones_like(block, dtype=torch.bool)))
        blocks.append(block)
        done = done | (block == eos_id).any(dim=1) | ((b + 1) * block_size >= budgets)
        if bool(done.all()):
            break
    if not blocks:
        return [[] for _ in prompts]
    return strip_after_eos(torch.cat(blocks, dim=1), eos_id, budgets)
