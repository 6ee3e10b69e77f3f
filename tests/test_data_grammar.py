"""The synthetic English -> German grammar: hand-checked translations of every construction,
determinism from the seed, the stated sizes, and one translation per English sentence."""
from __future__ import annotations

import random

import pytest

from attnlab.errors import ConfigError
from data_modules import GrammarDataModule
from data_modules.grammar import Clause, GrammarSampler, NounPhrase, PrepPhrase, Sentence, english, german
from data_modules.grammar import lexicon
from data_modules.grammar.lexicon import adjective, adverb, noun, preposition, verb
from data_modules.grammar.task import grammar_pairs


def np_(word: str, det: str = "the", plural: bool = False, adjectives: tuple[str, ...] = (), relative=None):
    return NounPhrase(noun(word), lexicon.determiner(det), plural, tuple(adjective(a) for a in adjectives), relative)


def pp(prep: str, *args, **kwargs):
    return PrepPhrase(preposition(prep), np_(*args, **kwargs))


# (tree, English, German): German checked by hand against a grammar of German.
CASES = {
    "transitive, accusative": (
        Sentence(Clause(verb("see"), subject=np_("dog"), accusative=np_("man"))),
        "The dog sees the man.", "Der Hund sieht den Mann."),
    "verb governs the dative": (
        Sentence(Clause(verb("help"), subject=np_("man"), dative=np_("dog"))),
        "The man helps the dog.", "Der Mann hilft dem Hund."),
    "ditransitive, a / an": (
        Sentence(Clause(verb("give"), subject=np_("woman"), dative=np_("child"), accusative=np_("apple", "a"))),
        "The woman gives the child an apple.", "Die Frau gibt dem Kind einen Apfel."),
    "mixed adjective endings after ein-words": (
        Sentence(Clause(verb("see"), subject=np_("man", "a", adjectives=("old",)),
                        accusative=np_("house", "my", adjectives=("small",)))),
        "An old man sees my small house.", "Ein alter Mann sieht mein kleines Haus."),
    "weak endings, dative plural -n": (
        Sentence(Clause(verb("help"), tense="past", subject=np_("woman", adjectives=("young",)),
                        dative=np_("dog", plural=True, adjectives=("tired",)))),
        "The young woman helped the tired dogs.", "Die junge Frau half den müden Hunden."),
    "strong endings without a determiner": (
        Sentence(Clause(verb("trust"), subject=np_("dog", "", plural=True, adjectives=("old",)),
                        dative=np_("cat", "", plural=True, adjectives=("quiet",)))),
        "Old dogs trust quiet cats.", "Alte Hunde vertrauen leisen Katzen."),
    "this / these, no (plural)": (
        Sentence(Clause(verb("love"), subject=np_("child", "this", plural=True), accusative=np_("car", "no", plural=True))),
        "These children love no cars.", "Diese Kinder lieben keine Autos."),
    "perfect with haben: participle last": (
        Sentence(Clause(verb("see"), tense="perfect", subject=np_("dog"), accusative=np_("cat"))),
        "The dog has seen the cat.", "Der Hund hat die Katze gesehen."),
    "perfect with sein, plural": (
        Sentence(Clause(verb("run"), tense="perfect", subject=np_("child", plural=True))),
        "The children have run.", "Die Kinder sind gelaufen."),
    "modal: infinitive last": (
        Sentence(Clause(verb("see"), tense="want", subject=np_("dog"), accusative=np_("cat", "every"))),
        "The dog wants to see every cat.", "Der Hund will jede Katze sehen."),
    "negation: do-support against nicht": (
        Sentence(Clause(verb("see"), subject=np_("dog"), accusative=np_("cat"), negated=True)),
        "The dog does not see the cat.", "Der Hund sieht die Katze nicht."),
    "negated modal": (
        Sentence(Clause(verb("sleep"), tense="can", subject=np_("dog", plural=True), negated=True)),
        "The dogs cannot sleep.", "Die Hunde können nicht schlafen."),
    "in + dem is im": (
        Sentence(Clause(verb("sleep"), subject=np_("dog"), prep=pp("in", "house"))),
        "The dog sleeps in the house.", "Der Hund schläft im Haus."),
    "zur: zu + der": (
        Sentence(Clause(verb("come"), tense="past", subject=np_("girl", "her"), prep=pp("to", "school"))),
        "Her girl came to the school.", "Ihr Mädchen kam zur Schule."),
    "accusative preposition": (
        Sentence(Clause(verb("work"), subject=np_("man"), prep=pp("for", "king", "a"))),
        "The man works for a king.", "Der Mann arbeitet für einen König."),
    "dative plural of an -s plural takes no -n": (
        Sentence(Clause(verb("play"), subject=np_("man"), prep=pp("with", "car", plural=True))),
        "The man plays with the cars.", "Der Mann spielt mit den Autos."),
    "fronted adverb: verb second, subject after it": (
        Sentence(Clause(verb("see"), tense="past", subject=np_("dog"), accusative=np_("cat")), adverb=adverb("yesterday")),
        "Yesterday the dog saw the cat.", "Gestern sah der Hund die Katze."),
    "that-clause: verb last": (
        Sentence(Clause(verb("say"), subject=np_("woman"),
                        complement=Clause(verb("see"), subject=np_("dog"), accusative=np_("man")))),
        "The woman says that the dog sees the man.", "Die Frau sagt, dass der Hund den Mann sieht."),
    "that-clause after the participle; perfect inside": (
        Sentence(Clause(verb("know", "that"), tense="perfect", subject=np_("man"),
                        complement=Clause(verb("sleep"), tense="perfect", subject=np_("child")))),
        "The man has known that the child has slept.", "Der Mann hat gewusst, dass das Kind geschlafen hat."),
    "whether-clause with a modal": (
        Sentence(Clause(verb("ask"), subject=np_("man"), complement=Clause(verb("swim"), tense="can", subject=np_("cat")))),
        "The man asks whether the cat can swim.", "Der Mann fragt, ob die Katze schwimmen kann."),
    "subject relative clause": (
        Sentence(Clause(verb("sleep"), subject=np_("dog", relative=Clause(verb("see"), accusative=np_("man"), gap="nom")))),
        "The dog that sees the man sleeps.", "Der Hund, der den Mann sieht, schläft."),
    "object relative clause": (
        Sentence(Clause(verb("sleep"), subject=np_("dog", relative=Clause(verb("see"), subject=np_("man"), gap="acc")))),
        "The dog that the man sees sleeps.", "Der Hund, den der Mann sieht, schläft."),
    "dative relative pronoun, plural agreement across the clause": (
        Sentence(Clause(verb("laugh"), subject=np_("child", plural=True,
                                                   relative=Clause(verb("help"), subject=np_("woman", plural=True), gap="dat")))),
        "The children that the women help laugh.", "Die Kinder, denen die Frauen helfen, lachen."),
    "relative clause on the object, before the participle": (
        Sentence(Clause(verb("find"), tense="perfect", subject=np_("girl", "a"),
                        accusative=np_("book", relative=Clause(verb("write"), tense="past", subject=np_("uncle", "her"),
                                                               gap="acc")))),
        "A girl has found the book that her uncle wrote.", "Ein Mädchen hat das Buch, das ihr Onkel schrieb, gefunden."),
    "fronted adverbial clause: the main verb comes first": (
        Sentence(Clause(verb("sleep"), subject=np_("dog")), conjunction="because",
                 adverbial=Clause(verb("sing"), subject=np_("man")), adverbial_first=True),
        "Because the man sings, the dog sleeps.", "Weil der Mann singt, schläft der Hund."),
    "when in the past is als": (
        Sentence(Clause(verb("sleep"), tense="past", subject=np_("dog")), conjunction="when",
                 adverbial=Clause(verb("sing"), tense="past", subject=np_("man"))),
        "The dog slept when the man sang.", "Der Hund schlief, als der Mann sang."),
    "when otherwise is wenn; negated perfect in a subordinate clause": (
        Sentence(Clause(verb("cry"), subject=np_("baby")), conjunction="when",
                 adverbial=Clause(verb("eat"), tense="perfect", subject=np_("mother", "his"), accusative=np_("cake"),
                                  negated=True)),
        "The baby cries when his mother has not eaten the cake.",
        "Das Baby weint, wenn seine Mutter den Kuchen nicht gegessen hat."),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_construction_translates_as_checked_by_hand(name):
    tree, source, target = CASES[name]
    assert english(tree) == source
    assert german(tree) == target


def test_the_data_is_deterministic_in_its_seed_and_has_the_stated_size():
    counts = {"train": 3000, "val": 200, "test": 200}
    first, again, other = (grammar_pairs(seed, counts, max_words=20) for seed in (0, 0, 1))
    assert first == again
    assert first["train"] != other["train"]
    assert {split: len(pairs) for split, pairs in first.items()} == counts
    sources = [s for pairs in first.values() for s, _ in pairs]
    assert len(set(sources)) == len(sources), "splits share a sentence"
    assert max(len(s.split()) for s in sources) == 20 and min(len(s.split()) for s in sources) <= 4


def test_module_defaults_and_lexicon_size():
    dm = GrammarDataModule(n_train=50, n_val=10, n_test=10, vocab_size=600)
    assert [len(dm.examples(s)) for s in ("train", "val", "test")] == [50, 10, 10]
    defaults = GrammarDataModule()
    assert defaults.counts == {"train": 20000, "val": 1000, "test": 1000} and defaults.max_words == 20
    # "a few hundred words of lexicon": every English lemma the grammar can use
    lemmas = {n.en for n in lexicon.NOUNS} | {v.en[0] for v in lexicon.VERBS} | {a.en for a in lexicon.ADJECTIVES}
    lemmas |= {d.en for d in lexicon.DETERMINERS if d.en} | {p.en for p in lexicon.PREPOSITIONS} | {a.en for a in lexicon.ADVERBS}
    assert 200 <= len(lemmas) <= 400, len(lemmas)


def test_every_english_sentence_has_one_german_translation():
    """Draw many trees: two trees that read the same in English must read the same in German
    (the sampler's rules against attachment ambiguity), and every construction is drawn."""
    sampler = GrammarSampler(random.Random(7))
    seen: dict[str, str] = {}
    for _ in range(30000):
        tree = sampler.sentence()
        source, target = english(tree), german(tree)
        assert seen.setdefault(source, target) == target, (source, seen[source], target)
    text = " ".join(seen.values())
    for marker in (", dass ", ", ob ", "Als ", ", als ", " im ", " zur ", " denen ", " gewusst", "Gestern "):
        assert marker in text, marker


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="data.init_args.p_relative"):
        GrammarDataModule(p_relative=1.5)
    with pytest.raises(ConfigError, match="data.init_args.max_words"):
        GrammarDataModule(max_words=2)
    with pytest.raises(ConfigError, match="p_adverb \\+ p_adverbial"):
        GrammarDataModule(p_adverb=0.6, p_adverbial=0.6)


def test_the_drawn_splits_are_cached_and_read_back_identical(tmp_path):
    """The first module draws the pairs and keeps them in its cache folder; a second one reads the
    file instead of drawing, and gets the very same pairs; a damaged file is drawn again."""
    import data_modules.grammar.task as task

    args = dict(n_train=300, n_val=20, n_test=20, vocab_size=300, cache_dir=str(tmp_path))
    drawn = GrammarDataModule(**args)._load_splits()
    (cached,) = (tmp_path / "grammar").glob("*.json")
    calls = []
    original = task.grammar_pairs
    task.grammar_pairs = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        assert GrammarDataModule(**args)._load_splits() == drawn and not calls
        cached.write_text("{not json", encoding="utf-8")
        assert GrammarDataModule(**args)._load_splits() == drawn and calls == [1]
        assert GrammarDataModule(**{**args, "seed": 1})._load_splits() != drawn  # another seed, another entry
    finally:
        task.grammar_pairs = original
