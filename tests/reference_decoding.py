"""Uncached decoders for the tests: every step recomputes the whole sequence through the model's
full-sequence path (what training runs), the reference the cached generators must match."""
from __future__ import annotations

import torch

from attnlab.generation import SamplingConfig, choose_next
from attnlab.generation.block_diffusion import denoise_block
from attnlab.generation.loop import left_pad, row_budgets, strip_after_eos


@torch.no_grad()
def generate_uncached(model, prompts, *, max_new_tokens, eos_id, pad_id, sampling=SamplingConfig(), generator=None):
    """Decoder-only: (token lists, (B, steps, V) logits)."""
    device = next(model.parameters()).device
    tokens, valid = left_pad(prompts, pad_id, device)
    budgets = row_budgets(max_new_tokens, len(prompts), device)
    finished = budgets <= 0
    chosen, all_logits = [], []
    for step in range(int(budgets.max())):
        logits = model(tokens, valid)[:, -1]
        all_logits.append(logits)
        token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        chosen.append(token)
        tokens = torch.cat((tokens, token[:, None]), dim=1)
        valid = torch.cat((valid, ~finished[:, None]), dim=1)
        finished = finished | (token == eos_id) | (step + 1 >= budgets)
        if bool(finished.all()):
            break
    return strip_after_eos(torch.stack(chosen, dim=1), eos_id, budgets), torch.stack(all_logits, dim=1)


@torch.no_grad()
def translate_uncached(model, encoded, *, max_lengths, bos_id, eos_id, pad_id, sampling=SamplingConfig(), generator=None):
    """Encoder-decoder: re-decodes the whole prefix against the encoder memory each step."""
    n = encoded.memory.shape[0]
    tokens = torch.full((n, 1), bos_id, dtype=torch.long, device=encoded.memory.device)
    finished = torch.zeros(n, dtype=torch.bool, device=tokens.device)
    all_logits = []
    for t in range(int(max_lengths.max())):
        hidden, _ = model.decode(tokens, encoded)
        logits = model.logits(hidden[:, -1])
        all_logits.append(logits)
        token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        tokens = torch.cat((tokens, token[:, None]), dim=1)
        finished = finished | (token == eos_id) | (t + 1 >= max_lengths)
        if bool(finished.all()):
            break
    return strip_after_eos(tokens[:, 1:], eos_id, max_lengths), torch.stack(all_logits, dim=1)


@torch.no_grad()
def sample_blocks_uncached(model, prompts, *, max_new_tokens, block_size, steps, eos_id, pad_id,
                           sampling=SamplingConfig(), unmasking="confidence", threshold=0.9, generator=None):
    """Block diffusion: each denoising step runs the training path (`denoise`) over every clean block."""
    device = next(model.parameters()).device
    mask_id = model.mask_id
    clean, valid = left_pad(prompts, pad_id, device)
    clean_blocks = torch.where(valid, 0, -1)
    clean_positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    next_position = valid.long().sum(1)
    offsets = torch.arange(block_size, device=device)
    rows = len(prompts)
    budgets = row_budgets(max_new_tokens, rows, device)
    done = budgets <= 0
    blocks = []
    for b in range((int(budgets.max()) + block_size - 1) // block_size):
        positions = next_position[:, None] + offsets
        noisy_blocks = torch.full((rows, block_size), b + 1, dtype=torch.long, device=device)

        def logits_of(x):
            return model.logits(model.denoise(x, noisy_blocks, positions, clean, clean_blocks, clean_positions))

        empty = torch.full((rows, block_size), mask_id, dtype=torch.long, device=device)
        block = denoise_block(empty, logits_of, steps, mask_id, sampling, unmasking, generator, threshold)
        clean = torch.cat((clean, block), dim=1)
        clean_blocks = torch.cat((clean_blocks, noisy_blocks), dim=1)
        clean_positions = torch.cat((clean_positions, positions), dim=1)
        next_position = next_position + block_size
        blocks.append(block)
        done = done | (block == eos_id).any(dim=1) | ((b + 1) * block_size >= budgets)
        if bool(done.all()):
            break
    return strip_after_eos(torch.cat(blocks, dim=1), eos_id, budgets)
