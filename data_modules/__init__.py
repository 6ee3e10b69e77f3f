"""attnlab's data: LightningDataModules that all yield the one batch schema of `batch.py`."""
from data_modules.batch import Example, SpecialIds, collate
from data_modules.tokenizer import Tokenizer, train_tokenizer
from data_modules.base import TokenizedDataModule
from data_modules.grammar.task import GrammarDataModule
from data_modules.number_words import NumberWordsDataModule
from data_modules.parallel import Multi30kDataModule, ParallelTextDataModule
from data_modules.sequence_tasks import SequenceTaskDataModule
from data_modules.text import TextDataModule, TextFolderDataModule

__all__ = [
    "SpecialIds", "Example", "collate", "Tokenizer", "train_tokenizer", "TokenizedDataModule",
    "GrammarDataModule", "NumberWordsDataModule", "ParallelTextDataModule", "Multi30kDataModule", "TextDataModule",
    "TextFolderDataModule", "SequenceTaskDataModule",
]
