"""Turn the shared batch schema into each family's token layout, vectorised over the batch."""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100  # label value that carries no loss


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b, j]] with index clamped into range (callers mask what is out of range)."""
    index = index.expand(values.shape[0], -1)
    if values.shape[1] == 0:
        return torch.zeros_like(index)
    return values.gather(1, index.clamp(0, values.shape[1] - 1))


def is_plain_lm(batch: dict) -> bool:
    """Plain language-modelling data (no source): the one test every layout and generator uses."""
    return batch["source"].shape[1] == 0


def frame_prefix_target(batch: dict, bos: int, sep: int, eos: int, pad: int):
    """`[bos] source [sep] target [eos]`, right-padded; labels predict the target and eos only.

    Plain LM data (no source columns) becomes `[bos] target` with every target token a label.
    Returns tokens (B, L) and next-token labels (B, L) with IGNORE elsewhere.
    """
    source, target = batch["source"], batch["target"]
    ls, lt = batch["source_lengths"][:, None], batch["target_lengths"][:, None]
    lm_mode = is_plain_lm(batch)
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
    """What generation continues, unpadded: `[bos] source [sep]` per example, or for plain LM
    data `[bos] target` (the text to continue, as the model read text in training)."""
    if is_plain_lm(batch):
        return [[bos] + row[:n] for row, n in zip(batch["target"].tolist(), batch["target_lengths"].tolist())]
    return [[bos] + row[:n] + [sep] for row, n in zip(batch["source"].tolist(), batch["source_lengths"].tolist())]


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


@dataclass
class BlockFrame:
    """A batch laid out for block diffusion.

    clean          (B, Wc) `[bos] source [sep] target [eos] eos…`, right-padded with pad; the
                   target region is filled with eos up to a multiple of the block size
    clean_blocks   (B, Wc) 0 on the prefix, 1, 2, … on target blocks, -1 on batch padding
    target_start   (B,) where the target region starts (the prefix length)
    region         (B,) target region length (a block multiple)
    n_targets      (B,) real target tokens (+ eos in conditional mode): the NLL denominator
    """

    clean: torch.Tensor
    clean_blocks: torch.Tensor
    target_start: torch.Tensor
    region: torch.Tensor
    n_targets: torch.Tensor
    block_size: int
    pad: int

    @property
    def read_width(self) -> int:
        """The clean columns the joint pass needs. A noisy token sees the clean tokens of strictly
        earlier blocks, so with one block per row it reads the prefix alone: masked diffusion over
        the whole target (MDLM) has no clean half to pay for. With several blocks every clean
        column is kept, though no noisy token reads a row's last block either: dropping it saves
        1 / blocks of the clean half, and changes the backward's sums in their last bits, so runs
        measured before would no longer reproduce."""
        if int(self.region.max()) <= self.block_size:
            return int(self.target_start.max())
        return self.clean.shape[1]

    def target_view(self):
        """Tokens, block indices (-1 = padding) and positions of the target regions, (B, Wn) each."""
        i = torch.arange(int(self.region.max()), device=self.clean.device)[None, :]
        inside = i < self.region[:, None]
        positions = torch.where(inside, self.target_start[:, None] + i, 0)
        tokens = torch.where(inside, self.clean.gather(1, positions), self.pad)
        blocks = torch.where(inside, i // self.block_size + 1, -1)
        return tokens, blocks, positions


def frame_blocks(batch: dict, bos: int, sep: int, eos: int, pad: int, block_size: int) -> BlockFrame:
    """Conditional mode: prefix `[bos] source [sep]`, target `target [eos]` in blocks.

    Plain LM data (no source) becomes prefix `[bos]` and target `target` in blocks. Either way
    the last block is filled with eos: sampling generates whole blocks, so the model learns
    that what follows eos is eos. Batch padding is never a target.
    """
    source, target = batch["source"], batch["target"]
    ls, lt = batch["source_lengths"][:, None], batch["target_lengths"][:, None]
    lm_mode = is_plain_lm(batch)
    start = torch.ones_like(ls) if lm_mode else ls + 2
    n_targets = lt + (0 if lm_mode else 1)
    region = (n_targets + block_size - 1) // block_size * block_size
    j = torch.arange(int((start + region).max()), device=target.device)[None, :]
    tokens = torch.full_like(j.expand(len(target), -1), pad)
    tokens = torch.where(j == 0, bos, tokens)
    if not lm_mode:
        tokens = torch.where((j >= 1) & (j <= ls), _take(source, j - 1), tokens)
        tokens = torch.where(j == ls + 1, sep, tokens)
    in_target = (j >= start) & (j < start + lt)
    tokens = torch.where(in_target, _take(target, j - start), tokens)
    tokens = torch.where((j >= start + lt) & (j < start + region), eos, tokens)
    blocks = torch.where(j < start, 0, torch.where(j < start + region, (j - start) // block_size + 1, -1))
    return BlockFrame(tokens, blocks, start[:, 0], region[:, 0], n_targets[:, 0], block_size, pad)
