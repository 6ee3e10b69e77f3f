"""GrammarDataModule: the synthetic English -> German translation task, generated from a seed.

Distinct English sentences (with their one German translation) are drawn until every split is
full, in the order train, val, test, so the splits never share a sentence and the same arguments
always give the same data. See data_modules.grammar.syntax for what the task asks of a model.
"""
from __future__ import annotations

import hashlib
import json
import random

from data_modules.errors import ConfigError
from data_modules.base import Pairs, TokenizedDataModule, check_positive
from data_modules.files import atomic_write_bytes
from data_modules.grammar.sampler import GrammarSampler
from data_modules.grammar.syntax import english, german

FORMAT = "grammar-v2"  # bump when the grammar or the lexicon changes what a seed draws


def grammar_pairs(seed: int, counts: dict[str, int], max_words: int, **probabilities) -> dict[str, Pairs]:
    """{split: [(english, german), ...]} with `counts[split]` distinct sentences of <= max_words words."""
    sampler = GrammarSampler(random.Random(seed), **probabilities)
    seen: set[str] = set()
    out: dict[str, Pairs] = {}
    attempts = 0
    for split, count in counts.items():
        pairs: Pairs = []
        while len(pairs) < count:
            attempts += 1
            if attempts > 50 * sum(counts.values()) + 1000:
                raise ConfigError(f"data.init_args: could not draw {count} distinct {split} sentences of at most "
                                  f"{max_words} words: raise max_words or lower the counts")
            tree = sampler.sentence()
            source = english(tree)
            if len(source.split()) > max_words or source in seen:
                continue
            seen.add(source)
            pairs.append((source, german(tree)))
        out[split] = pairs
    return out


class GrammarDataModule(TokenizedDataModule):
    """English sentences with case, gender, verb-final clauses and relative clauses, into German."""

    test_split_hint = "set data.init_args.n_test > 0"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 20000,
        n_val: int = 1000,
        n_test: int = 1000,
        max_words: int = 20,
        p_relative: float = 0.12,
        p_prep: float = 0.25,
        p_negated: float = 0.12,
        p_adverb: float = 0.15,
        p_adverbial: float = 0.15,
        vocab_size: int = 2000,
        tokenizer_type: str = "bpe",
        **kwargs,  # batch_size, eval_batch_size, num_workers, cache_dir, max_eval_examples, max_tokens
    ):
        """p_*: how often a noun phrase takes a relative clause, a clause a prepositional phrase or
        a negation, and a sentence a fronted adverb or an adverbial clause (the last two exclusive)."""
        super().__init__(vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs)
        for name, value, low in (("n_train", n_train, 1), ("n_val", n_val, 1), ("n_test", n_test, 0),
                                 ("max_words", max_words, 3)):
            check_positive(name, value, low)
        self.probabilities = {"p_relative": p_relative, "p_prep": p_prep, "p_negated": p_negated,
                              "p_adverb": p_adverb, "p_adverbial": p_adverbial}
        for name, value in self.probabilities.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"data.init_args.{name} = {value!r}: must be a probability from 0 to 1")
        if p_adverb + p_adverbial > 1.0:
            raise ConfigError(f"data.init_args.p_adverb + p_adverbial = {p_adverb + p_adverbial}: must be at most 1 "
                              "(a sentence has a fronted adverb or an adverbial clause, not both)")
        self.seed, self.max_words = seed, max_words
        self.counts = {"train": n_train, "val": n_val, "test": n_test}

    def _load_splits(self) -> dict[str, Pairs]:
        """The generated splits, kept in the cache folder beside the tokenizers: drawing the
        sentences is pure Python, which every fit and test process of a sweep would pay again."""
        counts = {split: n for split, n in self.counts.items() if n > 0}
        params = [FORMAT, self.seed, counts, self.max_words, sorted(self.probabilities.items())]
        path = self._cache_root() / "grammar" / f"{hashlib.sha256(repr(params).encode()).hexdigest()[:24]}.json"
        try:
            return {split: [tuple(pair) for pair in pairs] for split, pairs in json.loads(path.read_text("utf-8")).items()}
        except (OSError, ValueError, AttributeError):  # not cached yet, or a damaged entry: draw them
            pass
        splits = grammar_pairs(self.seed, counts, self.max_words, **self.probabilities)
        try:
            atomic_write_bytes(path, json.dumps(splits, ensure_ascii=False).encode("utf-8"))
        except OSError:  # a read-only cache only costs drawing them again
            pass
        return splits

    def _fingerprint(self) -> str:
        # The train split is drawn first, so it depends on neither n_val nor n_test.
        params = [FORMAT, self.seed, self.counts["train"], self.max_words, sorted(self.probabilities.items())]
        return hashlib.sha256(repr(params).encode()).hexdigest()
