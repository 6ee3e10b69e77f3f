"""Aligned line files and Multi30k: loading, .gz, and errors that name the file, line and fix."""
from __future__ import annotations

import gzip
import io
import logging
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import data_modules.tokenizer as tokmod
from attnlab.errors import ConfigError, DataError
from data_modules import Multi30kDataModule, ParallelTextDataModule, SpecialIds
from data_modules.number_words import english, german

MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
EN = [f"the number {english(n)}." for n in range(0, 900, 3)]
DE = [f"die Zahl {german(n)}." for n in range(0, 900, 3)]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tokenizers go to a temp dir, never to ~/.cache."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path_factory.getbasetemp() / "attnlab_cache"))


def write(path: Path, lines: list[str]) -> str:
    data = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


def corpus(d: Path, n_val: int = 40, train_suffix: str = ".gz") -> dict:
    return dict(
        train_source=write(d / f"train.en{train_suffix}", EN[n_val:]),
        train_target=write(d / f"train.de{train_suffix}", DE[n_val:]),
        val_source=write(d / "val.en", EN[:n_val]),
        val_target=write(d / "val.de", DE[:n_val]),
        vocab_size=400,
    )


def forbid_training(monkeypatch):
    def fail(*args):
        raise AssertionError("a file error must be raised before the tokenizer is trained")

    monkeypatch.setattr(tokmod, "_train", fail)


def test_parallel_reads_gz_and_plain_files_and_batches_follow_the_schema(tmp_path):
    dm = ParallelTextDataModule(**corpus(tmp_path), eval_batch_size=16)
    train, val = dm.examples("train"), dm.examples("val")
    assert [(e.source_text, e.target_text) for e in train] == list(zip(EN[40:], DE[40:]))
    assert [(e.source_text, e.target_text) for e in val] == list(zip(EN[:40], DE[:40]))
    batch = next(iter(dm.val_dataloader()))
    rows = batch["index"].tolist()  # the longest sources first, see test_data_modules
    assert batch["source"].shape == (16, int(batch["source_lengths"].max()))
    assert batch["source_lengths"].tolist() == [len(val[i].source) for i in rows]
    assert batch["source_lengths"].tolist() == sorted(batch["source_lengths"].tolist(), reverse=True)
    assert (batch["target"][batch["target"] != SpecialIds().pad].numel() == sum(len(val[i].target) for i in rows))
    assert dm.tokenizer.decode_batch(batch["source"]) == [EN[i] for i in rows]
    assert dm.tokenizer.decode_batch(batch["target"]) == batch["target_text"] == [DE[i] for i in rows]
    with pytest.raises(ConfigError, match="no test split.*test_source.*test_target"):
        dm.test_dataloader()


def test_parallel_drops_pairs_with_an_empty_side_and_warns(tmp_path, caplog):
    args = corpus(tmp_path)
    write(Path(args["val_target"]), DE[:3] + ["   "] + DE[4:40])
    with caplog.at_level(logging.WARNING):
        val = ParallelTextDataModule(**args).examples("val")
    assert len(val) == 39 and EN[3] not in [e.source_text for e in val]
    assert "dropped 1 pairs" in caplog.text


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path, monkeypatch):
    args = corpus(tmp_path)
    write(Path(args["val_target"]), DE[:37])
    forbid_training(monkeypatch)
    with pytest.raises(DataError) as err:
        ParallelTextDataModule(**args).setup()
    msg = str(err.value)
    assert args["val_source"] in msg and args["val_target"] in msg
    assert re.search(r"val\.en \(data\.init_args\.val_source\) has 40 lines.*val\.de \(data\.init_args\.val_target\) has 37", msg)


def test_missing_file_names_the_path_and_the_argument_before_training(tmp_path, monkeypatch):
    args = corpus(tmp_path)
    args["val_target"] = str(tmp_path / "missing.de")
    forbid_training(monkeypatch)
    dm = ParallelTextDataModule(**args)
    with pytest.raises(DataError, match=r"data\.init_args\.val_target: not found: .*missing\.de"):
        dm.vocab_size


def test_non_utf8_names_the_file_and_the_line(tmp_path, monkeypatch):
    args = corpus(tmp_path)
    lines = "\n".join(DE[40:]).encode().split(b"\n")
    lines[6] = "Grüße".encode("latin-1")
    Path(args["train_target"]).write_bytes(gzip.compress(b"\n".join(lines)))
    forbid_training(monkeypatch)
    with pytest.raises(DataError, match=rf"data\.init_args\.train_target: {re.escape(args['train_target'])}, line 7: .*not valid UTF-8"):
        ParallelTextDataModule(**args).setup()


def test_empty_and_broken_gzip_files_are_reported(tmp_path):
    args = corpus(tmp_path)
    Path(args["val_source"]).write_bytes(b"\n\n")
    with pytest.raises(DataError, match=r"val_source: .*val\.en is empty"):
        ParallelTextDataModule(**args).setup()
    args = corpus(tmp_path)
    Path(args["train_source"]).write_bytes(b"plain text, not gzip\n")
    with pytest.raises(DataError, match=r"train_source: .*train\.en\.gz is not a valid gzip file"):
        ParallelTextDataModule(**args).setup()


def test_test_files_must_come_in_pairs(tmp_path):
    with pytest.raises(ConfigError, match="test_source and data.init_args.test_target must be set together"):
        ParallelTextDataModule(**corpus(tmp_path), test_source=str(tmp_path / "val.en"))


def test_tokenizer_cache_follows_the_train_file_contents(tmp_path):
    args = corpus(tmp_path, train_suffix="")
    first = ParallelTextDataModule(**args).tokenizer
    again = ParallelTextDataModule(**args).tokenizer
    write(Path(args["train_target"]), [line.upper() for line in DE[40:]])
    changed = ParallelTextDataModule(**args).tokenizer
    assert again.model_proto == first.model_proto != changed.model_proto


# ---- Multi30k ----------------------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("nothing may be downloaded unless download: true")

    monkeypatch.setattr(urllib.request, "urlopen", fail)


def test_multi30k_missing_files_suggest_download_and_never_fetch(tmp_path, no_network):
    dm = Multi30kDataModule(data_dir=str(tmp_path / "m30k"))
    with pytest.raises(DataError, match=r"data\.init_args\.data_dir: not found: .*train\.en\.gz.*download: true"):
        dm.setup()


def test_multi30k_download_failure_says_how_to_place_files(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match=r"downloading https://raw\.githubusercontent\.com/multi30k/.*train\.en\.gz failed.*by hand"):
        Multi30kDataModule(data_dir=str(tmp_path), download=True).setup()
    assert list(tmp_path.iterdir()) == []


def test_multi30k_downloads_only_missing_files_atomically(tmp_path, monkeypatch):
    fetched = []

    def fake_urlopen(url, timeout):
        fetched.append(url.rsplit("/", 1)[1])
        name = fetched[-1]
        lines = EN if ".en." in name else DE
        return io.BytesIO(gzip.compress("\n".join(lines[:40] if name.startswith(("val", "test")) else lines[40:]).encode()))

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    write(tmp_path / "val.en", EN[:30])  # uncompressed files are used when the .gz is absent
    write(tmp_path / "val.de", DE[:30])
    dm = Multi30kDataModule(data_dir=str(tmp_path), download=True, vocab_size=400)
    assert [len(dm.examples(s)) for s in ("train", "val", "test")] == [len(EN) - 40, 30, 40]
    assert sorted(fetched) == sorted(f"{p}.{lang}.gz" for p in ("train", "test_2016_flickr") for lang in ("en", "de"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(fetched + ["val.en", "val.de"])  # no temp files


@pytest.mark.parametrize(
    "kwargs, pattern",
    [(dict(source_lang="es"), r"data\.init_args\.source_lang = 'es'"),
     (dict(target_lang="en"), r"source_lang and target_lang are both 'en'")],
)
def test_multi30k_language_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Multi30kDataModule(**kwargs)


def test_multi30k_from_the_shared_folder(no_network):
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"Multi30k is not at {MULTI30K}; place train/val/test_2016_flickr .en/.de .gz files there")
    # bpe: the same 8000 pieces in a fifth of unigram's training time
    dm = Multi30kDataModule(data_dir=str(MULTI30K), tokenizer_type="bpe", eval_batch_size=100)
    assert [len(dm.examples(s)) for s in ("train", "val", "test")] == [29000, 1014, 1000]
    assert dm.vocab_size == 8000
    test = dm.examples("test")
    assert test[0].source_text.startswith("A man") and test[0].target_text.startswith("Ein Mann")
    for side in ("source", "target"):  # every sentence round-trips exactly
        assert dm.tokenizer.decode_batch([getattr(e, side) for e in test]) == [getattr(e, f"{side}_text") for e in test]
    batch = next(iter(dm.test_dataloader()))
    assert batch["target"].shape == (100, int(batch["target_lengths"].max()))
    assert batch["target_text"] == [test[i].target_text for i in batch["index"].tolist()]
    longest = max(len(e.source) for e in test)
    assert int(batch["source_lengths"][0]) == longest  # evaluation batches come longest source first
