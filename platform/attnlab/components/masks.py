"""Boolean attention masks (True = may attend), shaped to broadcast against (B, H, Lq, Lk).

Every mask keeps at least one visible key per query row (a pad query sees itself), so no
backend ever softmaxes an all-masked row into NaN.
"""
from __future__ import annotations

import torch


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Lq, Lk): query i, standing at absolute index n_keys - n_queries + i, sees keys up to it."""
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None] + offset
    k = torch.arange(n_keys, device=device)[None, :]
    return k <= q


def self_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Lq, Lk): True where the key is the query itself (queries are the last Lq keys)."""
    offset = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None] + offset
    return torch.arange(n_keys, device=device)[None, :] == q


def padding_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, 1, Lk) from a (B, Lk) bool tensor of real (non-pad) keys."""
    return key_valid[:, None, None, :]


def lengths_to_valid(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, L) bool: True on the first `lengths[b]` positions."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def causal_padding_mask(key_valid: torch.Tensor, n_queries: int) -> torch.Tensor:
    """(B, 1, Lq, Lk): causal over all keys, pads hidden, every query sees at least itself."""
    n_keys = key_valid.shape[1]
    device = key_valid.device
    visible = padding_mask(key_valid) | self_mask(n_queries, n_keys, device)
    return causal_mask(n_queries, n_keys, device) & visible


def prefix_mask(prefix_lengths: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L): prefix-LM; the first prefix_lengths[b] tokens see each other, the rest is causal."""
    n = key_valid.shape[1]
    in_prefix = lengths_to_valid(prefix_lengths, n)
    both_in_prefix = in_prefix[:, None, :, None] & in_prefix[:, None, None, :]
    return causal_padding_mask(key_valid, n) | (both_in_prefix & padding_mask(key_valid))


def block_diffusion_visible(q_block, k_block, q_noisy, k_noisy, clean_order=None):
    """The BD3-LM attention rule on block indices (-1 = padding), elementwise and broadcastable.

    A noisy token sees its own noisy block (M_BD) and clean tokens of strictly earlier blocks
    (M_OBC); a clean token sees clean tokens of its own and earlier blocks (M_BC); no clean
    token ever sees a noisy one. `clean_order` (key index <= query index), for a causal context:
    clean tokens then see only clean tokens up to themselves, as an autoregressive model saw
    them (Fast-dLLM v2's conversion). Shared by the dense mask and the FlexAttention mask_mod.
    """
    real = (q_block >= 0) & (k_block >= 0)
    same, earlier = q_block == k_block, k_block < q_block
    clean_clean = earlier | same if clean_order is None else (earlier | same) & clean_order
    visible = (q_noisy & k_noisy & same) | (q_noisy & ~k_noisy & earlier) | (~q_noisy & ~k_noisy & clean_clean)
    return real & visible


def diffusion_layout(noisy_blocks: torch.Tensor, clean_blocks: torch.Tensor):
    """Block index and noisy flag of every token of `x_t ⊕ x_0`, each (B, Ln+Lc)."""
    blocks = torch.cat((noisy_blocks, clean_blocks), dim=1)
    noisy = torch.zeros_like(blocks, dtype=torch.bool)
    noisy[:, : noisy_blocks.shape[1]] = True
    return blocks, noisy


def block_diffusion_mask(noisy_blocks: torch.Tensor, clean_blocks: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """(B, 1, Ln+Lc, Ln+Lc) dense mask of the vectorized input `x_t ⊕ x_0`.

    `noisy_blocks` (B, Ln) and `clean_blocks` (B, Lc) give each token's block index (-1 for
    batch padding, which sees only itself); `causal`: a causal clean context.
    """
    blocks, noisy = diffusion_layout(noisy_blocks, clean_blocks)
    n = blocks.shape[1]
    order = causal_mask(n, n, blocks.device) if causal else None
    visible = block_diffusion_visible(blocks[:, :, None], blocks[:, None, :], noisy[:, :, None], noisy[:, None, :], order)
    return (visible | torch.eye(n, dtype=torch.bool, device=blocks.device))[:, None]


_compiled_create_block_mask = None


def _create_block_mask_for(device: torch.device):
    """`create_block_mask`, compiled on CUDA (eagerly it evaluates mask_mod over the whole L×L
    grid, too slow per batch); eager on CPU, where it is only a reference for tests."""
    global _compiled_create_block_mask
    from torch.nn.attention.flex_attention import create_block_mask

    if device.type != "cuda":
        return create_block_mask
    if _compiled_create_block_mask is None:
        _compiled_create_block_mask = torch.compile(create_block_mask)
    return _compiled_create_block_mask


def block_diffusion_flex_mask(noisy_blocks: torch.Tensor, clean_blocks: torch.Tensor, causal: bool = False):
    """The same mask as a FlexAttention BlockMask (sparse: fully hidden tiles are skipped).

    Built per batch, not cached per shape: the layout follows each batch's lengths and padding,
    so a mask cached by shape would be wrong; compiling the builder keeps that cheap on CUDA.
    """
    blocks, noisy = diffusion_layout(noisy_blocks, clean_blocks)

    def mask_mod(b, h, q, k):
        visible = block_diffusion_visible(blocks[b, q], blocks[b, k], noisy[b, q], noisy[b, k], k <= q if causal else None)
        return visible | (q == k)

    n = blocks.shape[1]
    return _create_block_mask_for(blocks.device)(mask_mod, blocks.shape[0], None, n, n, device=blocks.device)
