"""TextFolderDataModule: a plain-text corpus as a folder (train / val / test .txt, .gz accepted)."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from data_modules import TextFolderDataModule

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "us_addresses"
WORDS = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex".split()


def _corpus(folder: Path, lines: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(lines)]


def test_a_folder_of_text_files_becomes_chunks_of_seq_len(tmp_path):
    train, val, test = _corpus(tmp_path, 300, 0), _corpus(tmp_path, 40, 1), _corpus(tmp_path, 30, 2)
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "val.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(val) + "\n")  # blank lines are skipped
    (tmp_path / "test.txt").write_text("\n".join(test) + "\n", encoding="utf-8")
    dm = TextFolderDataModule(data_dir=str(tmp_path), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "cache"))
    assert set(dm.splits) == {"train", "val", "test"}
    tokenizer = dm.tokenizer
    for split, lines in (("train", train), ("val", val), ("test", test)):
        stream_length = sum(len(ids) for ids in tokenizer.encode_batch(lines)) + len(lines) - 1  # eos between lines
        examples = dm.examples(split)
        assert len(examples) == stream_length // 16
        assert all(not e.source and len(e.target) == 16 for e in examples)
    first_val = dm.examples("val")[0].target_text.split("\n")[0]
    assert val[0].startswith(first_val) or first_val.startswith(val[0])


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared corpus {SHARED} is not beside this checkout")
def test_the_shared_presidential_addresses_load_from_their_folder(tmp_path):
    dm = TextFolderDataModule(data_dir=str(SHARED), seq_len=128, vocab_size=2000, cache_dir=str(tmp_path))
    sizes = {split: len(dm.examples(split)) for split in dm.splits}
    assert set(sizes) == {"train", "val", "test"}
    assert sizes["train"] > 10 * sizes["val"] > 0 and sizes["test"] > 0
    assert dm.examples("test")[0].target_text.split()[0] in (SHARED / "test.txt").read_text(encoding="utf-8")


def _folder(tmp_path: Path) -> Path:
    for split, (lines, seed) in {"train": (600, 0), "val": (40, 1), "test": (30, 2)}.items():
        (tmp_path / f"{split}.txt").write_text("\n".join(_corpus(tmp_path, lines, seed)) + "\n", encoding="utf-8")
    return tmp_path


def test_train_tokens_keeps_nested_subsets_of_whole_chunks_with_the_full_splits_tokenizer(tmp_path):
    """data.init_args.train_tokens: the training split cut to that many tokens (at most one chunk
    more), smaller sizes inside larger ones, chunks from all over the split; the tokenizer, the
    token file and the evaluation splits are the full split's, and the ledger's unique_tokens is
    the subset's."""
    folder, cache = _folder(tmp_path), str(tmp_path / "cache")
    full = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=cache)
    n_full = len(full.examples("train"))
    modules = {n: TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=cache, train_tokens=n)
               for n in (100, 500, 1600, n_full * 16)}
    rows = {}
    for n, dm in modules.items():
        examples = dm.examples("train")
        assert n <= len(examples) * 16 < n + 16  # within one chunk, never short
        assert dm.train_token_count() == len(examples) * 16  # the ledger's unique_tokens
        assert dm.tokenizer.model_proto == full.tokenizer.model_proto
        assert examples.path == full.examples("train").path  # the same cached token file
        for split in ("val", "test"):
            assert [e.target for e in dm.examples(split)] == [e.target for e in full.examples(split)]
        rows[n] = list(examples.rows)
        assert [e.target for e in examples] == [full.examples("train")[r].target for r in rows[n]]
    assert set(rows[100]) < set(rows[500]) < set(rows[1600]) < set(rows[n_full * 16]) == set(range(n_full))
    assert max(rows[500]) > n_full // 2  # spread over the split, not its first chunks
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 1  # trained once, for every size


@pytest.mark.parametrize("value, words", [
    (0, "must be a positive integer"), (-5, "must be a positive integer"), (1.5, "must be a positive integer"),
    (10**9, "is more than the training split holds"),
])
def test_a_bad_train_tokens_is_one_line_naming_the_field_and_the_fix(tmp_path, value, words):
    from attnlab.errors import ConfigError

    folder = _folder(tmp_path)
    with pytest.raises(ConfigError) as err:
        TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "c"),
                             train_tokens=value).examples("train")
    message = str(err.value)
    assert "data.init_args.train_tokens" in message and words in message and "\n" not in message
    if value == 10**9:
        held = len(TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300,
                                        cache_dir=str(tmp_path / "c")).examples("train")) * 16
        assert f"{held:,} tokens in" in message and f"at most {held}" in message
