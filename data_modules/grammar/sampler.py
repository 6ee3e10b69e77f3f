"""Random sentence trees of the synthetic grammar, drawn from a seeded `random.Random`.

The draws keep every English sentence unambiguous, so it has one German translation: a
clause-level prepositional phrase never follows an object that carries a relative clause (it
could belong to either), relative clauses hold no complement or adverbial clause, and a
negated clause has no indefinite noun phrase ("does not see a dog" is "sieht keinen Hund",
and "no dog does not sleep" is a double negation).
"""
from __future__ import annotations

import random

from data_modules.grammar.lexicon import ADJECTIVES, ADVERBS, CONJUNCTIONS, DETERMINERS, NOUNS, PREPOSITIONS, VERBS
from data_modules.grammar.syntax import TENSES, Clause, NounPhrase, PrepPhrase, Sentence

ANIMATE = tuple(n for n in NOUNS if n.animate)
FRAMES = {frame: tuple(v for v in VERBS if v.frame == frame) for frame in ("intr", "acc", "dat", "ditr", "that", "whether")}
# How often each verb frame heads a main clause; clauses inside clauses draw from the first four.
MAIN_FRAMES = {"intr": 0.24, "acc": 0.34, "dat": 0.1, "ditr": 0.12, "that": 0.15, "whether": 0.05}
INNER_FRAMES = {"intr": 0.35, "acc": 0.4, "dat": 0.12, "ditr": 0.13}
# What a negated clause's noun phrases may start with: no "a" (kein) and no "no" (a double negation).
DEFINITE = tuple(d for d in DETERMINERS if d.kind in ("def", "der") or d.en in ("my", "his", "her", "our"))


class GrammarSampler:
    """`p_*` are the chances of each optional construction; `max_relatives` caps them per sentence."""

    def __init__(self, rng: random.Random, p_relative: float = 0.12, p_prep: float = 0.25, p_negated: float = 0.12,
                 p_adverb: float = 0.15, p_adverbial: float = 0.15, max_relatives: int = 2):
        self.rng = rng
        self.p_relative, self.p_prep, self.p_negated = p_relative, p_prep, p_negated
        self.p_adverb, self.p_adverbial, self.max_relatives = p_adverb, p_adverbial, max_relatives
        self._relatives = 0

    def sentence(self) -> Sentence:
        self._relatives = 0
        rng = self.rng
        main = self.clause(MAIN_FRAMES)
        r = rng.random()
        if r < self.p_adverb:
            adverbs = [a for a in ADVERBS if main.tense in a.tenses]
            return Sentence(main, adverb=rng.choice(adverbs))
        if r < self.p_adverb + self.p_adverbial:
            conjunction = rng.choice(sorted(CONJUNCTIONS))
            return Sentence(main, conjunction=conjunction, adverbial=self.clause(INNER_FRAMES),
                            adverbial_first=rng.random() < 0.5)
        return Sentence(main)

    def _frame(self, weights: dict[str, float]) -> str:
        frames = list(weights)
        return self.rng.choices(frames, weights=[weights[f] for f in frames])[0]

    def clause(self, frames: dict[str, float], gap: str | None = None, antecedent_animate: bool = True) -> Clause:
        """A clause; with `gap`, a relative clause whose antecedent fills that role."""
        rng = self.rng
        if gap == "nom":
            frame = self._frame(INNER_FRAMES)
        elif gap == "acc":
            frame = rng.choice(("acc", "ditr") if not antecedent_animate else ("acc",))
        elif gap == "dat":
            frame = "dat"
        else:
            frame = self._frame(frames)
        verb = rng.choice(FRAMES[frame])
        tense = rng.choice(TENSES)
        negated = tense != "must" and rng.random() < self.p_negated
        inner = gap is not None
        subject = None if gap == "nom" else self.noun_phrase(ANIMATE, relative=not inner, definite=negated)
        dative = accusative = None
        if frame in ("dat", "ditr") and gap != "dat":
            # A relative clause on a ditransitive's first object would read as the second object's.
            dative = self.noun_phrase(ANIMATE, relative=not inner and frame == "dat", definite=negated)
        if frame in ("acc", "ditr") and gap != "acc":
            pool = NOUNS if frame == "acc" else tuple(n for n in NOUNS if not n.animate)
            accusative = self.noun_phrase(pool, relative=not inner, definite=negated)
        last_object = accusative or dative
        prep = None
        if frame not in ("that", "whether") and rng.random() < self.p_prep and not (last_object and last_object.relative):
            prep = PrepPhrase(rng.choice(PREPOSITIONS), self.noun_phrase(NOUNS, relative=False, definite=negated))
        complement = self.clause(INNER_FRAMES) if frame in ("that", "whether") else None
        return Clause(verb, tense, subject, dative, accusative, negated, prep, complement, gap)

    def noun_phrase(self, nouns, relative: bool, definite: bool = False) -> NounPhrase:
        rng = self.rng
        noun = rng.choice(nouns)
        determiner = rng.choice(DEFINITE if definite else DETERMINERS)
        if determiner.kind == "bare":
            plural = True
        elif determiner.en_plural is None:
            plural = False
        else:
            plural = rng.random() < 0.3
        n_adjectives = rng.choices((0, 1, 2), weights=(0.55, 0.35, 0.1))[0]
        adjectives = tuple(rng.sample(ADJECTIVES, n_adjectives))
        clause = None
        if relative and self._relatives < self.max_relatives and rng.random() < self.p_relative:
            self._relatives += 1
            gaps = ["nom", "acc", "dat"] if noun.animate else ["acc"]
            clause = self.clause(INNER_FRAMES, gap=rng.choice(gaps), antecedent_animate=noun.animate)
        return NounPhrase(noun, determiner, plural, adjectives, clause)
