"""The bundled toy corpus: a deterministic English -> German grammar with word alignments.

Sentences are sampled as small syntax trees (:class:`Sentence`, :class:`Clause`, :class:`NP`)
and realised in both languages at once, so every German word knows which English words it
translates. German needs case, gender and number agreement, adjective declension, ``nicht``
placement and verb-final subordinate clauses, so translating is more than word substitution.

Regenerate the shipped corpus with ``python -m tformer_cli.data.toy data/toy``.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 0
MAX_TARGET_WORDS = 40


@dataclass(frozen=True)
class ToyPair:
    """One sentence pair; ``alignment`` holds (source index, target index) word links."""

    src: str
    tgt: str
    alignment: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Noun:
    """A noun with its English and German singular/plural forms and German gender."""

    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str  # "m", "f" or "n"
    animate: bool

    @property
    def de_dat_pl(self) -> str:
        """Dative plural: the plural plus ``-n`` unless it already ends in ``n`` or ``s``."""
        return self.de_pl if self.de_pl.endswith(("n", "s")) else self.de_pl + "n"


@dataclass(frozen=True)
class Verb:
    """A verb: 3rd person singular and plural (= English base) forms, and its complement."""

    en: str
    en_pl: str
    de: str
    de_pl: str
    kind: str  # "intr" (optional PP), "acc" / "dat" (object case), "that" (dass-clause)


def _nouns(gender: str, animate: bool, *entries: str) -> tuple[Noun, ...]:
    """Parse ``"en en_pl de de_pl"`` entries sharing a gender and animacy."""
    return tuple(Noun(*entry.split(), gender, animate) for entry in entries)


def _verbs(kind: str, *entries: str) -> tuple[Verb, ...]:
    """Parse ``"en_3sg en_base de_3sg de_pl"`` entries sharing a complement kind."""
    return tuple(Verb(*entry.split(), kind) for entry in entries)


NOUNS: tuple[Noun, ...] = (
    *_nouns("m", True, "dog dogs hund hunde", "bird birds vogel vögel", "man men mann männer"),
    *_nouns("m", True, "fox foxes fuchs füchse", "cook cooks koch köche"),
    *_nouns("m", True, "teacher teachers lehrer lehrer"),
    *_nouns("m", False, "tree trees baum bäume", "table tables tisch tische"),
    *_nouns("f", True, "cat cats katze katzen", "woman women frau frauen", "mouse mice maus mäuse"),
    *_nouns("f", True, "cow cows kuh kühe", "duck ducks ente enten"),
    *_nouns("f", True, "sister sisters schwester schwestern"),
    *_nouns("f", False, "flower flowers blume blumen", "door doors tür türen"),
    *_nouns("n", True, "horse horses pferd pferde", "child children kind kinder"),
    *_nouns("n", True, "girl girls mädchen mädchen", "pig pigs schwein schweine"),
    *_nouns("n", True, "chicken chickens huhn hühner", "calf calves kalb kälber"),
    *_nouns("n", False, "house houses haus häuser", "book books buch bücher"),
)
VERBS: tuple[Verb, ...] = (
    *_verbs("intr", "sleeps sleep schläft schlafen", "sings sing singt singen"),
    *_verbs("intr", "waits wait wartet warten", "plays play spielt spielen"),
    *_verbs("intr", "laughs laugh lacht lachen", "dances dance tanzt tanzen"),
    *_verbs("intr", "sits sit sitzt sitzen"),
    *_verbs("acc", "sees see sieht sehen", "finds find findet finden", "hears hear hört hören"),
    *_verbs("acc", "likes like mag mögen", "visits visit besucht besuchen"),
    *_verbs("acc", "carries carry trägt tragen", "washes wash wäscht waschen"),
    *_verbs("dat", "helps help hilft helfen", "follows follow folgt folgen"),
    *_verbs("that", "says say sagt sagen", "thinks think denkt denken"),
    *_verbs("that", "knows know weiß wissen", "believes believe glaubt glauben"),
)
# Quality, size, age, colour: English attributive order. Two adjectives come from two groups.
ADJECTIVE_GROUPS: tuple[dict[str, str], ...] = (
    {"beautiful": "schön", "funny": "lustig", "loud": "laut", "wild": "wild", "tired": "müde"},
    {"big": "groß", "small": "klein"},
    {"old": "alt", "young": "jung"},
    {"red": "rot", "blue": "blau", "green": "grün", "black": "schwarz", "grey": "grau",
     "brown": "braun"},
)  # fmt: skip
ADJECTIVES: dict[str, str] = {en: de for group in ADJECTIVE_GROUPS for en, de in group.items()}
NUMBERS: dict[str, str] = {
    "two": "zwei", "three": "drei", "four": "vier", "five": "fünf", "six": "sechs",
    "seven": "sieben", "eight": "acht", "nine": "neun", "ten": "zehn",
}  # fmt: skip
PREPOSITIONS: dict[str, str] = {
    "with": "mit",
    "behind": "hinter",
    "under": "unter",
    "beside": "neben",
}
SUBORDINATORS: dict[str, str] = {
    "because": "weil", "although": "obwohl", "while": "während", "when": "wenn", "before": "bevor",
}  # fmt: skip
COORDINATORS: dict[str, str] = {"and": "und", "but": "aber", "or": "oder"}


def _held_out() -> tuple[tuple[str, str], ...]:
    """Two (adjective, noun) combinations per noun, spread evenly over the adjectives."""
    adjectives = tuple(ADJECTIVES)
    n = len(adjectives)
    return tuple(
        (adjectives[k % n], noun.en) for i, noun in enumerate(NOUNS) for k in (2 * i, 2 * i + 7)
    )


HELD_OUT: tuple[tuple[str, str], ...] = _held_out()

_DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
_INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein", "pl": "eine"},
    "acc": {"m": "einen", "f": "eine", "n": "ein", "pl": "eine"},
    "dat": {"m": "einem", "f": "einer", "n": "einem", "pl": "einen"},
}  # plural slots are only reached through "kein": keine / keinen


@dataclass(frozen=True)
class NP:
    """A noun phrase: determiner ("the", "a", "no" or a number word), adjectives, noun."""

    noun: Noun
    det: str = "the"
    plural: bool = False
    adjectives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Clause:
    """Subject, verb and the verb's complement: object, prepositional phrase or dass-clause."""

    subject: NP
    verb: Verb
    obj: NP | None = None
    pp: tuple[str, NP] | None = None
    complement: Clause | None = None
    negated: bool = False


@dataclass(frozen=True)
class Sentence:
    """A main clause with an optional fronted or trailing adverbial clause or a coordinate."""

    main: Clause
    fronted: tuple[str, Clause] | None = None
    trailing: tuple[str, Clause] | None = None
    coordinated: tuple[str, Clause] | None = None


_Target = list[tuple[str, tuple[int, ...]]]  # German words with the source indices they translate


class _Realiser:
    """Emits English words left to right; German fragments point back at their indices."""

    def __init__(self) -> None:
        self.src: list[str] = []

    def add(self, *words: str) -> tuple[int, ...]:
        """Append English words, returning their indices."""
        start = len(self.src)
        self.src.extend(words)
        return tuple(range(start, len(self.src)))

    def np(self, np: NP, case: str) -> _Target:
        """Realise a noun phrase in the given German case ("nom", "acc" or "dat")."""
        slot = "pl" if np.plural else np.noun.gender
        first = np.adjectives[0] if np.adjectives else np.noun.en
        det_en = "an" if np.det == "a" and first[0] in "aeiou" else np.det
        (d,) = self.add(det_en)
        if np.det == "the":
            det_de = _DEFINITE[case][slot]
        elif np.det in NUMBERS:
            det_de = NUMBERS[np.det]
        else:
            det_de = ("k" if np.det == "no" else "") + _INDEFINITE[case][slot]
        out: _Target = [(det_de, (d,))]
        for adjective in np.adjectives:
            (a,) = self.add(adjective)
            out.append((_decline(ADJECTIVES[adjective], np.det, slot, case), (a,)))
        (n,) = self.add(np.noun.en_pl if np.plural else np.noun.en)
        plural_de = np.noun.de_dat_pl if case == "dat" else np.noun.de_pl
        out.append((plural_de if np.plural else np.noun.de, (n,)))
        return out

    def clause(self, clause: Clause, order: str) -> _Target:
        """Realise a clause with German order "main" (SVO), "inverted" (VSO) or "sub" (SOV)."""
        subject = self.np(clause.subject, "nom")
        verb, plural = clause.verb, clause.subject.plural
        verb_de = verb.de_pl if plural else verb.de
        if clause.negated:
            aux, neg, v = self.add("do" if plural else "does", "not", verb.en_pl)
            finite: _Target = [(verb_de, (v, aux))]
            nicht: _Target = [("nicht", (neg,))]
        else:
            finite, nicht = [(verb_de, self.add(verb.en_pl if plural else verb.en))], []
        middle: _Target = []
        if clause.obj is not None:
            middle = self.np(clause.obj, verb.kind)  # kind "acc" / "dat" is the object's case
        if clause.pp is not None:
            preposition, np = clause.pp
            middle = [(PREPOSITIONS[preposition], self.add(preposition)), *self.np(np, "dat")]
        tail: _Target = []
        if clause.complement is not None:
            tail = [(",", ()), ("dass", self.add("that")), *self.clause(clause.complement, "sub")]
        if order == "main":
            return [*subject, *finite, *middle, *nicht, *tail]
        if order == "inverted":
            return [*finite, *subject, *middle, *nicht, *tail]
        return [*subject, *middle, *nicht, *finite, *tail]


def _decline(stem: str, det: str, slot: str, case: str) -> str:
    """Attach the adjective ending: weak after "the", mixed after "a"/"no", strong after numbers."""
    if case == "dat" or (slot == "pl" and det not in NUMBERS):
        ending = "en"
    elif slot == "pl":
        ending = "e"
    elif det == "the":
        ending = "en" if (slot, case) == ("m", "acc") else "e"
    else:
        ending = {"m": "er" if case == "nom" else "en", "f": "e", "n": "es"}[slot]
    return stem + (ending[1:] if stem.endswith("e") else ending)


def realise(sentence: Sentence) -> ToyPair:
    """Translate a sentence tree into an aligned English/German pair."""
    r = _Realiser()
    tgt: _Target = []
    if sentence.fronted is not None:
        conjunction, sub = sentence.fronted
        tgt += [(SUBORDINATORS[conjunction], r.add(conjunction)), *r.clause(sub, "sub")]
        tgt.append((",", r.add(",")))
    tgt += r.clause(sentence.main, "main" if sentence.fronted is None else "inverted")
    if sentence.coordinated is not None:
        conjunction, other = sentence.coordinated
        if conjunction == "but":
            tgt.append((",", r.add(",")))
        tgt += [(COORDINATORS[conjunction], r.add(conjunction)), *r.clause(other, "main")]
    if sentence.trailing is not None:
        conjunction, sub = sentence.trailing
        tgt += [(",", ()), (SUBORDINATORS[conjunction], r.add(conjunction)), *r.clause(sub, "sub")]
    tgt.append((".", r.add(".")))
    alignment = sorted((i, j) for j, (_, sources) in enumerate(tgt) for i in sources)
    return ToyPair(" ".join(r.src), " ".join(word for word, _ in tgt), tuple(alignment))


def _sample_np(rng: random.Random, animate: bool, allow_no: bool, definite: bool) -> NP:
    """Sample a noun phrase; ``definite`` forces "the" (objects of negated clauses)."""
    noun = rng.choice([n for n in NOUNS if n.animate or not animate])
    plural = rng.random() < 0.3
    r = rng.random()
    if definite or r < 0.5:
        det = "the"
    elif r < 0.9:
        det = rng.choice(tuple(NUMBERS)) if plural else "a"
    else:
        det = "no" if allow_no else "the"
    r = rng.random()
    if r < 0.5:
        adjectives: tuple[str, ...] = ()
    elif r < 0.88:
        adjectives = (rng.choice(tuple(ADJECTIVES)),)
    else:
        groups = sorted(rng.sample(range(len(ADJECTIVE_GROUPS)), 2))
        adjectives = tuple(rng.choice(tuple(ADJECTIVE_GROUPS[g])) for g in groups)
    return NP(noun, det, plural, adjectives)


def _sample_clause(rng: random.Random, depth: int) -> Clause:
    """Sample a clause; ``depth`` bounds how many dass-clauses may nest below it."""
    verb = rng.choice([v for v in VERBS if depth > 0 or v.kind != "that"])
    negated = rng.random() < 0.2
    subject = _sample_np(rng, animate=True, allow_no=not negated, definite=False)
    obj = pp = complement = None
    if verb.kind in ("acc", "dat"):
        obj = _sample_np(rng, animate=verb.kind == "dat", allow_no=not negated, definite=negated)
    elif verb.kind == "that":
        complement = _sample_clause(rng, depth - 1)
    elif not negated and rng.random() < 0.4:
        np = _sample_np(rng, animate=False, allow_no=True, definite=False)
        pp = (rng.choice(tuple(PREPOSITIONS)), np)
    return Clause(subject, verb, obj, pp, complement, negated)


def sample_sentence(rng: random.Random) -> Sentence:
    """Sample one sentence tree; clause shapes are restricted so the English is unambiguous."""
    r = rng.random()
    if r < 0.35:
        return Sentence(_sample_clause(rng, 2))
    if r < 0.5:
        other = (rng.choice(tuple(COORDINATORS)), _sample_clause(rng, 1))
        return Sentence(_sample_clause(rng, 0), coordinated=other)
    subordinate = (rng.choice(tuple(SUBORDINATORS)), _sample_clause(rng, 1))
    if r < 0.75:
        return Sentence(_sample_clause(rng, 0), trailing=subordinate)
    if r < 0.95:
        return Sentence(_sample_clause(rng, 1), fronted=subordinate)
    trailing = (rng.choice(tuple(SUBORDINATORS)), _sample_clause(rng, 1))
    return Sentence(_sample_clause(rng, 0), fronted=subordinate, trailing=trailing)


def has_held_out(sentence: Sentence) -> bool:
    """Whether any noun phrase, nested clauses included, uses a held-out adjective-noun pair."""
    parts = (sentence.fronted, sentence.trailing, sentence.coordinated)
    clauses = [sentence.main, *(part[1] for part in parts if part)]
    while clauses:
        clause = clauses.pop()
        nps = (clause.subject, clause.obj, clause.pp[1] if clause.pp else None)
        if any((a, np.noun.en) in HELD_OUT for np in nps if np for a in np.adjectives):
            return True
        if clause.complement is not None:
            clauses.append(clause.complement)
    return False


def generate(
    seed: int = DEFAULT_SEED, n_train: int = 20_000, n_valid: int = 1_000, n_test: int = 1_000
) -> dict[str, list[ToyPair]]:
    """Sample the three splits; test pairs are exactly those with a held-out combination."""
    rng = random.Random(seed)
    seen: set[str] = set()
    pool: list[ToyPair] = []
    test: list[ToyPair] = []
    attempts = 0
    while len(pool) < n_train + n_valid or len(test) < n_test:
        attempts += 1
        if attempts > 100 * (n_train + n_valid + n_test + 1):
            raise RuntimeError("the grammar cannot produce that many distinct sentences")
        sentence = sample_sentence(rng)
        pair = realise(sentence)
        if pair.src in seen or len(pair.tgt.split()) > MAX_TARGET_WORDS:
            continue
        target = test if has_held_out(sentence) else pool
        if len(target) < (n_test if target is test else n_train + n_valid):
            seen.add(pair.src)
            target.append(pair)
    return {"train": pool[n_valid:], "valid": pool[:n_valid], "test": test}


def write_corpus(out_dir: Path, splits: dict[str, list[ToyPair]]) -> None:
    """Write ``{split}.tsv`` (source TAB target) and ``{split}.align`` (Pharaoh) per split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        tsv = "".join(f"{p.src}\t{p.tgt}\n" for p in pairs)
        align = "".join(" ".join(f"{i}-{j}" for i, j in p.alignment) + "\n" for p in pairs)
        (out_dir / f"{name}.tsv").write_text(tsv, encoding="utf-8", newline="\n")
        (out_dir / f"{name}.align").write_text(align, encoding="utf-8", newline="\n")


def read_alignments(path: Path) -> list[list[tuple[int, int]]]:
    """Read a Pharaoh file: one line of ``i-j`` links per sentence pair."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [[(int(i), int(j)) for i, j in (t.split("-") for t in line.split())] for line in lines]


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m tformer_cli.data.toy OUT_DIR [--seed N]``."""
    parser = argparse.ArgumentParser(description="Generate the toy English-German corpus.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    splits = generate(args.seed)
    write_corpus(args.out_dir, splits)
    for name, pairs in splits.items():
        lengths = [len(p.tgt.split()) for p in pairs]
        print(
            f"{name}: {len(pairs)} pairs, target words min {min(lengths)} "
            f"mean {sum(lengths) / len(lengths):.1f} max {max(lengths)}"
        )


if __name__ == "__main__":
    main()
