"""Symbol-sequence tasks whose answer depends on position, for positional-encoding ablations.

`reverse`: "c a f" -> "f a c"; `copy`: "c a f" -> "c a f". Training sequences have 1 to
`max_length` symbols; validation and test sequences have exactly `eval_length_factor` x
`max_length`, so one trained model can be tested at 1x, 2x and 4x its longest training input
(length extrapolation). Symbols are space-separated letters, one tokenizer piece each.
"""
from __future__ import annotations

import hashlib
import random
import string

from data_modules.errors import ConfigError
from data_modules.base import Pairs, TokenizedDataModule

TASKS = ("reverse", "copy")


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high)
    if bad:
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"data.init_args.{name} = {value!r}: must be an integer {bound}")


class SequenceTaskDataModule(TokenizedDataModule):
    """Random symbol strings and their reversal (or copy), generated from a seed."""

    def __init__(
        self,
        task: str = "reverse",
        alphabet_size: int = 10,
        min_length: int = 1,
        max_length: int = 16,
        eval_length_factor: int = 1,
        n_train: int = 20000,
        n_val: int = 500,
        n_test: int = 500,
        seed: int = 0,
        vocab_size: int = 300,
        tokenizer_type: str = "bpe",
        **kwargs,  # batch_size, eval_batch_size, num_workers, cache_dir, max_eval_examples
    ):
        super().__init__(vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs)
        if task not in TASKS:
            raise ConfigError(f"data.init_args.task = {task!r}: must be one of {', '.join(TASKS)}")
        _check_int("alphabet_size", alphabet_size, 2, len(string.ascii_lowercase))
        _check_int("min_length", min_length, 1)
        _check_int("max_length", max_length, min_length)
        _check_int("eval_length_factor", eval_length_factor, 1)
        for name, value, low in (("n_train", n_train, 1), ("n_val", n_val, 1), ("n_test", n_test, 0)):
            _check_int(name, value, low)
        self.task, self.alphabet = task, string.ascii_lowercase[:alphabet_size]
        self.min_length, self.max_length, self.eval_length_factor = min_length, max_length, eval_length_factor
        self.n_train, self.n_val, self.n_test, self.seed = n_train, n_val, n_test, seed

    def _pairs(self, rng: random.Random, count: int, lengths: tuple[int, int]) -> Pairs:
        pairs = []
        for _ in range(count):
            symbols = rng.choices(self.alphabet, k=rng.randint(*lengths))
            answer = symbols[::-1] if self.task == "reverse" else symbols
            pairs.append((" ".join(symbols), " ".join(answer)))
        return pairs

    def _load_splits(self) -> dict[str, Pairs]:
        # Each split has its own generator: the training data does not change with the eval length.
        eval_length = self.eval_length_factor * self.max_length
        splits = {
            "train": self._pairs(random.Random(f"{self.seed}:train"), self.n_train, (self.min_length, self.max_length)),
            "val": self._pairs(random.Random(f"{self.seed}:val"), self.n_val, (eval_length, eval_length)),
            "test": self._pairs(random.Random(f"{self.seed}:test"), self.n_test, (eval_length, eval_length)),
        }
        if not splits["test"]:
            del splits["test"]
        return splits

    def _fingerprint(self) -> str:
        """Only what the training split depends on: every eval length shares one tokenizer."""
        params = f"v1:{self.task}:{self.alphabet}:{self.min_length}:{self.max_length}:{self.n_train}:{self.seed}"
        return hashlib.sha256(params.encode()).hexdigest()
