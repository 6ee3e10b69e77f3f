"""A synthetic English -> German grammar: the embedded task that real translation skills separate."""
from data_modules.grammar.syntax import Clause, NounPhrase, PrepPhrase, Sentence, english, german
from data_modules.grammar.sampler import GrammarSampler

__all__ = ["Clause", "GrammarSampler", "NounPhrase", "PrepPhrase", "Sentence", "english", "german"]
