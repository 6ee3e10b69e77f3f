"""The shared data-module base, the number-words task and the plain-text LM module."""
from __future__ import annotations

import gzip
import pickle
import random
import re

import jsonargparse
import lightning as L
import pytest
import torch

from attnlab.errors import ConfigError, DataError
from data_modules import Example, NumberWordsDataModule, SpecialIds, TextDataModule, TokenizedDataModule
from data_modules.number_words import english, german


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("attnlab_cache")


@pytest.fixture(autouse=True)
def _isolated_cache(cache_dir, monkeypatch):
    """Tokenizers go to a per-module temp dir (shared by its tests), never to ~/.cache."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(cache_dir))


def evaluation_order(split: list[Example]) -> list[int]:
    """The order evaluation loaders promise: longest source first, then longest target, ties in
    split order (a plain sort, written independently of data_modules.batch)."""
    by_length = {}
    for i, e in enumerate(split):
        by_length.setdefault((len(e.source), len(e.target)), []).append(i)
    return [i for key in sorted(by_length, reverse=True) for i in by_length[key]]


def check_eval_batch(batch: dict, split: list[Example], tokenizer, first: int, exact_text: bool = True) -> None:
    """An evaluation batch (one process): rows `first`, `first + 1`, ... of the split in evaluation
    order, each with its split index and counted."""
    order = evaluation_order(split)[first : first + len(batch["target_text"])]
    check_batch(batch, [split[i] for i in order], tokenizer, exact_text, index=order)


def check_batch(batch: dict, examples: list[Example], tokenizer, exact_text: bool = True,
                index: list[int] | None = None) -> None:
    """A batch follows the schema of data_modules/batch.py and matches its examples; an evaluation
    batch (`index`: the split index of each example) also carries index and counted."""
    keys = {"source", "source_lengths", "target", "target_lengths", "source_text", "target_text"}
    assert set(batch) == (keys if index is None else keys | {"index", "counted"})
    n = len(examples)
    if index is not None:  # one process: every row counted
        assert batch["index"].tolist() == index
        assert batch["counted"].dtype == torch.bool and batch["counted"].all()
    for side in ("source", "target"):
        ids, lengths = batch[side], batch[f"{side}_lengths"]
        assert ids.dtype == lengths.dtype == torch.long
        assert ids.shape == (n, int(lengths.max()))
        assert lengths.tolist() == [len(getattr(e, side)) for e in examples]
        positions = torch.arange(ids.shape[1])
        padding = positions[None, :] >= lengths[:, None]
        assert (ids[padding] == SpecialIds().pad).all()
        assert (ids[~padding] != SpecialIds().pad).all()  # pieces never contain pad / bos / eos / sep
        assert batch[f"{side}_text"] == [getattr(e, f"{side}_text") for e in examples]
        if exact_text:
            assert tokenizer.decode_batch(ids) == batch[f"{side}_text"]


# ---- number words ------------------------------------------------------------------------------

TABLE = {
    0: ("zero", "null"),
    1: ("one", "eins"),
    7: ("seven", "sieben"),
    11: ("eleven", "elf"),
    16: ("sixteen", "sechzehn"),
    17: ("seventeen", "siebzehn"),
    21: ("twenty one", "einundzwanzig"),
    30: ("thirty", "dreißig"),
    77: ("seventy seven", "siebenundsiebzig"),
    100: ("one hundred", "einhundert"),
    101: ("one hundred one", "einhunderteins"),
    105: ("one hundred five", "einhundertfünf"),
    111: ("one hundred eleven", "einhundertelf"),
    1000: ("one thousand", "eintausend"),
    1001: ("one thousand one", "eintausendeins"),
    2001: ("two thousand one", "zweitausendeins"),
    2021: ("two thousand twenty one", "zweitausendeinundzwanzig"),
    21000: ("twenty one thousand", "einundzwanzigtausend"),
    100000: ("one hundred thousand", "einhunderttausend"),
    101000: ("one hundred one thousand", "einhunderteintausend"),
    325401: ("three hundred twenty five thousand four hundred one", "dreihundertfünfundzwanzigtausendvierhunderteins"),
    999999: ("nine hundred ninety nine thousand nine hundred ninety nine",
             "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
}


@pytest.mark.parametrize("n", sorted(TABLE))
def test_number_words_table(n):
    assert (english(n), german(n)) == TABLE[n]


@pytest.mark.parametrize("n", [-1, 1_000_000])
def test_number_words_out_of_range(n):
    for f in (english, german):
        with pytest.raises(ValueError, match="0..999999"):
            f(n)


def test_number_words_are_well_formed_and_unambiguous():
    ns = list(range(3000)) + random.Random(1).sample(range(3000, 1_000_000), 5000)
    en, de = [english(n) for n in ns], [german(n) for n in ns]
    assert all(re.fullmatch(r"[a-z]+( [a-z]+)*", w) for w in en)
    assert all(re.fullmatch(r"[a-zäöüß]+", w) for w in de)
    assert not any("and" in w.split() for w in en)
    assert len(set(en)) == len(set(de)) == len(ns)  # distinct numbers, distinct words


def test_number_words_splits_are_seeded_and_disjoint():
    a = NumberWordsDataModule(seed=3, n_train=500, n_val=50, n_test=50)
    b = NumberWordsDataModule(seed=3, n_train=500, n_val=50, n_test=50)
    c = NumberWordsDataModule(seed=4, n_train=500, n_val=50, n_test=50)
    assert a._load_splits() == b._load_splits()
    assert a.numbers()["train"] != c.numbers()["train"]
    nums = a.numbers()
    assert [len(nums[s]) for s in ("train", "val", "test")] == [500, 50, 50]
    assert len(set(nums["train"]) | set(nums["val"]) | set(nums["test"])) == 600
    assert NumberWordsDataModule(n_train=10, n_val=5, n_test=0, max_number=20).numbers().keys() == {"train", "val"}


def test_number_words_defaults_give_20k_distinct_pairs_and_a_working_tokenizer():
    dm = NumberWordsDataModule()
    train = dm.examples("train")
    assert len({(e.source_text, e.target_text) for e in train}) == len(train) == 20000
    assert [len(dm.examples(s)) for s in ("val", "test")] == [1000, 1000]
    assert 6 + 256 < dm.vocab_size <= 400 == dm.requested_vocab_size
    batch = next(iter(dm.val_dataloader()))
    assert len(batch["target_text"]) == 256
    check_eval_batch(batch, dm.examples("val"), dm.tokenizer, first=0)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(n_train=900, n_val=60, n_test=50, max_number=999), r"n_train.*1010.*max_number = 999"),
        (dict(max_number=1_000_000), r"data\.init_args\.max_number"),
        (dict(n_val=0), r"data\.init_args\.n_val"),
        (dict(vocab_size=100), r"data\.init_args\.vocab_size"),
        (dict(tokenizer_type="char"), r"data\.init_args\.tokenizer_type"),
        (dict(batch_size=0), r"data\.init_args\.batch_size"),
        (dict(max_eval_examples=0), r"data\.init_args\.max_eval_examples"),
    ],
)
def test_number_words_config_errors_name_the_field(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        NumberWordsDataModule(**kwargs)


# ---- the shared base ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(cache_dir):
    return NumberWordsDataModule(n_train=1000, n_val=100, n_test=60, batch_size=32, eval_batch_size=40,
                                 max_eval_examples=50, cache_dir=str(cache_dir))


def test_loaders_follow_the_schema_and_drop_nothing(small):
    train = list(small.train_dataloader())
    assert [len(b["target_text"]) for b in train] == [32] * 31 + [8]
    assert sorted(t for b in train for t in b["target_text"]) == sorted(e.target_text for e in small.examples("train"))
    by_text = {e.target_text: e for e in small.examples("train")}
    check_batch(train[0], [by_text[t] for t in train[0]["target_text"]], small.tokenizer)
    val = list(small.val_dataloader())
    assert [len(b["target_text"]) for b in val] == [40, 10]  # max_eval_examples caps val ...
    check_eval_batch(val[0], small.examples("val"), small.tokenizer, first=0)
    check_eval_batch(val[1], small.examples("val"), small.tokenizer, first=40)
    assert len(small.examples("test")) == 50  # ... and test, but not train
    test = small.examples("test")
    assert list(small.predict_dataloader())[0]["target_text"] == [test[i].target_text for i in evaluation_order(test)[:40]]


def test_train_order_follows_lightnings_seed(small):
    def first_batch(seed):
        L.seed_everything(seed, verbose=False)
        return next(iter(small.train_dataloader()))["target_text"]

    assert first_batch(1) == first_batch(1) != first_batch(2)


def test_a_token_budget_below_the_longest_example_is_refused_and_one_that_holds_it_is_kept(small, cache_dir):
    """Below the longest example, the batch that holds it alone already exceeds max_tokens (the
    memory the budget was chosen for): a ConfigError before `fit`, naming the length to raise it to.
    At that length, every batch keeps to the budget."""
    framed = sorted(len(e.source) + len(e.target) + 3 for e in small.examples("train"))

    def budget(max_tokens):
        return NumberWordsDataModule(n_train=1000, n_val=100, n_test=60, max_eval_examples=50,
                                     cache_dir=str(cache_dir), max_tokens=max_tokens)

    with pytest.raises(ConfigError, match=f"max_tokens = {framed[-1] - 1} is below the longest training example of "
                                          f"NumberWordsDataModule's train split .{framed[-1]} tokens.*the shortest "
                                          f"has {framed[0]}.*at least {framed[-1]}"):
        budget(framed[-1] - 1).check_token_budget()
    enough = budget(framed[-1])
    enough.check_token_budget()
    examples, batches = enough.examples("train"), list(enough.train_dataloader().batch_sampler)
    size = [[len(examples[i].source) + len(examples[i].target) + 3 for i in batch] for batch in batches]
    assert sorted(i for batch in batches for i in batch) == list(range(1000))
    assert all(max(s) * len(s) <= enough.max_tokens for s in size)
    assert any(len(s) > 1 for s in size)


def test_setup_is_idempotent_and_vocab_is_ready_after_init(cache_dir, monkeypatch):
    dm = NumberWordsDataModule(n_train=300, n_val=20, n_test=0)
    calls = []
    real = dm._load_splits
    monkeypatch.setattr(dm, "_load_splits", lambda: calls.append(1) or real())
    assert dm.vocab_size == dm.tokenizer.vocab_size  # before any Lightning hook
    train = dm.examples("train")
    dm.setup("fit")
    dm.setup("validate")
    assert calls == [1] and dm.examples("train") is train
    assert dm.special_ids == SpecialIds()
    with pytest.raises(ConfigError, match="no test split.*n_test"):
        dm.test_dataloader()
    val = dm.examples("val")
    assert list(dm.predict_dataloader())[0]["target_text"] == [val[i].target_text for i in evaluation_order(val)]
    with pytest.raises(ValueError, match="unknown split"):
        dm.examples("dev")


def test_data_module_and_loader_pieces_pickle(small):
    loader = small.train_dataloader()
    collate_fn = pickle.loads(pickle.dumps(loader.collate_fn))
    batch = collate_fn(pickle.loads(pickle.dumps(small.examples("val")[:3])))
    assert batch["target_lengths"].tolist() == [len(e.target) for e in small.examples("val")[:3]]
    clone = pickle.loads(pickle.dumps(small))
    assert clone.examples("val") == small.examples("val") and clone.vocab_size == small.vocab_size


def test_worker_processes_yield_the_same_batches(cache_dir):
    dm = NumberWordsDataModule(n_train=300, n_val=20, n_test=0, num_workers=1)
    val = dm.examples("val")
    assert [b["target_text"] for b in dm.val_dataloader()] == [[val[i].target_text for i in evaluation_order(val)]]


@pytest.mark.parametrize(
    "class_path, init_args",
    [
        ("data_modules.NumberWordsDataModule", {"n_train": 10, "vocab_size": 300, "cache_dir": None}),
        ("data_modules.TextDataModule", {"train_files": ["a.txt"], "val_files": ["b.txt"], "prompt_len": 4}),
        ("data_modules.ParallelTextDataModule",
         {"train_source": "a", "train_target": "b", "val_source": "c", "val_target": "d"}),
        ("data_modules.Multi30kDataModule", {"source_lang": "de", "target_lang": "en", "max_eval_examples": 9}),
    ],
)
def test_config_files_can_build_every_module(class_path, init_args):
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(TokenizedDataModule, "data")
    cfg = parser.parse_object({"data": {"class_path": class_path, "init_args": init_args}})
    dm = parser.instantiate_classes(cfg).data
    assert type(dm).__name__ == class_path.rsplit(".", 1)[1]
    for key, value in init_args.items():
        assert getattr(dm, "requested_vocab_size" if key == "vocab_size" else key, value) == value


# ---- plain text --------------------------------------------------------------------------------

LINES = [f"{english(n)} heißt auf Deutsch {german(n)}." for n in range(1, 400, 3)]


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    (d / "a.txt").write_text("\n".join(LINES[:60]) + "\n\n", encoding="utf-8")  # a blank line is skipped
    with gzip.open(d / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(LINES[60:120]))
    (d / "val.txt").write_text("\n".join(LINES[120:]), encoding="utf-8")
    return d


def make_text(d, **kw) -> TextDataModule:
    return TextDataModule(train_files=[str(d / "a.txt"), str(d / "b.txt.gz")], val_files=[str(d / "val.txt")],
                          vocab_size=350, **kw)


def test_text_chunks_are_the_eos_joined_stream(text_files):
    dm = make_text(text_files, seq_len=16)
    tok, eos = dm.tokenizer, SpecialIds().eos
    stream = []
    for line in LINES[:120]:
        stream += ([eos] if stream else []) + tok.encode(line)
    train = dm.examples("train")
    assert len(train) == len(stream) // 16
    assert all(e.source == [] and e.source_text == "" and len(e.target) == 16 for e in train)
    assert [t for e in train for t in e.target] == stream[: 16 * len(train)]
    full = "\n".join(LINES[:120])
    for e in train:
        assert e.target_text.count("\n") == e.target.count(eos) and e.target_text in full
    batch = next(iter(dm.val_dataloader()))
    check_eval_batch(batch, dm.examples("val"), tok, first=0, exact_text=False)


def test_text_prompt_splits_each_chunk(text_files):
    whole = make_text(text_files, seq_len=16).examples("val")
    split = make_text(text_files, seq_len=16, prompt_len=5).examples("val")
    assert len(split) == len(whole)
    for w, s in zip(whole, split):
        assert (s.source, s.target) == (w.target[:5], w.target[5:])
    batch = next(iter(make_text(text_files, seq_len=16, prompt_len=5, eval_batch_size=7).val_dataloader()))
    assert batch["source"].shape == (7, 5) and batch["target"].shape == (7, 11)
    check_eval_batch(batch, split, None, first=0, exact_text=False)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(seq_len=8, prompt_len=8), r"prompt_len = 8 with data\.init_args\.seq_len = 8"),
        (dict(seq_len=0), r"data\.init_args\.seq_len"),
    ],
)
def test_text_config_errors(text_files, kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        make_text(text_files, **kwargs)
    with pytest.raises(ConfigError, match=r"data\.init_args\.val_files"):
        TextDataModule(train_files=["a"], val_files=[])


def test_text_file_errors_name_the_file(text_files, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("ok\nnoch gut\nkaputt: \xff\n".encode("latin-1"))
    dm = TextDataModule(train_files=[str(text_files / "a.txt"), str(bad)], val_files=[str(text_files / "val.txt")])
    with pytest.raises(DataError, match=rf"train_files\[1\].*{re.escape(str(bad))}, line 3: .*UTF-8"):
        dm.setup()
    dm = TextDataModule(train_files=[str(text_files / "a.txt")], val_files=[str(tmp_path / "nope.txt")])
    with pytest.raises(DataError, match=r"val_files\[0\]: not found: .*nope\.txt"):
        dm.setup()
    with pytest.raises(DataError, match=r"train_files hold \d+ tokens.*seq_len = 100000"):
        make_text(text_files, seq_len=100000).setup()
