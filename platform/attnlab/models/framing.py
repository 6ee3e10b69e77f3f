"""Turn the shared batch schema into each family's token layout, vectorised over the batch."""
from __future__ import annotations

import torch

IGNORE = -100  # label value that carries no loss


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b, j]] with index clamped into range (callers mask what is out of range)."""
    index = index.expand(values.shape[0], -1)
    if values.shape[1] == 0:
        return torch.zeros_like(index)
    return values.gather(1, index.clamp(0, values.shape[1] - 1))


def frame_prefix_target(batch: dict, bos: int, sep: int, eos: int, pad: int):
    """`[bos] source [sep] target [eos]`, right-padded; labels predict the target and eos only.

    Plain LM data (no source columns) becomes `[bos] target` with every target token a label.
    Returns tokens (B, L) and next-token labels (B, L) with IGNORE elsewhere.
    """
    source, target = batch["source"], batch["target"]
    ls, lt = batch["source_lengths"][:, None], batch["target_lengths"][:, None]
    lm_mode = source.shape[1] == 0
    tgt_start = 1 if lm_mode else ls + 2
    length = tgt_start + lt + (0 if lm_mode else 1)
    j = torch.arange(int(length.max()), device=target.device)[None, :]
    tokens = torch.full_like(j.expand(len(target), -1), pad)
    tokens = torch.where(j == 0, bos, tokens)
    tokens = torch.where((j >= 1) & (j <= ls), _take(source, j - 1), tokens)
    in_target = (j >= tgt_start) & (j < tgt_start + lt)
    tokens = torch.where(in_target, _take(target, j - tgt_start), tokens)
    if not lm_mode:
        tokens = torch.where(j == ls + 1, sep, tokens)
        tokens = torch.where(j == ls + 2 + lt, eos, tokens)
    labels = torch.full_like(tokens, IGNORE)
    predicts = (j >= tgt_start - 1) & (j < length - 1)
    labels[:, :-1] = torch.where(predicts[:, :-1], tokens[:, 1:], IGNORE)
    return tokens, labels


def prompts_of(batch: dict, bos: int, sep: int) -> list[list[int]]:
    """`[bos] source [sep]` per example (just `[bos]` for plain LM data), unpadded."""
    prompts = []
    for row, n in zip(batch["source"].tolist(), batch["source_lengths"].tolist()):
        prompts.append([bos] + row[:n] + [sep] if batch["source"].shape[1] else [bos])
    return prompts


def frame_source_target(batch: dict, bos: int, eos: int, pad: int):
    """Encoder input `source [eos]`, decoder input `[bos] target`, labels `target [eos]`.

    Returns source tokens (B, S+1), their validity (B, S+1), decoder input (B, T+1) and
    labels (B, T+1) with IGNORE on padding.
    """
    source, target = batch["source"], batch["target"]
    ls, lt = batch["source_lengths"][:, None], batch["target_lengths"][:, None]
    js = torch.arange(source.shape[1] + 1, device=source.device)[None, :]
    src = torch.where(js < ls, _take(source, js), torch.where(js == ls, eos, pad))
    jt = torch.arange(target.shape[1] + 1, device=target.device)[None, :]
    decoder_in = torch.where(jt == 0, bos, torch.where(jt <= lt, _take(target, jt - 1), pad))
    labels = torch.where(jt < lt, _take(target, jt), torch.where(jt == lt, eos, IGNORE))
    return src, js <= ls, decoder_in, labels
