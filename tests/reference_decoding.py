"""Uncached decoders for the tests: every step recomputes the whole sequence through the model's
full-sequence path (what training runs), the reference the cached generators must match. The
passes they build on (a left-padded decoder-only batch in one call, block diffusion's denoising
predictors) are here too: only tests decode that way.

Independent of attnlab.generation on purpose: padding, token choice (greedy, temperature, top-k,
top-p), block denoising and eos stripping are written again here as plain loops, so a fault in a
production helper makes the cached output differ from this one instead of from itself. Only the
order of the random draws is shared (one batched multinomial per choice, then one batched uniform
for random unmasking): sampled outputs can then be compared token for token. The exception is
`denoise_block`, which drives the sampler's own `reveal` on one block (the tests of `reveal`).
"""
from __future__ import annotations

import math

import torch

from attnlab.generation import SamplingConfig
from attnlab.generation.block_diffusion import reveal


def _left_pad(prompts, pad_id, device):
    """Rows padded on the left to the longest prompt, and which positions are real tokens."""
    width = max(len(p) for p in prompts)
    tokens = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    valid = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    return (torch.tensor(tokens, dtype=torch.long, device=device),
            torch.tensor(valid, dtype=torch.bool, device=device))


def _budgets(max_new_tokens, rows: int) -> list[int]:
    if torch.is_tensor(max_new_tokens):
        values = max_new_tokens.tolist()
        return values if isinstance(values, list) else [values] * rows
    return [int(max_new_tokens)] * rows


def _choose(logits, sampling: SamplingConfig, generator):
    """(B, V) logits -> (B,) tokens: the most likely, or a draw after temperature, top-k and top-p
    (a token is kept while the tokens ranked above it hold less than top_p of the mass)."""
    if sampling.temperature == 0.0:
        return torch.tensor([max(range(len(row)), key=lambda v: (row[v], -v)) for row in logits.tolist()],
                            dtype=torch.long, device=logits.device)
    scaled = logits.float() / sampling.temperature
    keep = torch.ones_like(scaled, dtype=torch.bool)
    for r in range(scaled.shape[0]):
        ranked = sorted(range(scaled.shape[1]), key=lambda v: -scaled[r, v].item())
        if sampling.top_k:
            for v in ranked[sampling.top_k:]:
                if scaled[r, v] < scaled[r, ranked[sampling.top_k - 1]]:
                    keep[r, v] = False
        if sampling.top_p < 1.0:  # the mass of what top-k kept
            probs = scaled[r].masked_fill(~keep[r], float("-inf")).softmax(-1).tolist()
            above = 0.0
            for v in ranked:
                if above >= sampling.top_p:
                    keep[r, v] = False
                above += probs[v]
    probs = scaled.masked_fill(~keep, float("-inf")).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _strip(rows, eos_id, budgets) -> list[list[int]]:
    """Each row cut at its budget, then before its first eos."""
    out = []
    for row, budget in zip(rows, budgets):
        kept = []
        for token in row[:budget]:
            if token == eos_id:
                break
            kept.append(token)
        out.append(kept)
    return out


def left_padded_logits(model, tokens, valid):
    """A DecoderOnlyModel's logits (B, L, V) of left-padded rows in one call: each real token at its
    position among its row's real tokens, seeing the real tokens up to itself (a pad sees itself)."""
    length = tokens.shape[1]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    earlier = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
    itself = torch.eye(length, dtype=torch.bool, device=tokens.device)
    mask = (earlier & (valid[:, None, :] | itself))[:, None]  # (B, 1, L, L)
    hidden, _ = model.stack(tokens, positions, mask=mask, key_positions=positions)
    return model.stack.embedding.logits(hidden)


def denoise(model, noisy, noisy_blocks, noisy_positions, clean, clean_blocks, clean_positions=None):
    """A BlockDiffusionModel's hidden states (B, Ln, d) that predict the noisy tokens, given the
    clean sequence, through its training path: the joint pass of `x_t ⊕ x_0`, then `predictors`.
    Block indices are -1 on padding; clean positions default to 0..Lc-1 (right padding)."""
    hidden, _ = model.joint_pass(noisy, noisy_blocks, noisy_positions, clean, clean_blocks, clean_positions)
    return model.predictors(hidden, noisy_blocks, noisy_positions, clean_blocks, clean_positions)


def denoise_block(block, logits_of, steps: int, mask_id: int, sampling: SamplingConfig, unmasking: str,
                  generator: torch.Generator | None = None, threshold: float = 0.9) -> torch.Tensor:
    """Turn a (B, n) block into tokens, calling `logits_of(block)` and the sampler's `reveal` until
    nothing is masked: one block on its own, as `sample_blocks` denoises each row's blocks."""
    calls = 0
    while bool((block == mask_id).any()):
        block = reveal(block, logits_of(block), calls, steps, mask_id, sampling, unmasking, generator, threshold)
        calls += 1
    return block


@torch.no_grad()
def generate_uncached(model, prompts, *, max_new_tokens, eos_id, pad_id, sampling=SamplingConfig(), generator=None):
    """Decoder-only: (token lists, (B, steps, V) logits)."""
    device = next(model.parameters()).device
    tokens, valid = _left_pad(prompts, pad_id, device)
    budgets = _budgets(max_new_tokens, len(prompts))
    finished = [b <= 0 for b in budgets]
    chosen, all_logits = [[] for _ in prompts], []
    for step in range(max(budgets)):
        logits = left_padded_logits(model, tokens, valid)[:, -1]
        all_logits.append(logits)
        token = _choose(logits, sampling, generator).tolist()
        token = [pad_id if done else t for t, done in zip(token, finished)]
        for row, t in zip(chosen, token):
            row.append(t)
        tokens = torch.cat((tokens, torch.tensor(token, device=device)[:, None]), dim=1)
        valid = torch.cat((valid, torch.tensor([not done for done in finished], device=device)[:, None]), dim=1)
        finished = [done or t == eos_id or step + 1 >= b for done, t, b in zip(finished, token, budgets)]
        if all(finished):
            break
    return _strip(chosen, eos_id, budgets), torch.stack(all_logits, dim=1)


@torch.no_grad()
def translate_uncached(model, encoded, *, max_lengths, bos_id, eos_id, pad_id, sampling=SamplingConfig(), generator=None):
    """Encoder-decoder: re-decodes the whole prefix against the encoder memory each step."""
    n = encoded.memory.shape[0]
    budgets = _budgets(max_lengths, n)
    tokens = torch.full((n, 1), bos_id, dtype=torch.long, device=encoded.memory.device)
    finished = [False] * n
    all_logits = []
    for t in range(max(budgets)):
        hidden, _ = model.decode(tokens, encoded)
        logits = model.logits(hidden[:, -1])
        all_logits.append(logits)
        token = [pad_id if done else c for c, done in zip(_choose(logits, sampling, generator).tolist(), finished)]
        tokens = torch.cat((tokens, torch.tensor(token, device=tokens.device)[:, None]), dim=1)
        finished = [done or c == eos_id or t + 1 >= b for done, c, b in zip(finished, token, budgets)]
        if all(finished):
            break
    return _strip(tokens[:, 1:].tolist(), eos_id, budgets), torch.stack(all_logits, dim=1)


def _proposals(logits, sampling: SamplingConfig, unmasking: str, generator):
    """(B, n, V) logits -> per position a proposed token and its score: its log-probability, or a
    uniform draw (random unmasking). Greedy confidence takes the most likely token."""
    rows, n, vocab = logits.shape
    log_probs = logits.float().log_softmax(-1)
    if sampling.temperature == 0.0 and unmasking != "random":
        tokens = [[max(range(vocab), key=lambda v: (log_probs[r, i, v].item(), -v)) for i in range(n)]
                  for r in range(rows)]
    else:
        tokens = _choose(logits.reshape(rows * n, vocab), sampling, generator).view(rows, n).tolist()
    if unmasking == "random":
        return tokens, torch.rand(rows, n, generator=generator, device=logits.device).tolist()
    return tokens, [[log_probs[r, i, tokens[r][i]].item() for i in range(n)] for r in range(rows)]


def _denoise(block_size, rows, logits_of, steps, mask_id, sampling, unmasking, threshold, generator, device):
    """An all-mask block denoised call by call. Confidence / random: `steps` calls, the first
    (block_size % steps) of them revealing one token more than the rest, each the best-scored
    masked positions. Threshold: every call reveals the masked positions with probability >=
    threshold (all of them at 0, none at 1) and at least the best one, until the row is clean
    (a clean row stays as it is)."""
    block = [[mask_id] * block_size for _ in range(rows)]

    def call():
        x = torch.tensor(block, dtype=torch.long, device=device)
        return _proposals(logits_of(x), sampling, unmasking, generator)

    if unmasking == "first_hitting":  # one uniformly chosen masked position a call, its token drawn alone
        for _ in range(block_size):
            logits = logits_of(torch.tensor(block, dtype=torch.long, device=device))
            draws = torch.rand(rows, block_size, generator=generator, device=device).tolist()
            chosen = [max((i for i, t in enumerate(row) if t == mask_id), key=lambda i: draws[r][i])
                      for r, row in enumerate(block)]
            tokens = _choose(logits[torch.arange(rows), torch.tensor(chosen)], sampling, generator).tolist()
            for row, i, token in zip(block, chosen, tokens):
                row[i] = token
        return block
    if unmasking == "threshold":
        while any(mask_id in row for row in block):
            tokens, scores = call()
            for r, row in enumerate(block):
                masked = [i for i, t in enumerate(row) if t == mask_id]
                if not masked:
                    continue
                reveal = {max(masked, key=lambda i: (scores[r][i], -i))}
                if threshold <= 0:
                    reveal = set(masked)
                elif threshold < 1:
                    reveal |= {i for i in masked if scores[r][i] >= math.log(threshold)}
                for i in reveal:
                    row[i] = tokens[r][i]
        return block
    counts = [block_size // steps] * steps
    for s in range(block_size % steps):
        counts[s] += 1
    for count in counts:
        tokens, scores = call()
        for r, row in enumerate(block):
            masked = sorted((i for i, t in enumerate(row) if t == mask_id), key=lambda i: (-scores[r][i], i))
            for i in masked[:count]:
                row[i] = tokens[r][i]
    return block


@torch.no_grad()
def sample_blocks_uncached(model, prompts, *, max_new_tokens, block_size, steps, eos_id, pad_id,
                           sampling=SamplingConfig(), unmasking="confidence", threshold=0.9, generator=None):
    """Block diffusion: each denoising step runs the training path (`denoise`) over every clean block."""
    device = next(model.parameters()).device
    mask_id = model.mask_id
    clean, valid = _left_pad(prompts, pad_id, device)
    clean_blocks = torch.where(valid, 0, -1)  # the prompt is block 0; padding belongs to no block
    clean_positions = torch.tensor([[max(sum(row[: i + 1]) - 1, 0) for i in range(len(row))]
                                    for row in valid.long().tolist()], dtype=torch.long, device=device)
    next_position = [sum(row) for row in valid.long().tolist()]
    rows = len(prompts)
    budgets = _budgets(max_new_tokens, rows)
    done = [b <= 0 for b in budgets]
    generated = [[] for _ in prompts]
    for b in range(-(-max(budgets) // block_size)):
        positions = torch.tensor([[p + i for i in range(block_size)] for p in next_position], device=device)
        noisy_blocks = torch.full((rows, block_size), b + 1, dtype=torch.long, device=device)

        def logits_of(x):
            return model.logits(denoise(model, x, noisy_blocks, positions, clean, clean_blocks, clean_positions))

        block = _denoise(block_size, rows, logits_of, steps, mask_id, sampling, unmasking, threshold, generator, device)
        clean = torch.cat((clean, torch.tensor(block, dtype=torch.long, device=device)), dim=1)
        clean_blocks = torch.cat((clean_blocks, noisy_blocks), dim=1)
        clean_positions = torch.cat((clean_positions, positions), dim=1)
        next_position = [p + block_size for p in next_position]
        for r, row in enumerate(block):
            generated[r].extend(row)
        done = [d or eos_id in row or (b + 1) * block_size >= budget for d, row, budget in zip(done, block, budgets)]
        if all(done):
            break
    return _strip(generated, eos_id, budgets)


def ar_view_greedy_uncached(model, prompts, *, max_new_tokens, eos_id):
    """A shifted, causal block-diffusion model's AR view decoded greedily, one row at a time with no
    cache: the whole sequence through the stack under a causal mask at every step, the last clean
    hidden state's logits (mask token excluded) choosing the next token."""
    out = []
    for prompt, budget in zip(prompts, _budgets(max_new_tokens, len(prompts))):
        row = list(prompt)
        for _ in range(budget):
            tokens = torch.tensor([row], dtype=torch.long)
            hidden, _ = model.stack(tokens, torch.arange(len(row)), is_causal=True)
            token = int(_choose(model.logits(hidden[:, -1]), SamplingConfig(), None)[0])
            row.append(token)
            if token == eos_id:
                break
        out.append(row[len(prompt):])
    return [row[: row.index(eos_id)] if eos_id in row else row for row in out]
