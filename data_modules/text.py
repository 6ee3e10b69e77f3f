"""Plain-text language-modelling data: a token stream cut into fixed-length chunks.

Each non-empty line is encoded, lines are joined with eos, and the stream is cut into
non-overlapping chunks of `seq_len` pieces (the tail is dropped). With `prompt_len > 0` a chunk
becomes prompt (source) + continuation (target), so the conditional families train on it too.
The text is read as a stream and its tokens live on disk (token_files.py), so a corpus larger
than memory trains with flat memory.

`train_tokens` trains on a subset of unique data (a data-constrained comparison): the training
chunks come in one fixed order spread over the whole split (`subset_order`), and a subset is its
first ceil(train_tokens / seq_len) chunks, so smaller subsets are nested in larger ones and every
size draws on the whole split (a corpus in time order would otherwise give small sizes only its
oldest text). The tokenizer and the token files stay those of the full split, whatever the size.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

from data_modules.errors import ConfigError, DataError
from data_modules.base import TokenizedDataModule
from data_modules.files import iter_lines, require_file, sha256_files
from data_modules.token_files import TokenChunks, token_file_path, write_token_file


class TextDataModule(TokenizedDataModule):
    """UTF-8 text files (.gz accepted); the tokenizer learns from the lines of the train files."""

    test_split_hint = "set data.init_args.test_files"

    def __init__(
        self,
        train_files: list[str],
        val_files: list[str],
        test_files: list[str] | None = None,
        seq_len: int = 128,
        prompt_len: int = 0,
        vocab_size: int = 1000,
        tokenizer_type: str = "unigram",
        train_tokens: int | None = None,
        **kwargs,  # batch_size, eval_batch_size, num_workers, cache_dir, max_eval_examples
    ):
        """`train_tokens`: train on a nested subset of the training chunks holding that many tokens
        (rounded up to whole chunks; see the module docstring); validation and test stay whole."""
        super().__init__(
            vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs,
        )
        for name, files in (("train_files", train_files), ("val_files", val_files), ("test_files", test_files)):
            if files is None and name == "test_files":
                continue
            if isinstance(files, str) or not files:
                raise ConfigError(f"data.init_args.{name} = {files!r}: must be a non-empty list of file paths")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"data.init_args.seq_len = {seq_len!r}: must be an integer >= 1")
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 0 <= prompt_len < seq_len:
            raise ConfigError(
                f"data.init_args.prompt_len = {prompt_len!r} with data.init_args.seq_len = {seq_len}: "
                "prompt_len must be >= 0 and < seq_len, so every chunk keeps a continuation to predict"
            )
        if train_tokens is not None and (isinstance(train_tokens, bool) or not isinstance(train_tokens, int)
                                         or train_tokens < 1):
            raise ConfigError(f"data.init_args.train_tokens = {train_tokens!r}: must be a positive integer (the "
                              "unique training tokens to keep), or null to train on the whole training split")
        self.train_tokens = train_tokens
        self.files = {"train": list(train_files), "val": list(val_files)}
        if test_files is not None:
            self.files["test"] = list(test_files)
        self.seq_len, self.prompt_len = seq_len, prompt_len
        self._hashes: dict[str, str] = {}

    def _prepare(self) -> None:
        """Train (or load) the tokenizer on the streamed train lines, then tokenize each split
        once into a cached token file, read back chunk by chunk (data_modules/token_files.py)."""
        if self._examples is not None:
            return
        named = {split: [(f"data.init_args.{split}_files[{i}]", path) for i, path in enumerate(paths)]
                 for split, paths in self.files.items()}
        for arg, path in (item for files in named.values() for item in files):  # every path first: fail before reading
            require_file(path, arg)
        tokenizer = self._trained_tokenizer(lambda: (line for line in self._lines(named["train"]) if line.strip()))
        chunks = {}
        for split, files in named.items():
            path = token_file_path(self._cache_root(), tokenizer, self._files_hash(split))
            if not path.is_file():
                write_token_file(path, self._lines(files), tokenizer)
            chunks[split] = TokenChunks(path, tokenizer, self.seq_len, self.prompt_len)
            if not len(chunks[split]):
                raise DataError(
                    f"data.init_args.{split}_files hold {chunks[split].n_tokens} tokens, fewer than one chunk of "
                    f"data.init_args.seq_len = {self.seq_len}: add text or lower seq_len"
                )
        if self.train_tokens is not None:
            chunks["train"] = self._train_subset(chunks["train"])
        self._finish(tokenizer, chunks)

    def _train_subset(self, chunks: TokenChunks) -> TokenChunks:
        """The first ceil(train_tokens / seq_len) chunks in `subset_order`: at least train_tokens
        tokens, less than one chunk more."""
        held = len(chunks) * self.seq_len
        if self.train_tokens > held:
            raise ConfigError(
                f"data.init_args.train_tokens = {self.train_tokens:,} is more than the training split holds: "
                f"{held:,} tokens in {len(chunks):,} chunks of seq_len {self.seq_len} ({self.split_origin('train')}); "
                f"lower it to at most {held}, or set it to null to train on the whole split"
            )
        order = subset_order(len(chunks))[: math.ceil(self.train_tokens / self.seq_len)]
        return TokenChunks(chunks.path, chunks.tokenizer, chunks.seq_len, chunks.prompt_len, sorted(order))

    @staticmethod
    def _lines(files: list[tuple[str, str]]):
        for arg, path in files:
            yield from iter_lines(path, arg)

    def _files_hash(self, split: str) -> str:
        """The split's files' hash, computed once (the train files' is also the tokenizer's key)."""
        if split not in self._hashes:
            self._hashes[split] = sha256_files(self.files[split])
        return self._hashes[split]

    def split_origin(self, split: str) -> str:
        files = self.files.get(split)
        return f"{', '.join(files)} (data.init_args.{split}_files)" if files else super().split_origin(split)

    def _fingerprint(self) -> str:
        return self._files_hash("train")


SPLIT_FILES = {"train": "train.txt", "val": "val.txt", "test": "test.txt"}


class TextFolderDataModule(TextDataModule):
    """A plain-text corpus kept as a folder: data_dir/train.txt, val.txt and, if present,
    test.txt (each may be .gz), e.g. --data.init_args.data_dir ../shared/data/us_addresses."""

    test_split_hint = "add test.txt (or test.txt.gz) to data.init_args.data_dir"

    def __init__(self, data_dir: str, seq_len: int = 128, prompt_len: int = 0, vocab_size: int = 1000,
                 tokenizer_type: str = "unigram", train_tokens: int | None = None, **kwargs):
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            raise DataError(f"data.init_args.data_dir: {folder} {what}; point it at a folder holding "
                            f"{', '.join(SPLIT_FILES.values())} (one paragraph or line of text per line)")
        found = {split: _split_file(folder, name) for split, name in SPLIT_FILES.items()}
        missing = [SPLIT_FILES[s] for s in ("train", "val") if found[s] is None]
        if missing:
            raise DataError(f"data.init_args.data_dir: {folder} has no {' or '.join(missing)} (nor .gz); a text "
                            f"corpus folder holds {', '.join(SPLIT_FILES.values())} (test optional)")
        super().__init__(train_files=[str(found["train"])], val_files=[str(found["val"])],
                         test_files=[str(found["test"])] if found["test"] else None, seq_len=seq_len,
                         prompt_len=prompt_len, vocab_size=vocab_size, tokenizer_type=tokenizer_type,
                         train_tokens=train_tokens, **kwargs)
        self.data_dir = folder


def subset_order(n_chunks: int) -> list[int]:
    """Chunk indices 0 .. n_chunks - 1 in a fixed pseudo-random order (by a hash of each index: the
    same on every machine, for every seed and family), so any prefix is spread over the split."""
    return sorted(range(n_chunks), key=lambda i: hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).digest())


def _split_file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None
