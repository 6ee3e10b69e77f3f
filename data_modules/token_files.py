"""Token files: a plain-text split tokenized once into a flat array on disk, read back by chunk.

The format is nanoGPT's `train.bin`: the token ids of the whole split, lines joined by eos, as
little-endian uint16 (uint32 for vocabularies of more than 65,536 pieces) with nothing else in the file, so
`np.memmap(path, dtype)` or any other reader opens it. Writing streams the text in batches of
lines and reading asks the OS for one chunk at a time (`os.pread`), so memory stays flat
however large the corpus; the page cache, not the process, holds what was read. Files are
cached under the key of (tokenizer, data files), like the tokenizer itself.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from data_modules.batch import Example, SpecialIds
from data_modules.files import atomic_open
from data_modules.tokenizer import Tokenizer

FORMAT_VERSION = 1
LINES_PER_BATCH = 4096


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def token_file_path(cache_dir: Path, tokenizer: Tokenizer, data_key: str) -> Path:
    """Where the tokens of the data identified by `data_key` under `tokenizer` are cached."""
    proto = hashlib.sha256(tokenizer.model_proto).hexdigest()
    key = hashlib.sha256(json.dumps([FORMAT_VERSION, proto, data_key]).encode()).hexdigest()
    return cache_dir / "tokens" / f"{key}.{token_dtype(tokenizer.vocab_size).name}.bin"


def join_lines(encoded: Iterable[list[int]], after_text: bool = False) -> list[int]:
    """Encoded lines as one stream with eos between them (and before the first, `after_text`:
    the stream continues earlier lines), as the model reads plain text."""
    eos, stream = SpecialIds().eos, []
    for ids in encoded:
        if stream or after_text:
            stream.append(eos)
        stream.extend(ids)
    return stream


def write_token_file(path: Path, lines: Iterable[str], tokenizer: Tokenizer) -> int:
    """Tokenize the non-blank `lines` into `path` (eos between lines), atomically; the token count."""
    dtype, written = token_dtype(tokenizer.vocab_size), 0
    with atomic_open(path) as f:
        for batch in _batches(line for line in lines if line.strip()):
            stream = join_lines(tokenizer.encode_batch(batch), after_text=written > 0)
            np.asarray(stream, dtype=dtype).tofile(f)
            written += len(stream)
    return written


def _batches(lines: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == LINES_PER_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


class TokenChunks:
    """A split as non-overlapping chunks of `seq_len` tokens of a token file (the tail dropped);
    chunk i is the Example (first `prompt_len` tokens, the rest) with its decoded texts; `rows`
    keeps some chunks only (a slice, or TextDataModule's train_tokens subset).

    A map-style dataset, so the samplers (shuffle by seed and epoch, exact resume, one share per
    DDP rank) work on it unchanged; slicing gives a view (max_eval_examples). Pickles without its
    open file, so each DataLoader worker opens the file itself.
    """

    def __init__(self, path: Path, tokenizer: Tokenizer, seq_len: int, prompt_len: int = 0,
                 rows: Sequence[int] | None = None):
        self._fd: tuple[int, int] | None = None  # (pid, descriptor): reopened in a forked worker
        self.path, self.tokenizer, self.seq_len, self.prompt_len = Path(path), tokenizer, seq_len, prompt_len
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.n_tokens = self.path.stat().st_size // self.dtype.itemsize
        self.rows = range(self.n_tokens // seq_len) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return TokenChunks(self.path, self.tokenizer, self.seq_len, self.prompt_len, self.rows[i])
        ids = self.chunk(self.rows[i])
        p = self.prompt_len
        return Example(ids[:p], ids[p:], chunk_text(ids[:p], self.tokenizer), chunk_text(ids[p:], self.tokenizer))

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    def chunk(self, row: int) -> list[int]:
        """The token ids of chunk `row` of the file, read from disk."""
        size = self.seq_len * self.dtype.itemsize
        data = os.pread(self._descriptor(), size, row * size)
        return np.frombuffer(data, dtype=self.dtype).astype(np.int64).tolist()

    def lengths(self) -> set[tuple[int, int]]:
        """The distinct (source, target) lengths of the chunks: one pair, read without decoding."""
        return {(self.prompt_len, self.seq_len - self.prompt_len)} if len(self) else set()

    def _descriptor(self) -> int:
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY))
        return self._fd[1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}

    def __del__(self) -> None:
        if self._fd is not None and self._fd[0] == os.getpid():
            os.close(self._fd[1])


def chunk_text(ids: list[int], tokenizer: Tokenizer) -> str:
    """Decoded text of a chunk, with a newline where an eos joined two lines."""
    eos, lines, start = SpecialIds().eos, [], 0
    for i, t in enumerate(ids + [eos]):
        if t == eos:
            lines.append(ids[start:i])
            start = i + 1
    return "\n".join(tokenizer.decode_batch(lines))
