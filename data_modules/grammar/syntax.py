"""Sentence trees of the synthetic grammar and how each is written in English and in German.

One tree, two realisations, so every English sentence has exactly one German translation. What
makes the task translation-like rather than word-for-word:

- case and gender agreement: articles, adjective endings (weak / mixed / strong) and relative
  pronouns follow the noun's gender, number and case, and the case follows the verb
  ("the man helps the dog" -> "dem Hund": helfen takes the dative);
- word order: German main clauses put the finite verb second (a fronted adverb or clause moves
  the subject after it), participles and infinitives go to the end, and subordinate and relative
  clauses put the finite verb last, so a verb can move past a whole object phrase;
- fusion and agreement over distance: "in dem" -> "im", "a"/"an", number agreement of a verb
  with a subject that a relative clause separates from it, "when" -> "als" in the past.
"""
from __future__ import annotations

from dataclasses import dataclass

from data_modules.grammar.lexicon import (
    AUXILIARIES, CONJUNCTIONS, CONTRACTIONS, MODALS, Adjective, Adverb, Determiner, Noun, Preposition, Verb,
)

TENSES = ("present", "past", "perfect", "can", "must", "want")

_ARTICLE = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
            "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
            "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
_RELATIVE = {**_ARTICLE, "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "denen"}}
_DER_WORD = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
             "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
             "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
_EIN_WORD = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"},
             "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
             "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
# Adjective endings after a der-word (weak), an ein-word (mixed), no determiner (strong, plural here).
_ADJECTIVE = {
    "weak": {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
             "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "mixed": {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
              "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "strong": {"nom": {"pl": "e"}, "acc": {"pl": "e"}, "dat": {"pl": "en"}},
}
_DECLENSION = {"def": "weak", "der": "weak", "ein": "mixed", "bare": "strong"}


@dataclass(frozen=True)
class NounPhrase:
    noun: Noun
    determiner: Determiner
    plural: bool = False
    adjectives: tuple[Adjective, ...] = ()
    relative: Clause | None = None  # a relative clause whose gap is this noun phrase

    @property
    def slot(self) -> str:
        """The column of the German ending tables: the gender, or pl."""
        return "pl" if self.plural else self.noun.gender


@dataclass(frozen=True)
class PrepPhrase:
    preposition: Preposition
    object: NounPhrase


@dataclass(frozen=True)
class Clause:
    """`subject` is None in a relative clause whose gap is the subject (`gap` says which role
    the antecedent fills: nom, acc or dat). `complement` goes with the that / whether verbs."""

    verb: Verb
    tense: str = "present"
    subject: NounPhrase | None = None
    dative: NounPhrase | None = None
    accusative: NounPhrase | None = None
    negated: bool = False
    prep: PrepPhrase | None = None
    complement: Clause | None = None
    gap: str | None = None


@dataclass(frozen=True)
class Sentence:
    """A main clause, optionally with a fronted adverb or an adverbial clause (before or after it)."""

    main: Clause
    adverb: Adverb | None = None
    conjunction: str | None = None  # an English key of CONJUNCTIONS
    adverbial: Clause | None = None
    adverbial_first: bool = False


# ---- English ---------------------------------------------------------------------------------

def english_np(np: NounPhrase) -> list[str]:
    det = np.determiner.en_plural if np.plural else np.determiner.en
    adjectives = [a.en for a in np.adjectives]
    noun = np.noun.en_plural if np.plural else np.noun.en
    if det == "a" and (adjectives[0] if adjectives else noun)[0] in "aeiou":
        det = "an"
    words = ([det] if det else []) + adjectives + [noun]
    if np.relative is not None:
        words += english_clause(np.relative, antecedent=np)
    return words


def english_verb(verb: Verb, tense: str, plural: bool, negated: bool) -> list[str]:
    base, third, past, participle = verb.en
    do = "do" if plural else "does"
    if tense == "present":
        return [do, "not", base] if negated else [base if plural else third]
    if tense == "past":
        return ["did", "not", base] if negated else [past]
    if tense == "perfect":
        return ["have" if plural else "has"] + (["not"] if negated else []) + [participle]
    if tense == "can":
        return ["cannot" if negated else "can", base]
    if tense == "must":
        return ["must", base]  # never negated: "must not" is "darf nicht", not "muss nicht"
    want = "want" if plural else "wants"
    return ([do, "not", "want"] if negated else [want]) + ["to", base]


def english_clause(clause: Clause, antecedent: NounPhrase | None = None) -> list[str]:
    """Declarative order; a relative clause starts with "that" and leaves its gap empty."""
    words = ["that"] if clause.gap else []
    subject_plural = (antecedent if clause.gap == "nom" else clause.subject).plural
    if clause.gap != "nom":
        words += english_np(clause.subject)
    words += english_verb(clause.verb, clause.tense, subject_plural, clause.negated)
    if clause.dative is not None and clause.gap != "dat":
        words += english_np(clause.dative)
    if clause.accusative is not None and clause.gap != "acc":
        words += english_np(clause.accusative)
    if clause.prep is not None:
        words += [clause.prep.preposition.en, *english_np(clause.prep.object)]
    if clause.complement is not None:
        words += ["that" if clause.verb.frame == "that" else "whether", *english_clause(clause.complement)]
    return words


def english(sentence: Sentence) -> str:
    main = english_clause(sentence.main)
    if sentence.adverb is not None:
        words = [sentence.adverb.en, *main]
    elif sentence.adverbial is not None:
        sub = [sentence.conjunction, *english_clause(sentence.adverbial)]
        words = [*sub, ",", *main] if sentence.adverbial_first else [*main, *sub]
    else:
        words = main
    return written(words)


# ---- German ----------------------------------------------------------------------------------

def _ending(stem: str, ending: str) -> str:
    """müde + e = müde, leise + en = leisen: an e-final stem does not double the e."""
    return stem + (ending[1:] if stem.endswith("e") and ending.startswith("e") else ending)


def german_np(np: NounPhrase, case: str) -> list[str]:
    det, slot = np.determiner, np.slot
    if det.kind == "def":
        article = _ARTICLE[case][slot]
    elif det.kind == "der":
        article = det.de + _DER_WORD[case][slot]
    elif det.kind == "ein":
        article = det.de + _EIN_WORD[case][slot]
    else:
        article = ""
    declension = _ADJECTIVE[_DECLENSION[det.kind]][case]
    words = ([article] if article else []) + [_ending(a.de, declension[slot]) for a in np.adjectives]
    words.append(np.noun.german(np.plural, case))
    if np.relative is not None:
        words += [",", *german_clause(np.relative, "relative", antecedent=np), ","]
    return words


def german_pp(pp: PrepPhrase) -> list[str]:
    words = german_np(pp.object, pp.preposition.case)
    fused = CONTRACTIONS.get((pp.preposition.de, words[0])) if pp.object.determiner.kind == "def" else None
    return [fused, *words[1:]] if fused else [pp.preposition.de, *words]


def german_verb(verb: Verb, tense: str, plural: bool) -> tuple[str, list[str]]:
    """(finite verb, the non-finite verbs that go to the end of the clause)."""
    infinitive, third, past, participle, auxiliary = verb.de
    if tense == "present":
        return (infinitive if plural else third), []
    if tense == "past":
        return (verb.de_past_plural if plural else past), []
    if tense == "perfect":
        return AUXILIARIES[auxiliary][plural], [participle]
    return MODALS[tense][2 if plural else 1], [infinitive]


def german_clause(clause: Clause, order: str, antecedent: NounPhrase | None = None,
                  front: list[str] | None = None) -> list[str]:
    """`order`: main (verb second, after `front` if given, else after the subject), subordinate
    or relative (verb last)."""
    subject_np = antecedent if clause.gap == "nom" else clause.subject
    finite, rest = german_verb(clause.verb, clause.tense, subject_np.plural)
    subject = [] if clause.gap == "nom" else german_np(clause.subject, "nom")
    middle = []
    if clause.dative is not None and clause.gap != "dat":
        middle += german_np(clause.dative, "dat")
    if clause.accusative is not None and clause.gap != "acc":
        middle += german_np(clause.accusative, "acc")
    if clause.negated:
        middle.append("nicht")
    if clause.prep is not None:
        middle += german_pp(clause.prep)
    after = []
    if clause.complement is not None:
        after = [",", "dass" if clause.verb.frame == "that" else "ob", *german_clause(clause.complement, "subordinate")]
    if order == "main":
        if front:
            return [*front, finite, *subject, *middle, *rest, *after]
        return [*subject, finite, *middle, *rest, *after]
    head = [_RELATIVE[clause.gap][antecedent.slot]] if order == "relative" else []
    return [*head, *subject, *middle, *rest, finite, *after]


def german_conjunction(conjunction: str, clause: Clause) -> str:
    if conjunction == "when" and clause.tense == "past":
        return "als"  # one event in the past
    return CONJUNCTIONS[conjunction]


def german(sentence: Sentence) -> str:
    if sentence.adverb is not None:
        words = german_clause(sentence.main, "main", front=[sentence.adverb.de])
    elif sentence.adverbial is not None:
        sub = [german_conjunction(sentence.conjunction, sentence.adverbial),
               *german_clause(sentence.adverbial, "subordinate")]
        if sentence.adverbial_first:
            words = german_clause(sentence.main, "main", front=[*sub, ","])
        else:
            words = [*german_clause(sentence.main, "main"), ",", *sub]
    else:
        words = german_clause(sentence.main, "main")
    return written(words)


def written(words: list[str]) -> str:
    """Words to a sentence: commas attached, none doubled or final, capital first letter, full stop."""
    out: list[str] = []
    for word in words:
        if word == "," and (not out or out[-1] == ","):
            continue
        out.append(word)
    while out and out[-1] == ",":
        out.pop()
    text = " ".join(out).replace(" ,", ",")
    return text[:1].upper() + text[1:] + "."
