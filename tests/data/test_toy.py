"""The bundled toy corpus: reproducibility, held-out split, alignments and grammar rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tformer_cli.data import toy
from tformer_cli.data.toy import NP, Clause, Sentence, ToyPair

SHIPPED = REPO / "data" / "toy"
FILES = [f"{split}.{ext}" for split in ("train", "valid", "test") for ext in ("tsv", "align")]


def noun(en: str) -> toy.Noun:
    return next(n for n in toy.NOUNS if n.en == en)


def verb(en: str) -> toy.Verb:
    return next(v for v in toy.VERBS if v.en == en)


def the(en: str) -> NP:
    return NP(noun(en))


@pytest.fixture(scope="module")
def splits() -> dict[str, list[ToyPair]]:
    return toy.generate()


def adjective_noun_pairs(src: str) -> set[tuple[str, str]]:
    """(adjective, noun) combinations in an English sentence, read off its surface words."""
    nouns = {form: n.en for n in toy.NOUNS for form in (n.en, n.en_pl)}
    words = src.split()
    found = set()
    for i, word in enumerate(words):
        j = i - 1
        while word in nouns and j >= 0 and words[j] in toy.ADJECTIVES:
            found.add((words[j], nouns[word]))
            j -= 1
    return found


def test_regenerating_with_default_seed_reproduces_shipped_files(
    splits: dict[str, list[ToyPair]], tmp_path: Path
) -> None:
    toy.write_corpus(tmp_path, splits)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (SHIPPED / name).read_bytes(), name


def test_generate_is_deterministic_per_seed() -> None:
    small = {"n_train": 50, "n_valid": 10, "n_test": 10}
    assert toy.generate(seed=3, **small) == toy.generate(seed=3, **small)
    assert toy.generate(seed=3, **small) != toy.generate(seed=4, **small)


def test_split_sizes_and_target_length_range(splits: dict[str, list[ToyPair]]) -> None:
    assert {k: len(v) for k, v in splits.items()} == {"train": 20_000, "valid": 1000, "test": 1000}
    lengths = [len(p.tgt.split()) for pairs in splits.values() for p in pairs]
    assert 3 <= min(lengths) <= 5
    assert 35 <= max(lengths) <= toy.MAX_TARGET_WORDS
    assert 10 <= sum(lengths) / len(lengths) <= 16


def test_no_source_sentence_is_repeated_within_or_across_splits(
    splits: dict[str, list[ToyPair]],
) -> None:
    sources = [p.src for pairs in splits.values() for p in pairs]
    assert len(set(sources)) == len(sources)


def test_held_out_combinations_occur_only_and_always_in_test(
    splits: dict[str, list[ToyPair]],
) -> None:
    held_out = set(toy.HELD_OUT)
    for split in ("train", "valid"):
        assert not any(adjective_noun_pairs(p.src) & held_out for p in splits[split]), split
    assert all(adjective_noun_pairs(p.src) & held_out for p in splits["test"])


def test_every_adjective_and_noun_keeps_many_training_partners(
    splits: dict[str, list[ToyPair]],
) -> None:
    seen = set().union(*(adjective_noun_pairs(p.src) for p in splits["train"]))
    assert len(toy.HELD_OUT) == len(set(toy.HELD_OUT)) == 48
    for adjective in toy.ADJECTIVES:
        assert sum(a == adjective for a, _ in seen) >= 15, adjective
    for n in toy.NOUNS:
        assert sum(noun_en == n.en for _, noun_en in seen) >= 10, n.en


def test_alignments_are_in_bounds_and_cover_all_but_german_commas(
    splits: dict[str, list[ToyPair]],
) -> None:
    for pairs in splits.values():
        for pair in pairs:
            src, tgt = pair.src.split(), pair.tgt.split()
            assert all(0 <= i < len(src) and 0 <= j < len(tgt) for i, j in pair.alignment)
            assert {i for i, _ in pair.alignment} == set(range(len(src)))
            unaligned = set(range(len(tgt))) - {j for _, j in pair.alignment}
            assert all(tgt[j] == "," for j in unaligned), pair


def test_alignments_round_trip_through_pharaoh_files(tmp_path: Path) -> None:
    splits = toy.generate(n_train=20, n_valid=5, n_test=5)
    toy.write_corpus(tmp_path, splits)
    for name, pairs in splits.items():
        assert toy.read_alignments(tmp_path / f"{name}.align") == [list(p.alignment) for p in pairs]
        lines = (tmp_path / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
        assert lines == [f"{p.src}\t{p.tgt}" for p in pairs]


def test_masculine_accusative_object_takes_den() -> None:
    pair = toy.realise(Sentence(Clause(the("dog"), verb("sees"), obj=the("bird"))))
    assert (pair.src, pair.tgt) == ("the dog sees the bird .", "der hund sieht den vogel .")


def test_dative_verbs_and_prepositions_take_dative_case() -> None:
    helps = toy.realise(Sentence(Clause(the("cat"), verb("helps"), obj=NP(noun("man"), "a"))))
    assert helps.tgt == "die katze hilft einem mann ."
    plays = Clause(the("girl"), verb("plays"), pp=("with", NP(noun("dog"), "two", plural=True)))
    assert toy.realise(Sentence(plays)).tgt == "das mädchen spielt mit zwei hunden ."


@pytest.mark.parametrize(
    ("np", "case", "english", "german"),
    [
        (NP(noun("dog"), "the", adjectives=("red",)), "nom", "the red dog", "der rote hund"),
        (NP(noun("dog"), "a", adjectives=("red",)), "nom", "a red dog", "ein roter hund"),
        (NP(noun("dog"), "the", adjectives=("red",)), "acc", "the red dog", "den roten hund"),
        (NP(noun("horse"), "a", adjectives=("old",)), "acc", "an old horse", "ein altes pferd"),
        (NP(noun("cat"), "no", adjectives=("tired",)), "dat", "no tired cat", "keiner müden katze"),
        (NP(noun("dog"), "two", True, ("big",)), "nom", "two big dogs", "zwei große hunde"),
        (NP(noun("dog"), "the", True, ("big",)), "nom", "the big dogs", "die großen hunde"),
    ],
)
def test_adjective_ending_follows_determiner_gender_and_case(
    np: NP, case: str, english: str, german: str
) -> None:
    realiser = toy._Realiser()
    assert " ".join(word for word, _ in realiser.np(np, case)) == german
    assert " ".join(realiser.src) == english


def test_plural_subject_takes_plural_verb() -> None:
    subject = NP(noun("dog"), "two", plural=True)
    pair = toy.realise(Sentence(Clause(subject, verb("sees"), obj=the("cat"))))
    assert (pair.src, pair.tgt) == ("two dogs see the cat .", "zwei hunde sehen die katze .")


def test_negation_puts_nicht_after_the_object_and_aligns_it() -> None:
    pair = toy.realise(Sentence(Clause(the("dog"), verb("sees"), obj=the("cat"), negated=True)))
    assert pair.src == "the dog does not see the cat ."
    assert pair.tgt == "der hund sieht die katze nicht ."
    assert pair.alignment == ((0, 0), (1, 1), (2, 2), (3, 5), (4, 2), (5, 3), (6, 4), (7, 6))


def test_weil_clause_puts_verb_last() -> None:
    because = ("because", Clause(the("cat"), verb("sees"), obj=the("bird")))
    pair = toy.realise(Sentence(Clause(the("dog"), verb("sleeps")), trailing=because))
    assert pair.src == "the dog sleeps because the cat sees the bird ."
    assert pair.tgt == "der hund schläft , weil die katze den vogel sieht ."
    assert (6, 9) in pair.alignment  # "sees" -> clause-final "sieht"
    assert not any(j == 3 for _, j in pair.alignment)  # the German-only comma


def test_negated_subordinate_clause_puts_nicht_before_final_verb() -> None:
    although = ("although", Clause(the("cat"), verb("sings"), negated=True))
    pair = toy.realise(Sentence(Clause(the("dog"), verb("sleeps")), trailing=although))
    assert pair.tgt == "der hund schläft , obwohl die katze nicht singt ."


def test_fronted_clause_inverts_main_verb_and_subject() -> None:
    when = ("when", Clause(the("cat"), verb("sleeps")))
    pair = toy.realise(Sentence(Clause(the("dog"), verb("hears"), obj=the("man")), fronted=when))
    assert pair.src == "when the cat sleeps , the dog hears the man ."
    assert pair.tgt == "wenn die katze schläft , hört der hund den mann ."
    assert (7, 5) in pair.alignment  # "hears" -> "hört" before the subject


def test_dass_clauses_nest_with_verb_final_order() -> None:
    inner = Clause(the("bird"), verb("sings"))
    middle = Clause(the("cat"), verb("thinks"), complement=inner)
    pair = toy.realise(Sentence(Clause(the("dog"), verb("says"), complement=middle, negated=True)))
    assert pair.src == "the dog does not say that the cat thinks that the bird sings ."
    assert pair.tgt == "der hund sagt nicht , dass die katze denkt , dass der vogel singt ."


def test_but_coordination_keeps_main_clause_order() -> None:
    but = ("but", Clause(the("cat"), verb("sees"), obj=NP(noun("house"), "no")))
    pair = toy.realise(Sentence(Clause(the("dog"), verb("sleeps")), coordinated=but))
    assert pair.tgt == "der hund schläft , aber die katze sieht kein haus ."
