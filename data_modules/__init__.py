"""attnlab's data: LightningDataModules that all yield the one batch schema of `batch.py`.

The base of the two packages: nothing here imports attnlab, which builds on it. The names below
load on first use (PEP 562), so that reading `data_modules.errors` (every attnlab command does)
does not import torch and Lightning.
"""
import importlib as _importlib

_EXPORTS = {
    "Example": "data_modules.batch", "SpecialIds": "data_modules.batch", "collate": "data_modules.batch",
    "Tokenizer": "data_modules.tokenizer", "train_tokenizer": "data_modules.tokenizer",
    "TokenizedDataModule": "data_modules.base", "GrammarDataModule": "data_modules.grammar.task",
    "NumberWordsDataModule": "data_modules.number_words", "Multi30kDataModule": "data_modules.parallel",
    "ParallelTextDataModule": "data_modules.parallel", "SequenceTaskDataModule": "data_modules.sequence_tasks",
    "TextDataModule": "data_modules.text", "TextFolderDataModule": "data_modules.text",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'data_modules' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


def load_all() -> None:
    """Import every data module, so Lightning's CLI knows each by its short class name
    (`--data GrammarDataModule`) as it would after an eager import."""
    for module in sorted(set(_EXPORTS.values())):
        _importlib.import_module(module)
