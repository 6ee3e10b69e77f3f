"""The shared LightningDataModule: (source, target) text pairs in, schema batches out.

A subclass only says where its pairs come from (`_load_splits`) and what identifies them
(`_fingerprint`); the base trains or loads the cached tokenizer, tokenizes each split once and
serves the loaders. `vocab_size` works right after construction because the model is sized
from it through a config link, before the Trainer calls any hook.
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader

from data_modules.errors import ConfigError, DataError
from data_modules.batch import Example, IndexedExamples, SpecialIds, collate, collate_indexed
from data_modules.batching import EpochRandomSampler, EvenShareSampler, TokenBudgetBatchSampler, distributed_world
from data_modules.tokenizer import Tokenizer, check_tokenizer_args, default_cache_dir, train_tokenizer

Pairs = list[tuple[str, str]]
FRAME_TOKENS = 3  # bos / sep / eos around an example's source and target, in a token budget


def check_positive(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"data.init_args.{name} = {value!r}: must be an integer >= {minimum}")


class TokenizedDataModule(L.LightningDataModule):
    """Base of every attnlab data module; see the module docstring for the contract."""

    # What to tell a user who asks for the test split of a data set that has none.
    test_split_hint = "this data module has no test split"

    def __init__(
        self,
        vocab_size: int = 1000,
        tokenizer_type: str = "unigram",
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        cache_dir: str | None = None,
        max_eval_examples: int | None = None,
        max_tokens: int | None = None,
    ):
        """`max_tokens` switches training batches from `batch_size` examples to a budget of padded
        source + target tokens, with examples of similar length batched together."""
        super().__init__()
        # No save_hyperparameters(): the requested vocab_size would clash with the model's real
        # one when Lightning merges data and model hparams for the logger.
        check_tokenizer_args(vocab_size, tokenizer_type)
        check_positive("batch_size", batch_size)
        check_positive("eval_batch_size", eval_batch_size)
        check_positive("num_workers", num_workers, minimum=0)
        if max_eval_examples is not None:
            check_positive("max_eval_examples", max_eval_examples)
        self.requested_vocab_size = vocab_size
        self.tokenizer_type = tokenizer_type
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.cache_dir = cache_dir
        self.max_eval_examples = max_eval_examples
        if max_tokens is not None:
            check_positive("max_tokens", max_tokens)
        self.max_tokens = max_tokens
        self._tokenizer: Tokenizer | None = None
        self._examples: dict[str, list[Example]] | None = None
        self._resume_position: tuple[int, int] | None = None  # (epoch, batches trained) from a checkpoint
        self._train_tokens: int | None = None  # train_token_count, counted once

    # ---- what subclasses provide -------------------------------------------------------------

    def _load_splits(self) -> dict[str, Pairs]:
        """(source_text, target_text) pairs for "train", "val" and optionally "test"."""
        raise NotImplementedError

    def _fingerprint(self) -> str:
        """A cheap identity of the training data (file hash or generator parameters)."""
        raise NotImplementedError

    def _tokenizer_texts(self, train: Pairs):
        """The texts the tokenizer learns from: every non-empty train source and target."""
        for source, target in train:
            if source:
                yield source
            if target:
                yield target

    def _make_examples(self, split: str, pairs: Pairs, tokenizer: Tokenizer) -> list[Example]:
        """Tokenize one split; override to cut the text differently (see TextDataModule)."""
        sources = tokenizer.encode_batch([s for s, _ in pairs])
        targets = tokenizer.encode_batch([t for _, t in pairs])
        return [Example(s, t, st, tt) for s, t, (st, tt) in zip(sources, targets, pairs)]

    # ---- lazy preparation --------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._examples is not None:
            return
        splits = self._load_splits()
        for split in ("train", "val"):
            if not splits.get(split):
                raise DataError(f"{type(self).__name__}: the {split} split has no examples; check its data files")
        tokenizer = self._trained_tokenizer(lambda: self._tokenizer_texts(splits["train"]))
        self._finish(tokenizer, {split: self._make_examples(split, pairs, tokenizer) for split, pairs in splits.items()})

    def _cache_root(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    def _trained_tokenizer(self, texts) -> Tokenizer:
        """The cached tokenizer of this data set, trained on `texts()` on a cache miss."""
        return train_tokenizer(
            texts,
            vocab_size=self.requested_vocab_size,
            model_type=self.tokenizer_type,
            cache_dir=self._cache_root(),
            fingerprint=f"{type(self).__module__}.{type(self).__qualname__}:{self._fingerprint()}",
        )

    def _finish(self, tokenizer: Tokenizer, examples: dict[str, Sequence[Example]]) -> None:
        """Cut the evaluation splits to max_eval_examples, refuse an empty split, and keep both."""
        for split, made in examples.items():
            if split != "train" and self.max_eval_examples is not None:
                made = examples[split] = made[: self.max_eval_examples]
            if not len(made):
                raise DataError(f"{type(self).__name__}: the {split} split yields no examples after tokenization")
        self._tokenizer, self._examples = tokenizer, examples

    def prepare_data(self) -> None:
        self._prepare()

    def setup(self, stage: str | None = None) -> None:
        self._prepare()

    @property
    def tokenizer(self) -> Tokenizer:
        self._prepare()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The tokenizer's real size, which the model's embedding must match."""
        return self.tokenizer.vocab_size

    @property
    def special_ids(self) -> SpecialIds:
        return SpecialIds()  # fixed by contract; Tokenizer checks every model against it

    @property
    def splits(self) -> tuple[str, ...]:
        self._prepare()
        return tuple(self._examples)

    def example_lengths(self, split: str) -> set[tuple[int, int]]:
        """The distinct (source, target) lengths in a split, without decoding streamed chunks."""
        examples = self.examples(split)
        if hasattr(examples, "lengths"):
            return examples.lengths()
        return {(len(e.source), len(e.target)) for e in examples}

    def split_origin(self, split: str) -> str:
        """Where a split's examples come from, for messages (subclasses with files name them)."""
        return f"{type(self).__name__}'s {split} split"

    def check_token_budget(self) -> None:
        """`fit` with a data.init_args.max_tokens below the longest training example: a batch that
        holds that example alone would already exceed the budget (the memory the budget was chosen
        to fit), so the run could fail with out-of-memory at that batch, hours in."""
        if not self.max_tokens:
            return
        framed = {source + target + FRAME_TOKENS for source, target in self.example_lengths("train")}
        if framed and self.max_tokens < max(framed):
            raise ConfigError(
                f"data.init_args.max_tokens = {self.max_tokens} is below the longest training example of "
                f"{self.split_origin('train')} ({max(framed)} tokens, counting source, target and {FRAME_TOKENS} "
                f"special tokens; the shortest has {min(framed)}): a batch of it alone would exceed the budget; "
                f"raise data.init_args.max_tokens to at least {max(framed)}, or drop it to batch by batch_size"
            )

    def examples(self, split: str) -> Sequence[Example]:
        self._prepare()
        if split not in self._examples:
            if split == "test":
                raise ConfigError(f"{type(self).__name__} has no test split: {self.test_split_hint}")
            raise ValueError(f"unknown split {split!r}; this data module has {sorted(self._examples)}")
        return self._examples[split]

    # ---- what training spends (attnlab.training.ledger and .budget) ----------------------------

    def train_token_count(self) -> int:
        """The training split's source + target tokens (no bos / sep / eos): what one pass over it
        processes. Plain text cut into chunks counts its chunks (the tail shorter than seq_len
        never trains)."""
        if self._train_tokens is None:
            examples = self.examples("train")
            fixed = examples.lengths() if hasattr(examples, "lengths") else None
            if fixed is not None and len(fixed) <= 1:
                self._train_tokens = sum(s + t for s, t in fixed) * len(examples)
            else:
                self._train_tokens = sum(len(e.source) + len(e.target) for e in examples)
        return self._train_tokens

    def train_batches(self, epoch: int = 0) -> list[tuple[int, list[tuple[int, int]]]]:
        """This rank's training batches of `epoch` as (how many, the (source, target) lengths of one
        such batch's rows), from the same samplers as `train_dataloader` but without building a
        loader (which would spend a resume position). Fixed-length data gives at most two kinds."""
        examples = self.examples("train")
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        fixed = examples.lengths() if hasattr(examples, "lengths") else None
        fixed = next(iter(fixed)) if fixed is not None and len(fixed) == 1 else None
        if fixed is not None and not self.max_tokens:
            full, rest = divmod(len(EpochRandomSampler(examples, seed=seed)), self.batch_size)
            return [(n, [fixed] * size) for n, size in ((full, self.batch_size), (1, rest)) if n and size]
        if self.max_tokens:
            sampler = TokenBudgetBatchSampler(_framed_lengths(examples), self.max_tokens, seed=seed)
            sampler.set_epoch(epoch)
            batches = list(sampler)
        else:
            sampler = EpochRandomSampler(examples, seed=seed)
            sampler.set_epoch(epoch)
            order = list(sampler)
            batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if fixed is not None:
            return [(1, [fixed] * len(batch)) for batch in batches]
        return [(1, [(len(examples[i].source), len(examples[i].target)) for i in batch]) for batch in batches]

    # ---- loaders -----------------------------------------------------------------------------

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        collate_fn = functools.partial(collate, pad_id=self.special_ids.pad)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        # The loader's own generator (worker seeds) keeps iter() off the global RNG, which
        # dropout and noise use: an epoch boundary draws nothing from it, resumed or not.
        generator = torch.Generator().manual_seed(seed)
        resume = None
        if shuffle:  # a checkpoint's position applies once, to the first training loader
            resume, self._resume_position = self._resume_position, None
        if shuffle and self.max_tokens:
            examples = self.examples(split)
            sampler = TokenBudgetBatchSampler(
                _framed_lengths(examples), self.max_tokens, seed=seed,
            )
            if resume:
                sampler.resume_at(resume[0], resume[1])
            return DataLoader(examples, batch_sampler=sampler, num_workers=self.num_workers, generator=generator,
                              persistent_workers=self.num_workers > 0, collate_fn=collate_fn)
        examples = self.examples(split)
        if not shuffle:
            return self._eval_loader(examples, generator)
        # Order fixed by (seed, epoch), not by the global RNG, so a resumed epoch repeats it.
        sampler = EpochRandomSampler(examples, seed=seed)
        if resume:
            sampler.resume_at(resume[0], resume[1] * self.batch_size)
        return DataLoader(
            examples,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=collate_fn,
            generator=generator,
        )

    def _eval_loader(self, examples: list[Example], generator: torch.Generator) -> DataLoader:
        """Longest sources first (`IndexedExamples`), with each example's index; shared exactly
        between distributed ranks."""
        dataset = IndexedExamples(examples)
        world, rank = distributed_world()
        sampler = EvenShareSampler(dataset, world, rank) if world > 1 else None
        return DataLoader(
            dataset,
            batch_size=self.eval_batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=functools.partial(collate_indexed, pad_id=self.special_ids.pad),
            generator=generator,
        )

    # ---- resuming (see attnlab.training.resume) -------------------------------------------------------

    def state_dict(self) -> dict:
        """Where training is in the current epoch, saved in every checkpoint, so a resumed run
        skips the batches of the interrupted epoch that were already trained."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.state.fn != "fit":
            return {}
        done = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        epoch = int(trainer.current_epoch)
        total = trainer.num_training_batches
        if isinstance(total, int) and done >= total:
            epoch, done = epoch + 1, 0
        return {"train_position": {"epoch": epoch, "batches": done}}

    def load_state_dict(self, state_dict: dict) -> None:
        position = (state_dict or {}).get("train_position")
        if position:
            self._resume_position = (int(position["epoch"]), int(position["batches"]))
            trainer = getattr(self, "trainer", None)
            if trainer is not None and trainer.world_size == 1:
                # Lightning's "dataloader is not resumable" warning: ours resumes exactly on one
                # process (tested there; under DDP it stands).
                warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        self._prepare()
        return self._loader("test" if "test" in self._examples else "val", shuffle=False)


def _framed_lengths(examples: Sequence[Example]) -> list[int]:
    """What each example adds to a token budget: source + target + bos / sep / eos."""
    if hasattr(examples, "lengths") and len(examples.lengths()) == 1:
        (source, target), = examples.lengths()
        return [source + target + FRAME_TOKENS] * len(examples)
    return [len(e.source) + len(e.target) + FRAME_TOKENS for e in examples]
