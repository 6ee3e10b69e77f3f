"""The one batch schema every data module yields, so any family trains on any data set.

A batch is a dict:
  source          LongTensor (B, S): source pieces, right-padded with pad; S may be 0 (plain LM data)
  source_lengths  LongTensor (B,)
  target          LongTensor (B, T): target pieces, right-padded with pad
  target_lengths  LongTensor (B,)
  source_text     list[str]: the original source strings (for printing examples)
  target_text     list[str]: the original reference strings (for BLEU / chrF / exact match)

Evaluation batches (val / test / predict) also carry:
  index           LongTensor (B,): each example's position in its split
  counted         BoolTensor (B,): False for the repeats a distributed sampler adds so every rank
                  gets as many batches; metrics and saved examples skip them

Pieces carry no bos / eos / sep: each family frames them its own way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the tokenizer's special pieces, linked from the data module into the model."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3
    sep: int = 4
    mask: int = 5


@dataclass(frozen=True)
class Example:
    source: list[int]
    target: list[int]
    source_text: str
    target_text: str


def pad_sequences(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad integer sequences into a (B, max_len) tensor and return it with the lengths."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    out = torch.full((len(seqs), int(lengths.max()) if len(seqs) else 0), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out, lengths


def collate(examples: list[Example], pad_id: int) -> dict:
    source, source_lengths = pad_sequences([e.source for e in examples], pad_id)
    target, target_lengths = pad_sequences([e.target for e in examples], pad_id)
    return {
        "source": source,
        "source_lengths": source_lengths,
        "target": target,
        "target_lengths": target_lengths,
        "source_text": [e.source_text for e in examples],
        "target_text": [e.target_text for e in examples],
    }


class IndexedExamples:
    """A split for evaluation, longest sources first: item i is (index, i < n, example), the
    example in place i mod n of that order and its index in the split. A sampler may ask for
    i >= n to pad a rank's share with a repeat that is marked as not counted.

    Sorted by source then target length (ties in split order), so a batch holds examples of
    similar length and generation (beam search above all) does not pay for padding; longest
    first, so a batch too big for memory fails at once. Corpus metrics do not depend on the
    order, and records and predictions are put back in split order by index.
    """

    def __init__(self, examples: list[Example]):
        self.examples = examples
        self.order = sorted(range(len(examples)), key=lambda i: (-len(examples[i].source), -len(examples[i].target), i))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> tuple[int, bool, Example]:
        index = self.order[i % len(self.examples)]
        return index, i < len(self.examples), self.examples[index]


def collate_indexed(items: list[tuple[int, bool, Example]], pad_id: int) -> dict:
    batch = collate([example for _, _, example in items], pad_id)
    batch["index"] = torch.tensor([i for i, _, _ in items], dtype=torch.long)
    batch["counted"] = torch.tensor([counted for _, counted, _ in items], dtype=torch.bool)
    return batch
