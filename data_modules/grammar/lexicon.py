"""The word lists of the synthetic English -> German grammar, with every form the rules need.

German forms are real German: nouns carry gender and plural, verbs their present, past,
participle and perfect auxiliary, determiners their case endings. Only regular patterns are
derived (past plural, dative plural, adjective endings); everything irregular is written out.
"""
from __future__ import annotations

from dataclasses import dataclass

CASES = ("nom", "acc", "dat")


@dataclass(frozen=True)
class Noun:
    en: str
    en_plural: str
    de: str
    de_plural: str
    gender: str  # m, f, n
    animate: bool

    def german(self, plural: bool, case: str) -> str:
        """Dative plural adds -n unless the plural already ends in -n or -s (Hunden, Autos)."""
        if not plural:
            return self.de
        if case == "dat" and not self.de_plural.endswith(("n", "s")):
            return self.de_plural + "n"
        return self.de_plural


@dataclass(frozen=True)
class Verb:
    """English (base, 3rd singular, past, participle); German (infinitive, 3rd singular, past
    singular, participle, perfect auxiliary). `frame`: intr, acc (accusative object), dat (dative
    object), ditr (dative + accusative), that / whether (a complement clause)."""

    en: tuple[str, str, str, str]
    de: tuple[str, str, str, str, str]
    frame: str

    @property
    def de_past_plural(self) -> str:
        past = self.de[2]
        return past + ("n" if past.endswith("e") else "en")


@dataclass(frozen=True)
class Adjective:
    en: str
    de: str  # the stem endings attach to


@dataclass(frozen=True)
class Determiner:
    """`kind`: def (the article's own forms), der (dies-, jed-: der-word endings), ein (ein-,
    kein-, mein-: ein-word endings), bare (no article: strong adjective endings, plural only)."""

    en: str
    en_plural: str | None  # None: singular only
    de: str
    kind: str


@dataclass(frozen=True)
class Preposition:
    en: str
    de: str
    case: str  # acc or dat


@dataclass(frozen=True)
class Adverb:
    en: str
    de: str
    tenses: tuple[str, ...]  # the tenses it may front


def _nouns(rows: str, gender: str, animate: bool) -> list[Noun]:
    out = []
    for row in rows.strip().splitlines():
        en, en_plural, de, de_plural = (part.strip() for part in row.split("|"))
        out.append(Noun(en, en_plural, de, de_plural, gender, animate))
    return out


NOUNS: tuple[Noun, ...] = tuple(
    _nouns("""
        dog | dogs | Hund | Hunde
        man | men | Mann | Männer
        teacher | teachers | Lehrer | Lehrer
        bird | birds | Vogel | Vögel
        doctor | doctors | Arzt | Ärzte
        king | kings | König | Könige
        friend | friends | Freund | Freunde
        brother | brothers | Bruder | Brüder
        father | fathers | Vater | Väter
        baker | bakers | Bäcker | Bäcker
        cook | cooks | Koch | Köche
        uncle | uncles | Onkel | Onkel
        wolf | wolves | Wolf | Wölfe
        frog | frogs | Frosch | Frösche
        donkey | donkeys | Esel | Esel
        painter | painters | Maler | Maler
        thief | thieves | Dieb | Diebe
    """, "m", True)
    + _nouns("""
        garden | gardens | Garten | Gärten
        table | tables | Tisch | Tische
        chair | chairs | Stuhl | Stühle
        ball | balls | Ball | Bälle
        letter | letters | Brief | Briefe
        apple | apples | Apfel | Äpfel
        wagon | wagons | Wagen | Wagen
        key | keys | Schlüssel | Schlüssel
        tree | trees | Baum | Bäume
        river | rivers | Fluss | Flüsse
        mountain | mountains | Berg | Berge
        hat | hats | Hut | Hüte
        coat | coats | Mantel | Mäntel
        cake | cakes | Kuchen | Kuchen
        umbrella | umbrellas | Schirm | Schirme
        forest | forests | Wald | Wälder
        shoe | shoes | Schuh | Schuhe
        train | trains | Zug | Züge
    """, "m", False)
    + _nouns("""
        woman | women | Frau | Frauen
        cat | cats | Katze | Katzen
        mother | mothers | Mutter | Mütter
        sister | sisters | Schwester | Schwestern
        daughter | daughters | Tochter | Töchter
        aunt | aunts | Tante | Tanten
        queen | queens | Königin | Königinnen
        mouse | mice | Maus | Mäuse
        cow | cows | Kuh | Kühe
        duck | ducks | Ente | Enten
        owl | owls | Eule | Eulen
        bee | bees | Biene | Bienen
        goat | goats | Ziege | Ziegen
        grandmother | grandmothers | Großmutter | Großmütter
    """, "f", True)
    + _nouns("""
        flower | flowers | Blume | Blumen
        door | doors | Tür | Türen
        city | cities | Stadt | Städte
        street | streets | Straße | Straßen
        church | churches | Kirche | Kirchen
        school | schools | Schule | Schulen
        lamp | lamps | Lampe | Lampen
        bag | bags | Tasche | Taschen
        clock | clocks | Uhr | Uhren
        newspaper | newspapers | Zeitung | Zeitungen
        bridge | bridges | Brücke | Brücken
        kitchen | kitchens | Küche | Küchen
        wall | walls | Wand | Wände
        island | islands | Insel | Inseln
        bottle | bottles | Flasche | Flaschen
        cup | cups | Tasse | Tassen
        box | boxes | Kiste | Kisten
    """, "f", False)
    + _nouns("""
        child | children | Kind | Kinder
        horse | horses | Pferd | Pferde
        lamb | lambs | Lamm | Lämmer
        camel | camels | Kamel | Kamele
        girl | girls | Mädchen | Mädchen
        animal | animals | Tier | Tiere
        chicken | chickens | Huhn | Hühner
        pig | pigs | Schwein | Schweine
        baby | babies | Baby | Babys
    """, "n", True)
    + _nouns("""
        house | houses | Haus | Häuser
        book | books | Buch | Bücher
        car | cars | Auto | Autos
        picture | pictures | Bild | Bilder
        window | windows | Fenster | Fenster
        ship | ships | Schiff | Schiffe
        village | villages | Dorf | Dörfer
        song | songs | Lied | Lieder
        gift | gifts | Geschenk | Geschenke
        bread | breads | Brot | Brote
        room | rooms | Zimmer | Zimmer
        bed | beds | Bett | Betten
        glass | glasses | Glas | Gläser
        knife | knives | Messer | Messer
        field | fields | Feld | Felder
        boat | boats | Boot | Boote
        egg | eggs | Ei | Eier
        bicycle | bicycles | Fahrrad | Fahrräder
        castle | castles | Schloss | Schlösser
        piano | pianos | Klavier | Klaviere
    """, "n", False)
)


def _verbs(rows: str, frame: str) -> list[Verb]:
    out = []
    for row in rows.strip().splitlines():
        en, de = row.split("||")
        en_forms = tuple(part.strip() for part in en.split("|"))
        de_forms = tuple(part.strip() for part in de.split("|"))
        assert len(en_forms) == 4 and len(de_forms) == 5, row
        out.append(Verb(en_forms, de_forms, frame))
    return out


VERBS: tuple[Verb, ...] = tuple(
    _verbs("""
        sleep | sleeps | slept | slept || schlafen | schläft | schlief | geschlafen | haben
        run | runs | ran | run || laufen | läuft | lief | gelaufen | sein
        laugh | laughs | laughed | laughed || lachen | lacht | lachte | gelacht | haben
        work | works | worked | worked || arbeiten | arbeitet | arbeitete | gearbeitet | haben
        play | plays | played | played || spielen | spielt | spielte | gespielt | haben
        wait | waits | waited | waited || warten | wartet | wartete | gewartet | haben
        come | comes | came | come || kommen | kommt | kam | gekommen | sein
        sing | sings | sang | sung || singen | singt | sang | gesungen | haben
        swim | swims | swam | swum || schwimmen | schwimmt | schwamm | geschwommen | sein
        dance | dances | danced | danced || tanzen | tanzt | tanzte | getanzt | haben
        cry | cries | cried | cried || weinen | weint | weinte | geweint | haben
        fall | falls | fell | fallen || fallen | fällt | fiel | gefallen | sein
        stay | stays | stayed | stayed || bleiben | bleibt | blieb | geblieben | sein
        travel | travels | traveled | traveled || reisen | reist | reiste | gereist | sein
        dream | dreams | dreamed | dreamed || träumen | träumt | träumte | geträumt | haben
    """, "intr")
    + _verbs("""
        see | sees | saw | seen || sehen | sieht | sah | gesehen | haben
        find | finds | found | found || finden | findet | fand | gefunden | haben
        know | knows | knew | known || kennen | kennt | kannte | gekannt | haben
        love | loves | loved | loved || lieben | liebt | liebte | geliebt | haben
        look for | looks for | looked for | looked for || suchen | sucht | suchte | gesucht | haben
        hear | hears | heard | heard || hören | hört | hörte | gehört | haben
        buy | buys | bought | bought || kaufen | kauft | kaufte | gekauft | haben
        eat | eats | ate | eaten || essen | isst | aß | gegessen | haben
        write | writes | wrote | written || schreiben | schreibt | schrieb | geschrieben | haben
        build | builds | built | built || bauen | baut | baute | gebaut | haben
        paint | paints | painted | painted || malen | malt | malte | gemalt | haben
        visit | visits | visited | visited || besuchen | besucht | besuchte | besucht | haben
        carry | carries | carried | carried || tragen | trägt | trug | getragen | haben
        hold | holds | held | held || halten | hält | hielt | gehalten | haben
        take | takes | took | taken || nehmen | nimmt | nahm | genommen | haben
        need | needs | needed | needed || brauchen | braucht | brauchte | gebraucht | haben
        forget | forgets | forgot | forgotten || vergessen | vergisst | vergaß | vergessen | haben
        catch | catches | caught | caught || fangen | fängt | fing | gefangen | haben
        wash | washes | washed | washed || waschen | wäscht | wusch | gewaschen | haben
        open | opens | opened | opened || öffnen | öffnet | öffnete | geöffnet | haben
        meet | meets | met | met || treffen | trifft | traf | getroffen | haben
        call | calls | called | called || rufen | ruft | rief | gerufen | haben
    """, "acc")
    + _verbs("""
        help | helps | helped | helped || helfen | hilft | half | geholfen | haben
        follow | follows | followed | followed || folgen | folgt | folgte | gefolgt | sein
        thank | thanks | thanked | thanked || danken | dankt | dankte | gedankt | haben
        answer | answers | answered | answered || antworten | antwortet | antwortete | geantwortet | haben
        trust | trusts | trusted | trusted || vertrauen | vertraut | vertraute | vertraut | haben
    """, "dat")
    + _verbs("""
        give | gives | gave | given || geben | gibt | gab | gegeben | haben
        show | shows | showed | shown || zeigen | zeigt | zeigte | gezeigt | haben
        bring | brings | brought | brought || bringen | bringt | brachte | gebracht | haben
        send | sends | sent | sent || schicken | schickt | schickte | geschickt | haben
        sell | sells | sold | sold || verkaufen | verkauft | verkaufte | verkauft | haben
        lend | lends | lent | lent || leihen | leiht | lieh | geliehen | haben
    """, "ditr")
    + _verbs("""
        say | says | said | said || sagen | sagt | sagte | gesagt | haben
        think | thinks | thought | thought || denken | denkt | dachte | gedacht | haben
        know | knows | knew | known || wissen | weiß | wusste | gewusst | haben
        believe | believes | believed | believed || glauben | glaubt | glaubte | geglaubt | haben
        hope | hopes | hoped | hoped || hoffen | hofft | hoffte | gehofft | haben
    """, "that")
    + _verbs("""
        ask | asks | asked | asked || fragen | fragt | fragte | gefragt | haben
    """, "whether")
)

ADJECTIVES: tuple[Adjective, ...] = tuple(
    Adjective(*pair.split(":")) for pair in (
        "small:klein big:groß old:alt young:jung red:rot blue:blau green:grün black:schwarz "
        "white:weiß yellow:gelb brown:braun tired:müde happy:glücklich sad:traurig fast:schnell "
        "slow:langsam new:neu beautiful:schön clever:klug strong:stark warm:warm cold:kalt loud:laut "
        "quiet:leise rich:reich poor:arm friendly:freundlich strange:fremd hungry:hungrig funny:lustig "
        "proud:stolz wild:wild brave:mutig lazy:faul famous:berühmt empty:leer heavy:schwer "
        "clean:sauber angry:wütend"
    ).split()
)

DETERMINERS: tuple[Determiner, ...] = (
    Determiner("the", "the", "d", "def"),
    Determiner("this", "these", "dies", "der"),
    Determiner("every", None, "jed", "der"),
    Determiner("a", None, "ein", "ein"),
    Determiner("no", "no", "kein", "ein"),
    Determiner("my", "my", "mein", "ein"),
    Determiner("his", "his", "sein", "ein"),
    Determiner("her", "her", "ihr", "ein"),
    Determiner("our", "our", "unser", "ein"),
    Determiner("", "", "", "bare"),  # plural only: "old dogs" -> "alte Hunde"
)

PREPOSITIONS: tuple[Preposition, ...] = tuple(
    Preposition(*row.split(":")) for row in (
        "with:mit:dat", "without:ohne:acc", "for:für:acc", "in:in:dat", "behind:hinter:dat",
        "under:unter:dat", "on:auf:dat", "next to:neben:dat", "in front of:vor:dat",
        "through:durch:acc", "against:gegen:acc", "to:zu:dat", "from:von:dat", "near:bei:dat",
        "around:um:acc",
    )
)

# Preposition + definite article that German writes as one word.
CONTRACTIONS = {("in", "dem"): "im", ("zu", "dem"): "zum", ("zu", "der"): "zur", ("von", "dem"): "vom",
                ("bei", "dem"): "beim"}

_ANY = ("present", "past", "perfect", "can", "must", "want")
ADVERBS: tuple[Adverb, ...] = (
    Adverb("today", "heute", _ANY),
    Adverb("yesterday", "gestern", ("past",)),  # English takes no present perfect with "yesterday"
    Adverb("tomorrow", "morgen", ("present", "can", "must", "want")),
    Adverb("often", "oft", _ANY),
    Adverb("sometimes", "manchmal", _ANY),
    Adverb("now", "jetzt", ("present", "perfect", "can", "must", "want")),
    Adverb("then", "dann", _ANY),
    Adverb("suddenly", "plötzlich", ("present", "past", "perfect")),
    Adverb("finally", "endlich", _ANY),
    Adverb("later", "später", ("present", "can", "must", "want")),
    Adverb("perhaps", "vielleicht", _ANY),
    Adverb("unfortunately", "leider", _ANY),
)

# Adverbial clauses: English conjunction -> German (when: "als" for one event in the past).
CONJUNCTIONS = {"because": "weil", "although": "obwohl", "when": "wenn", "if": "wenn", "before": "bevor",
                "while": "während", "until": "bis"}

MODALS = {"can": ("can", "kann", "können"), "must": ("must", "muss", "müssen"), "want": ("want to", "will", "wollen")}
AUXILIARIES = {"haben": ("hat", "haben"), "sein": ("ist", "sind")}


def _find(table, en: str, **fields):
    """The entry of `table` with this English form (a verb's base form; and the given field
    values), for tests and examples."""
    found = [e for e in table if (e.en[0] if isinstance(e.en, tuple) else e.en) == en
             and all(getattr(e, k) == v for k, v in fields.items())]
    if len(found) != 1:
        raise KeyError(f"{en!r} {fields or ''}: {len(found)} entries")
    return found[0]


def noun(en: str) -> Noun:
    return _find(NOUNS, en)


def verb(en: str, frame: str | None = None) -> Verb:
    return _find(VERBS, en, **({"frame": frame} if frame else {}))


def adjective(en: str) -> Adjective:
    return _find(ADJECTIVES, en)


def determiner(en: str) -> Determiner:
    return _find(DETERMINERS, en)


def preposition(en: str) -> Preposition:
    return _find(PREPOSITIONS, en)


def adverb(en: str) -> Adverb:
    return _find(ADVERBS, en)
