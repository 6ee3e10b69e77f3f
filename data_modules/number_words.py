"""The embedded default task: English number words to German number words.

It is generated offline from a seed, so every test and smoke run has a real translation task
(reordering "twenty one" -> "einundzwanzig", compounding, exact-match scoring) with no download.
"""
from __future__ import annotations

import hashlib
import random

from data_modules.errors import ConfigError
from data_modules.base import Pairs, TokenizedDataModule

MAX_NUMBER = 999_999

_EN_SMALL = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_DE_SMALL = (
    "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn "
    "fünfzehn sechzehn siebzehn achtzehn neunzehn"
).split()
_DE_TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()


def _check_range(n: int) -> None:
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"{n} is outside the supported range 0..{MAX_NUMBER}")


def _english_below_1000(n: int) -> list[str]:
    hundreds, rest = divmod(n, 100)
    words = [_EN_SMALL[hundreds], "hundred"] if hundreds else []
    if rest >= 20:
        words.append(_EN_TENS[rest // 10])
        if rest % 10:
            words.append(_EN_SMALL[rest % 10])
    elif rest:
        words.append(_EN_SMALL[rest])
    return words


def english(n: int) -> str:
    """'three hundred twenty five thousand four hundred one': lower case, no 'and', no hyphens."""
    _check_range(n)
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = _english_below_1000(thousands) + ["thousand"] if thousands else []
    return " ".join(words + _english_below_1000(rest))


def _german_below_100(n: int, final: bool) -> str:
    """1 is 'eins' at the end of a number and 'ein' before 'hundert' / 'tausend'."""
    if n == 1:
        return "eins" if final else "ein"
    if n < 20:
        return _DE_SMALL[n]
    tens, units = divmod(n, 10)
    if units == 0:
        return _DE_TENS[tens]
    return ("ein" if units == 1 else _DE_SMALL[units]) + "und" + _DE_TENS[tens]


def _german_below_1000(n: int, final: bool) -> str:
    hundreds, rest = divmod(n, 100)
    word = _german_below_100(hundreds, final=False) + "hundert" if hundreds else ""
    return word + (_german_below_100(rest, final) if rest else "")


def german(n: int) -> str:
    """One word in German orthography: 'dreihundertfünfundzwanzigtausendvierhunderteins'."""
    _check_range(n)
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    word = _german_below_1000(thousands, final=False) + "tausend" if thousands else ""
    return word + (_german_below_1000(rest, final=True) if rest else "")


class NumberWordsDataModule(TokenizedDataModule):
    """Distinct integers from [0, max_number], drawn by a seeded sample, in disjoint splits."""

    test_split_hint = "set data.init_args.n_test > 0"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        max_number: int = MAX_NUMBER,
        vocab_size: int = 400,
        tokenizer_type: str = "bpe",  # on this corpus: quicker to train than unigram, shorter pieces
        **kwargs,  # batch_size, eval_batch_size, num_workers, cache_dir, max_eval_examples
    ):
        super().__init__(
            vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs,
        )
        for name, value, low in (("n_train", n_train, 1), ("n_val", n_val, 1), ("n_test", n_test, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"data.init_args.{name} = {value!r}: must be an integer >= {low}")
        if isinstance(max_number, bool) or not isinstance(max_number, int) or not 0 <= max_number <= MAX_NUMBER:
            raise ConfigError(f"data.init_args.max_number = {max_number!r}: must be an integer in 0..{MAX_NUMBER}")
        if n_train + n_val + n_test > max_number + 1:
            raise ConfigError(
                f"data.init_args.n_train + n_val + n_test = {n_train} + {n_val} + {n_test} = "
                f"{n_train + n_val + n_test} distinct numbers, but data.init_args.max_number = "
                f"{max_number} allows only {max_number + 1}: lower the counts or raise max_number (at most {MAX_NUMBER})"
            )
        self.seed, self.max_number = seed, max_number
        self.n_train, self.n_val, self.n_test = n_train, n_val, n_test

    def numbers(self) -> dict[str, list[int]]:
        """The integers of each split (deterministic in the arguments)."""
        total = self.n_train + self.n_val + self.n_test
        drawn = random.Random(self.seed).sample(range(self.max_number + 1), total)
        cut = (0, self.n_train, self.n_train + self.n_val, total)
        out = {name: drawn[a:b] for name, a, b in zip(("train", "val", "test"), cut, cut[1:])}
        if not out["test"]:
            del out["test"]
        return out

    def _load_splits(self) -> dict[str, Pairs]:
        return {split: [(english(n), german(n)) for n in ns] for split, ns in self.numbers().items()}

    def _fingerprint(self) -> str:
        params = f"v1:{self.seed}:{self.n_train}:{self.n_val}:{self.n_test}:{self.max_number}"
        return hashlib.sha256(params.encode()).hexdigest()
