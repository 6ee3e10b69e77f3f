"""docs/guides/data.md "Adding a data module", followed literally: a module of the guide's shape,
named by its import path, trains any family through `attnlab fit` and refuses bad arguments in one
line that names the field."""
from __future__ import annotations

import hashlib
import random

import pytest

from conftest import FAST_TRAINER, read_metrics
from data_modules.base import Pairs, TokenizedDataModule
from data_modules.errors import ConfigError

ALPHABET = "abcdefgh"


class Reversals(TokenizedDataModule):
    """Step 1 and 2 of the guide: words of random letters and their reversal, drawn from a seed."""

    def __init__(self, n_train: int = 64, n_val: int = 8, seed: int = 0, vocab_size: int = 300,
                 tokenizer_type: str = "bpe", **kwargs):
        super().__init__(vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs)
        for name, value in (("n_train", n_train), ("n_val", n_val)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"data.init_args.{name} = {value!r}: must be an integer >= 1")
        self.n_train, self.n_val, self.seed = n_train, n_val, seed

    def _load_splits(self) -> dict[str, Pairs]:
        rng = random.Random(self.seed)
        words = [" ".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 6)))
                 for _ in range(self.n_train + self.n_val)]
        pairs = [(w, " ".join(reversed(w.split()))) for w in words]
        return {"train": pairs[: self.n_train], "val": pairs[self.n_train:]}

    def _fingerprint(self) -> str:
        return hashlib.sha256(repr((self.n_train, self.n_val, self.seed)).encode()).hexdigest()[:16]


def config(tmp_path, family: str = "attnlab.DecoderOnly", **init_args) -> str:
    args = "".join(f"    {k}: {v}\n" for k, v in init_args.items())
    path = tmp_path / "reversals.yaml"
    path.write_text(
        f"model:\n  class_path: {family}\n  init_args:\n"
        "    backbone: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}\n"
        "data:\n  class_path: test_guide_data_module.Reversals\n  init_args:\n    batch_size: 32\n" + args,
        encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("family", ["attnlab.DecoderOnly", "attnlab.EncoderDecoder"])
def test_a_data_module_written_as_the_guide_says_trains_through_fit(cli, tmp_path, family):
    result = cli("fit", "--config", config(tmp_path, family), "--run.root", tmp_path / "runs",
                 "--run.version", "v1", "--run.wandb", "disabled", *FAST_TRAINER)
    assert result.code == 0, result.err[-3000:]
    run = tmp_path / "runs" / "reversals" / "v1"
    metrics = read_metrics(run)
    assert len(metrics["train/loss"]) == 2 and metrics["val/nll"]  # two steps of 64 pairs in batches of 32
    assert "test_guide_data_module.Reversals" in (run / "config.yaml").read_text(encoding="utf-8")


def test_the_base_serves_the_modules_pairs_tokenized_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    dm = Reversals(seed=3)
    dm.setup("fit")
    splits = dm._load_splits()
    for split in ("train", "val"):
        examples = dm.examples(split)
        assert [(e.source_text, e.target_text) for e in examples] == splits[split]
        assert all(dm.tokenizer.decode(e.target) == e.target_text for e in examples)
    assert Reversals(seed=4)._fingerprint() != dm._fingerprint()


def test_a_bad_argument_is_one_line_naming_the_field(cli, tmp_path):
    result = cli("fit", "--config", config(tmp_path, n_train=0), "--run.root", tmp_path / "runs",
                 "--run.wandb", "disabled", *FAST_TRAINER)
    assert result.code == 2
    assert "data.init_args.n_train = 0: must be an integer >= 1" in result.err
    assert not (tmp_path / "runs").exists()
