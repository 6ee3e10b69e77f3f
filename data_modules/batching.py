"""Batches built by a token budget with length bucketing, as the paper trains (~25k tokens a side).

Examples of similar length share a batch, so little is spent on padding; the order of the
batches is shuffled every epoch. Under DDP each rank takes every world_size-th batch.
Evaluation splits are shared between ranks so that every example is counted exactly once.
"""
from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


def distributed_world() -> tuple[int, int]:
    """(world size, rank) of the running process group, (1, 0) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class EpochRandomSampler(DistributedSampler):
    """A shuffle fixed by (seed, epoch) alone, not by the global RNG's state, so a resumed run
    draws the interrupted epoch's order again; `resume_at` skips the examples already trained.

    Under DDP rank r of W takes positions r, r + W, ... of that order (the order and the deal of
    Lightning's own DistributedSampler), after dropping the last len % W, so the ranks' shares are
    disjoint, equal, and together the epoch. A DistributedSampler, so Lightning keeps it instead
    of its own, which pads a share with repeats.
    """

    def __init__(self, data_source, seed: int = 0):
        world, rank = distributed_world()
        super().__init__(data_source, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.data_source = data_source
        self._resume: tuple[int, int] | None = None

    def resume_at(self, epoch: int, skip: int) -> None:
        """The next pass over `epoch` starts after this rank's first `skip` examples."""
        self.epoch, self._resume = epoch, (epoch, skip)

    def _share(self) -> torch.Tensor:
        """This rank's indices, kept as a tensor (8 bytes an example, not a Python int's 36)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.data_source), generator=generator)
        return order[: self.total_size][self.rank :: self.num_replicas]

    def __iter__(self):
        resume, self._resume = self._resume, None
        skip = resume[1] if resume is not None and resume[0] == self.epoch else 0
        for block in self._share()[skip:].split(4096):
            yield from block.tolist()


class TokenBudgetBatchSampler:
    def __init__(self, lengths: list[int], max_tokens: int, seed: int = 0, shuffle: bool = True):
        """`lengths[i]` is the padded size example i adds to a batch (source + target tokens)."""
        self.lengths, self.max_tokens, self.seed, self.shuffle = lengths, max_tokens, seed, shuffle
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] | None = None
        self._resume: tuple[int, int] | None = None

    def resume_at(self, epoch: int, skip: int) -> None:
        """The next pass over `epoch` starts after its first `skip` batches (of this rank)."""
        self.epoch, self._resume = epoch, (epoch, skip)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning each epoch, so the batch order changes reproducibly."""
        self.epoch = epoch

    def _all_batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        # Sort by length; random tie-breaks vary the batch members among equal lengths per epoch.
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], rng.random()))
        batches, current, longest = [], [], 0
        for i in order:
            longest_with_i = max(longest, self.lengths[i])
            if current and longest_with_i * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, longest_with_i = [], self.lengths[i]
            current.append(i)
            longest = longest_with_i
        if current:
            batches.append(current)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def _rank_batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch, computed once per epoch (both len() and iter() need them)."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        batches = self._all_batches()
        world, rank = distributed_world()
        if world > 1:
            batches = batches[: len(batches) - len(batches) % world][rank::world]  # equal counts per rank
        self._cached = (self.epoch, batches)
        return batches

    def __iter__(self):
        resume, self._resume = self._resume, None
        skip = resume[1] if resume is not None and resume[0] == self.epoch else 0
        return iter(self._rank_batches()[skip:])

    def __len__(self) -> int:
        return len(self._rank_batches())


class EvenShareSampler(DistributedSampler):
    """Rank r of W evaluates examples r, r + W, r + 2W, ...; where W does not divide the split,
    the ranks that run out first get index >= n, which `IndexedExamples` turns into a repeat
    marked as not counted. Every rank runs as many batches (collectives stay in step: FSDP gathers
    per step) and the metrics count each example once. A DistributedSampler, so Lightning keeps
    it instead of its own, which pads by repeating examples that are then counted twice."""

    def __init__(self, dataset, num_replicas: int, rank: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self):
        return iter(range(self.rank, self.total_size, self.num_replicas))
