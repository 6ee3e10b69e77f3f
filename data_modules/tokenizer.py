"""The sentencepiece tokenizer every data module shares, trained once per data set and cached.

Training settings make text round-trip exactly (identity normalisation, whitespace kept, byte
fallback for characters never seen), so references, generations and BLEU see the user's text
unchanged. Special ids are fixed to `SpecialIds()` so models and checkpoints can rely on them.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Sequence

import sentencepiece as spm

from data_modules.errors import ConfigError, DataError
from data_modules.batch import SpecialIds
from data_modules.files import atomic_write_bytes

log = logging.getLogger(__name__)

# Bump when training options change, so old cached models are not reused.
FORMAT_VERSION = 1
MODEL_TYPES = ("unigram", "bpe")
N_SPECIAL = 6  # pad, unk, bos, eos, sep, mask
N_BYTES = 256  # byte-fallback pieces <0x00> .. <0xFF>
# Specials + byte pieces + room for the corpus's own characters (sentencepiece needs every
# character as a piece at character_coverage=1.0) and a few subwords.
MIN_VOCAB_SIZE = 300
_VOCAB_FIELD = "data.init_args.vocab_size"
_TYPE_FIELD = "data.init_args.tokenizer_type"


def default_cache_dir() -> Path:
    """$ATTNLAB_CACHE if set, else ~/.cache/attnlab."""
    env = os.environ.get("ATTNLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnlab"


def check_tokenizer_args(vocab_size: int, model_type: str) -> None:
    """Raise ConfigError for a vocabulary size or model type sentencepiece cannot train."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(
            f"{_VOCAB_FIELD} = {vocab_size!r}: must be an integer >= {MIN_VOCAB_SIZE} "
            f"({N_SPECIAL} special pieces + {N_BYTES} byte-fallback pieces + room for the "
            f"corpus's characters and subwords); set {_VOCAB_FIELD} to at least {MIN_VOCAB_SIZE}"
        )
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{_TYPE_FIELD} = {model_type!r}: must be one of {', '.join(MODEL_TYPES)}")


class Tokenizer:
    """A sentencepiece model with attnlab's fixed special ids; `model_proto` embeds it in checkpoints."""

    def __init__(self, model_proto: bytes):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except Exception as e:  # sentencepiece raises RuntimeError / OSError on garbage
            raise DataError(f"not a sentencepiece model ({e}); delete it and let attnlab retrain it") from e
        self._check_specials()
        self._size = self._sp.get_piece_size()
        s = SpecialIds()
        self._dropped = frozenset((s.pad, s.bos, s.eos, s.sep, s.mask))

    @classmethod
    def from_proto(cls, model_proto: bytes) -> "Tokenizer":
        return cls(model_proto)

    def _check_specials(self) -> None:
        s, sp = SpecialIds(), self._sp
        found = {
            "pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id(),
            "sep": sp.piece_to_id("<sep>"), "mask": sp.piece_to_id("<mask>"),
        }
        expected = {k: getattr(s, k) for k in found}
        if found != expected:
            raise DataError(
                f"tokenizer special ids {found} differ from attnlab's {expected}; "
                "this model was not trained by attnlab's train_tokenizer: retrain it"
            )

    @property
    def model_proto(self) -> bytes:
        return self._proto

    @property
    def vocab_size(self) -> int:
        """The real number of pieces (may be below the size asked for, on a small corpus)."""
        return self._size

    @property
    def special_ids(self) -> SpecialIds:
        return SpecialIds()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)

    def _clean(self, ids) -> list[int]:
        """Drop framing ids, and ids past the vocabulary (a model may round its vocab up)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return [i for i in ids if 0 <= i < self._size and i not in self._dropped]

    def decode(self, ids) -> str:
        """Text of `ids` with pad/bos/eos/sep/mask dropped; it does not stop at eos (callers cut)."""
        return self._sp.decode(self._clean(ids))

    def decode_batch(self, batch) -> list[str]:
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return self._sp.decode([self._clean(ids) for ids in batch])

    def __getstate__(self) -> dict:
        return {"model_proto": self._proto}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"])

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self._size})"


def cache_key(fingerprint: str, vocab_size: int, model_type: str) -> str:
    blob = json.dumps([FORMAT_VERSION, fingerprint, vocab_size, model_type])
    return hashlib.sha256(blob.encode()).hexdigest()


def train_tokenizer(
    texts: Iterable[str] | Callable[[], Iterable[str]],
    vocab_size: int,
    model_type: str,
    cache_dir: str | Path,
    fingerprint: str,
) -> Tokenizer:
    """Load the cached tokenizer for (fingerprint, vocab_size, model_type), or train and cache it.

    `texts` may be a callable so the corpus is only materialised on a cache miss.
    """
    check_tokenizer_args(vocab_size, model_type)
    path = Path(cache_dir).expanduser() / "tokenizers" / f"{cache_key(fingerprint, vocab_size, model_type)}.model"
    tokenizer = None
    if path.is_file():
        try:
            tokenizer = Tokenizer.from_proto(path.read_bytes())
        except DataError as e:
            log.warning("cached tokenizer %s is unusable (%s); retraining it", path, e)
    if tokenizer is None:
        tokenizer = Tokenizer.from_proto(_train(texts() if callable(texts) else texts, vocab_size, model_type))
        atomic_write_bytes(path, tokenizer.model_proto)
    if tokenizer.vocab_size < vocab_size:
        # Not an error: the model is sized from the real vocabulary. Said, so a user who asked for
        # more (a vocabulary larger than the corpus allows) knows what was used.
        log.warning("%s = %d is more than this training text allows: the tokenizer has %d pieces, "
                    "and the model's vocabulary is sized to match", _VOCAB_FIELD, vocab_size, tokenizer.vocab_size)
    return tokenizer


class _StreamedTexts:
    """The training texts, remembering an error their stream raised: sentencepiece's C++ loop
    turns it into its own multi-line RuntimeError, and the user should see the original line
    (a bad byte in a streamed file, Ctrl-C)."""

    def __init__(self, texts: Iterable[str]):
        self.texts, self.error = texts, None

    def __iter__(self):
        try:
            for text in self.texts:
                if text:
                    yield text
        except BaseException as e:
            self.error = e
            raise


def _train(texts: Iterable[str], vocab_size: int, model_type: str) -> bytes:
    model = io.BytesIO()
    source = _StreamedTexts(texts)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(source),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=0, unk_id=1, bos_id=2, eos_id=3,
            control_symbols=["<sep>", "<mask>"],  # ids 4, 5; never matched inside user text
            byte_fallback=True,
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            hard_vocab_limit=False,
            max_sentence_length=1 << 16,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            num_threads=max(1, min(16, os.cpu_count() or 1)),
            minloglevel=2,
        )
    except BaseException as e:
        if source.error is not None:
            raise source.error from None
        if not isinstance(e, RuntimeError):
            raise
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if m:
            raise ConfigError(
                f"{_VOCAB_FIELD} = {vocab_size}: the training text has more distinct characters than "
                f"fit; sentencepiece needs at least {m.group(2)} pieces here: raise {_VOCAB_FIELD}"
            ) from e
        raise DataError(f"sentencepiece could not train a tokenizer on this data: {e}") from e
    return model.getvalue()
