"""The tokenizer: exact round trips, fixed special ids, the on-disk cache, and clear errors."""
from __future__ import annotations

import io
import pickle

import pytest
import sentencepiece as spm
import torch

import data_modules.tokenizer as tokmod
from attnlab.errors import ConfigError, DataError
from data_modules import SpecialIds, Tokenizer, train_tokenizer
from data_modules.number_words import english, german

CORPUS = [f"{english(n)} heißt {german(n)}." for n in range(0, 5000, 7)]
UNSEEN = "Grüße aus Köln ☃ 你好 ß€"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return train_tokenizer(CORPUS, 400, "unigram", tmp_path_factory.mktemp("cache"), "corpus")


@pytest.mark.parametrize(
    "text", [UNSEEN, "  two  spaces, tab\tand trailing ", " leading", "", "<sep> <mask> <s> </s> <pad>", "a\nb"]
)
def test_round_trip_is_exact_even_for_unseen_characters(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert SpecialIds().unk not in ids  # byte fallback, never <unk>


def test_unseen_characters_fall_back_to_byte_pieces(tok):
    ids = tok.encode("☃")
    assert len(ids) >= 3 and all(6 <= i < 6 + 256 for i in ids[-3:])  # 3 UTF-8 bytes


def test_special_ids_are_the_schema_defaults(tok):
    assert tok.special_ids == SpecialIds() == SpecialIds(pad=0, unk=1, bos=2, eos=3, sep=4, mask=5)
    sp = spm.SentencePieceProcessor(model_proto=tok.model_proto)
    assert [sp.id_to_piece(i) for i in range(6)] == ["<pad>", "<unk>", "<s>", "</s>", "<sep>", "<mask>"]
    # special pieces never come out of user text, even when it spells them
    assert not set(tok.encode("<sep> <mask> <s> </s> <pad>")) & {0, 2, 3, 4, 5}


def test_decode_drops_framing_ids_and_does_not_stop_at_eos(tok):
    a, b = tok.encode("zwei"), tok.encode("drei")
    s = SpecialIds()
    assert tok.decode([s.bos, *a, s.sep, s.mask, *b, s.eos, s.pad, s.pad]) == tok.decode(a + b)
    assert tok.decode([*a, s.eos, *b]) == tok.decode(a + b)  # the caller cuts at eos
    assert tok.decode(torch.tensor([s.bos, *a, s.eos])) == "zwei"
    assert tok.decode([*a, tok.vocab_size + 7]) == "zwei"  # ids past the vocabulary are ignored
    assert tok.decode_batch([[s.bos, *a], [], torch.tensor(b)]) == ["zwei", "", "drei"]
    assert tok.decode_batch(torch.tensor([[*a, s.pad]])) == ["zwei"]


def test_encode_batch_matches_encode(tok):
    texts = [UNSEEN, "", "neunundneunzig"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_small_corpus_gives_a_smaller_real_vocab(tmp_path):
    tok = train_tokenizer(["eins zwei drei"] * 5, 1000, "bpe", tmp_path, "tiny")
    assert 6 + 256 < tok.vocab_size < 1000
    assert tok.decode(tok.encode(UNSEEN)) == UNSEEN


def test_model_proto_and_pickle_restore_the_same_tokenizer(tok):
    again = Tokenizer.from_proto(tok.model_proto)
    restored = pickle.loads(pickle.dumps(tok))
    for t in (again, restored):
        assert t.vocab_size == tok.vocab_size
        assert t.encode(UNSEEN) == tok.encode(UNSEEN)


def test_foreign_model_with_other_special_ids_is_rejected():
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(  # sentencepiece's defaults: unk=0, bos=1, eos=2
        sentence_iterator=iter(CORPUS), model_writer=proto, vocab_size=100, minloglevel=2
    )
    with pytest.raises(DataError, match="special ids"):
        Tokenizer.from_proto(proto.getvalue())
    with pytest.raises(DataError, match="not a sentencepiece model"):
        Tokenizer.from_proto(b"garbage")


def test_cache_hit_loads_without_training(tmp_path, monkeypatch):
    calls = []
    real_train = tokmod._train
    monkeypatch.setattr(tokmod, "_train", lambda *a: calls.append(a) or real_train(*a))
    first = train_tokenizer(CORPUS, 350, "bpe", tmp_path, "fp")
    files = list((tmp_path / "tokenizers").glob("*.model"))
    assert len(calls) == 1 and len(files) == 1
    assert files[0].name == f"{tokmod.cache_key('fp', 350, 'bpe')}.model"
    assert files[0].read_bytes() == first.model_proto
    assert list((tmp_path / "tokenizers").iterdir()) == files  # no temp file left behind

    def no_corpus():
        raise AssertionError("the corpus must not be read on a cache hit")

    second = train_tokenizer(no_corpus, 350, "bpe", tmp_path, "fp")
    assert len(calls) == 1 and second.model_proto == first.model_proto
    for changed in [("fp2", 350, "bpe"), ("fp", 360, "bpe"), ("fp", 350, "unigram")]:
        train_tokenizer(lambda: iter(CORPUS), changed[1], changed[2], tmp_path, changed[0])
    assert len(calls) == 4 and len(list((tmp_path / "tokenizers").glob("*.model"))) == 4


def test_corrupt_cache_file_is_retrained(tmp_path):
    path = tmp_path / "tokenizers" / f"{tokmod.cache_key('fp', 350, 'bpe')}.model"
    path.parent.mkdir()
    path.write_bytes(b"half a file")
    tok = train_tokenizer(CORPUS, 350, "bpe", tmp_path, "fp")
    assert path.read_bytes() == tok.model_proto


@pytest.mark.parametrize("vocab_size", [0, 262, tokmod.MIN_VOCAB_SIZE - 1, 500.0, True])
def test_too_small_vocab_size_names_the_field(tmp_path, vocab_size):
    with pytest.raises(ConfigError, match=rf"data\.init_args\.vocab_size.*>= {tokmod.MIN_VOCAB_SIZE}"):
        train_tokenizer(CORPUS, vocab_size, "unigram", tmp_path, "fp")
    assert not (tmp_path / "tokenizers").exists()


def test_unknown_model_type_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.init_args\.tokenizer_type.*'wordpiece'.*unigram, bpe"):
        train_tokenizer(CORPUS, 400, "wordpiece", tmp_path, "fp")


def test_more_characters_than_the_vocab_holds_names_the_field(tmp_path):
    many_chars = ["".join(chr(0x4E00 + i + j) for j in range(10)) for i in range(0, 200, 10)]
    with pytest.raises(ConfigError, match=r"data\.init_args\.vocab_size = 300.*at least \d+ pieces"):
        train_tokenizer(many_chars, 300, "unigram", tmp_path, "cjk")


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "c"))
    assert tokmod.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("ATTNLAB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tokmod.default_cache_dir() == tmp_path / ".cache" / "attnlab"
