"""Absorbing-state (masked) diffusion with the log-linear schedule, one noise level per block.

Under the log-linear schedule a token is masked at time t with probability t, and the
continuous-time NELBO weights the cross-entropy of each masked token by 1/t (MDLM, BD3-LM);
unmasked tokens carry no loss.
"""
from __future__ import annotations

import torch


def sample_block_times(
    n_rows: int, n_blocks: int, low: float, high: float, antithetic: bool = True,
    generator: torch.Generator | None = None, device=None,
) -> torch.Tensor:
    """(n_rows, n_blocks) noise levels t ~ U[low, high].

    Antithetic (stratified) sampling puts one draw in each of the n equal slices of [0, 1) and
    shuffles them over the blocks: the batch covers the whole range, which lowers the variance
    of the loss without biasing it.
    """
    n = n_rows * n_blocks
    u = torch.rand(n, generator=generator, device=device)
    if antithetic and n > 1:
        strata = torch.arange(n, device=device) / n
        u = (u / n + strata)[torch.randperm(n, generator=generator, device=device)]
    return (low + (high - low) * u).view(n_rows, n_blocks)


def example_noise(seeds: list[int], blocks: torch.Tensor, low: float, high: float, antithetic: bool = True):
    """Evaluation noise that belongs to each example, not to its batch: row r draws its block times
    (stratified over its own blocks) and its masking uniforms from a generator seeded by seeds[r]
    (its index in the split), for its own blocks and positions only. So an example's NELBO is the
    same in any batch, at any eval batch size and on any number of ranks.

    Returns t (B, n_blocks) and the masking uniforms (B, L) for `mask_blocks`.
    """
    rows, length = blocks.shape
    n_blocks = max(int(blocks.max()) if blocks.numel() else 0, 1)
    t = torch.ones(rows, n_blocks)
    draw = torch.ones(rows, length)  # padding: never below t where it matters (it is masked out anyway)
    for r, (seed, row) in enumerate(zip(seeds, blocks.cpu())):
        generator = torch.Generator().manual_seed(int(seed))
        real = row >= 0
        mine = int(row.max()) if bool(real.any()) else 0
        if mine:
            u = torch.rand(mine, generator=generator)
            if antithetic and mine > 1:
                u = (u + torch.randperm(mine, generator=generator)) / mine
            t[r, :mine] = low + (high - low) * u
        draw[r, real] = torch.rand(int(real.sum()), generator=generator)
    return t.to(blocks.device), draw.to(blocks.device)


def mask_blocks(tokens: torch.Tensor, blocks: torch.Tensor, t: torch.Tensor, mask_id: int,
                generator: torch.Generator | None = None, draw: torch.Tensor | None = None):
    """Mask each token of target block b (1-based; -1 = padding) with probability t[:, b - 1]
    (`draw`: the uniforms to compare with t, else drawn from `generator`).

    Returns the noisy tokens, the masked positions and each token's t, all (B, L).
    """
    t_token = t.gather(1, (blocks - 1).clamp(min=0))
    if draw is None:
        draw = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    masked = (draw < t_token) & (blocks >= 0)
    return torch.where(masked, mask_id, tokens), masked, t_token


def enforced_bounds(low: float, high: float) -> tuple[float | None, float | None]:
    """The bounds `resample` enforces: bd3lms leaves a range's edge at the evaluation floor
    (<= 1e-3) or at 1 unenforced."""
    return (low if low > 1e-3 else None), (high if high < 1.0 else None)


def reachable(low: float, high: float, block_size: int) -> bool:
    """Can a block of `block_size` tokens have a masked fraction inside the enforced bounds?"""
    lo, hi = enforced_bounds(low, high)
    return any((lo is None or k / block_size >= lo) and (hi is None or k / block_size <= hi)
               for k in range(block_size + 1))


BD3LMS_WIDTHS = (0.5, 0.6, 0.7, 0.8, 0.9)  # bd3lms's scripts' clip_search_widths
BD3LMS_STEP = 0.05  # how far each width's window slides (its clip_search_delta)


def bd3lms_windows(floor: float = 1e-3) -> list[tuple[float, float]]:
    """bd3lms's candidate training ranges: the full range [floor, 1], then every window of width
    0.5, 0.6, 0.7, 0.8 and 0.9 slid over [0, 1] in steps of 0.05, its low end kept above `floor`."""
    windows = [(floor, 1.0)]
    for width in BD3LMS_WIDTHS:
        for i in range(int(round((1.0 - width) / BD3LMS_STEP)) + 1):
            low = round(i * BD3LMS_STEP, 6)
            windows.append((max(low, floor), round(low + width, 6)))
    return list(dict.fromkeys(windows))


def resample_masks(masked: torch.Tensor, blocks: torch.Tensor, t_token: torch.Tensor, block_size: int,
                   low: float, high: float, generator: torch.Generator | None = None, max_rounds: int = 1000):
    """BD3-LM's `resample`: every block whose fraction of masked tokens lies outside [low, high]
    has its masks drawn again at the same t, until every block is inside (after `max_rounds`
    rounds whatever is left stays). Cuts the loss's variance without moving t.

    masked, blocks, t_token: (B, L) with L a multiple of block_size (padding blocks are -1).
    """
    lo, hi = enforced_bounds(low, high)
    if lo is None and hi is None:
        return masked
    rows = masked.shape[0]
    real_block = (blocks >= 0).view(rows, -1, block_size)[..., 0]
    for _ in range(max_rounds):
        fraction = masked.view(rows, -1, block_size).float().mean(-1)
        outside = torch.zeros_like(real_block)
        if lo is not None:
            outside |= fraction < lo
        if hi is not None:
            outside |= fraction > hi
        outside &= real_block
        if not bool(outside.any()):
            break
        fresh = (torch.rand(masked.shape, generator=generator, device=masked.device) < t_token) & (blocks >= 0)
        masked = torch.where(outside.repeat_interleave(block_size, dim=1), fresh, masked)
    return masked
