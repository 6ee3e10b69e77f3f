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
