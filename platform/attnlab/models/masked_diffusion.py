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


def mask_blocks(tokens: torch.Tensor, blocks: torch.Tensor, t: torch.Tensor, mask_id: int,
                generator: torch.Generator | None = None):
    """Mask each token of target block b (1-based; -1 = padding) with probability t[:, b - 1].

    Returns the noisy tokens, the masked positions and each token's t, all (B, L).
    """
    t_token = t.gather(1, (blocks - 1).clamp(min=0))
    draw = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    masked = (draw < t_token) & (blocks >= 0)
    return torch.where(masked, mask_id, tokens), masked, t_token
