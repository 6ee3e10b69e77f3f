"""Translation data from aligned line files: one sentence per line, line i of source ~ line i of target.

`ParallelTextDataModule` reads any such pair of files; `Multi30kDataModule` knows the Multi30k
layout (and downloads it only when asked). Every file problem is reported before any tokenizer
is trained.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

from data_modules.errors import ConfigError, DataError
from data_modules.base import Pairs, TokenizedDataModule
from data_modules.files import atomic_write_bytes, read_lines, require_file, sha256_files

log = logging.getLogger(__name__)

# (split, path of the source file, its argument name, path of the target file, its argument name)
FilePair = tuple[str, str, str, str, str]


class ParallelTextDataModule(TokenizedDataModule):
    """Aligned UTF-8 source/target line files (.gz accepted) for train, val and optionally test."""

    test_split_hint = "set data.init_args.test_source and data.init_args.test_target"
    missing_file_hint = ""

    def __init__(
        self,
        train_source: str,
        train_target: str,
        val_source: str,
        val_target: str,
        test_source: str | None = None,
        test_target: str | None = None,
        vocab_size: int = 1000,
        tokenizer_type: str = "unigram",
        **kwargs,  # batch_size, eval_batch_size, num_workers, cache_dir, max_eval_examples
    ):
        super().__init__(
            vocab_size=vocab_size, tokenizer_type=tokenizer_type, **kwargs,
        )
        if (test_source is None) != (test_target is None):
            raise ConfigError(
                "data.init_args.test_source and data.init_args.test_target must be set together "
                f"(got test_source={test_source!r}, test_target={test_target!r})"
            )
        self.train_source, self.train_target = train_source, train_target
        self.val_source, self.val_target = val_source, val_target
        self.test_source, self.test_target = test_source, test_target

    def _file_pairs(self) -> list[FilePair]:
        """The files of each split; Multi30k overrides this to resolve (and download) its layout."""
        pairs = [("train", self.train_source, self.train_target), ("val", self.val_source, self.val_target)]
        if self.test_source is not None:
            pairs.append(("test", self.test_source, self.test_target))
        arg = "data.init_args.{}_{}".format
        return [(split, src, arg(split, "source"), tgt, arg(split, "target")) for split, src, tgt in pairs]

    def _load_splits(self) -> dict[str, Pairs]:
        file_pairs = self._file_pairs()
        for _, src, src_arg, tgt, tgt_arg in file_pairs:  # every path first: fail before reading
            require_file(src, src_arg, self.missing_file_hint)
            require_file(tgt, tgt_arg, self.missing_file_hint)
        return {split: _read_pair(*fp) for split, *fp in file_pairs}

    def split_origin(self, split: str) -> str:
        pair = next((fp for fp in self._file_pairs() if fp[0] == split), None)
        return f"{pair[1]} + {pair[3]}" if pair else super().split_origin(split)

    def _fingerprint(self) -> str:
        train = next(fp for fp in self._file_pairs() if fp[0] == "train")
        return sha256_files([train[1], train[3]])


def _read_pair(src: str, src_arg: str, tgt: str, tgt_arg: str) -> Pairs:
    sources, targets = read_lines(src, src_arg), read_lines(tgt, tgt_arg)
    if len(sources) != len(targets):
        raise DataError(
            f"{src} ({src_arg}) has {len(sources)} lines but {tgt} ({tgt_arg}) has {len(targets)}; "
            "source and target files must be aligned line by line"
        )
    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()]
    if len(pairs) < len(sources):
        log.warning("%s / %s: dropped %d pairs with an empty side", src, tgt, len(sources) - len(pairs))
    return pairs


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"
MULTI30K_LANGS = ("en", "de", "fr", "cs")


class Multi30kDataModule(ParallelTextDataModule):
    """Multi30k (task 1): files train.{lang}.gz, val.{lang}.gz, {test_set}.{lang}.gz in data_dir."""

    def __init__(
        self,
        data_dir: str = "data/multi30k",
        source_lang: str = "en",
        target_lang: str = "de",
        download: bool = False,
        test_set: str = "test_2016_flickr",
        vocab_size: int = 8000,
        tokenizer_type: str = "unigram",
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        cache_dir: str | None = None,
        max_eval_examples: int | None = None,
        max_tokens: int | None = None,
    ):
        # Spelled out (not **kwargs): the positional file arguments below would otherwise make
        # jsonargparse expect ParallelTextDataModule's train_source etc. from the user.
        for field, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
            if lang not in MULTI30K_LANGS:
                raise ConfigError(
                    f"data.init_args.{field} = {lang!r}: Multi30k has {', '.join(MULTI30K_LANGS)}"
                )
        if source_lang == target_lang:
            raise ConfigError(
                f"data.init_args.source_lang and target_lang are both {source_lang!r}: pick two languages"
            )
        d = Path(data_dir)
        names = {s: (f"{p}.{source_lang}", f"{p}.{target_lang}")
                 for s, p in (("train", "train"), ("val", "val"), ("test", test_set))}
        super().__init__(
            *(str(d / f"{n}.gz") for s in ("train", "val", "test") for n in names[s]),
            vocab_size=vocab_size, tokenizer_type=tokenizer_type, batch_size=batch_size,
            eval_batch_size=eval_batch_size, num_workers=num_workers, cache_dir=cache_dir,
            max_eval_examples=max_eval_examples, max_tokens=max_tokens,
        )
        self.data_dir, self.download, self.test_set = d, download, test_set
        self.source_lang, self.target_lang = source_lang, target_lang
        self._names = names
        self.missing_file_hint = (
            f"Multi30k expects train.{source_lang}.gz, val.{source_lang}.gz, {test_set}.{source_lang}.gz "
            f"and the same for {target_lang} in data.init_args.data_dir ({d}); set data.init_args.download: "
            "true to fetch them, or point data.init_args.data_dir at the folder that holds them"
        )

    def _resolve(self, stem: str) -> str:
        """data_dir/stem.gz, else the uncompressed data_dir/stem, else download stem.gz if allowed."""
        gz, plain = self.data_dir / f"{stem}.gz", self.data_dir / stem
        if not gz.is_file() and plain.is_file():
            return str(plain)
        if not gz.is_file() and self.download:
            _download(MULTI30K_URL.format(name=gz.name), gz)
        return str(gz)

    def _file_pairs(self) -> list[FilePair]:
        arg = "data.init_args.data_dir"
        return [(s, self._resolve(src), arg, self._resolve(tgt), arg) for s, (src, tgt) in self._names.items()]


def _download(url: str, dest: Path) -> None:
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DataError(
            f"downloading {url} failed ({e}); download it by hand (or copy it from a machine with "
            f"network access) to {dest}, then run again"
        ) from e
    atomic_write_bytes(dest, data)
