"""Tests for tformer_cli.decode.mbr: the pairwise utilities equal sacrebleu's own sentence chrF
and BLEU (hand-picked and random strings: Unicode, empty, whitespace), the expected utilities
equal the naive average of sacrebleu calls, and the selection (one candidate, identical
candidates, a consensus, duplicates, bad arguments)."""

from __future__ import annotations

import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer_cli.decode.mbr import mbr_select, utility_matrix
from tformer_cli.errors import TformerError

METRICS = {"chrf": sacrebleu.CHRF(), "bleu": sacrebleu.BLEU(effective_order=True)}

EDGE_CASES = [
    "",
    " ",
    "\t\n",
    "a",
    "a man .",
    "A man rides a bike .",
    "a man rides a bike.",
    "a man  rides\ta bike . ",
    "Ein Mann fährt Fahrrad , der Hund läuft &amp; bellt .",
    "男人骑自行车。",
    "the the the the",
    "the the",
    "(hi) - don't 3.5 , x",
]

TEXTS = st.one_of(
    st.text(alphabet=st.sampled_from(list("ab .,-'&éü男 \t\n\u00a0")), max_size=30),
    st.lists(
        st.sampled_from(["a", "man", "the", "dog", ".", ",", "runs", "Hund"]), max_size=12
    ).map(" ".join),
    st.text(max_size=15),
)


def sacrebleu_matrix(texts: list[str], utility: str) -> list[list[float]]:
    """u[i][j] by N^2 calls of sacrebleu's ``sentence_score`` (hypothesis i, reference j)."""
    metric = METRICS[utility]
    return [[metric.sentence_score(h, [r]).score for r in texts] for h in texts]


def assert_close(a: list[list[float]], b: list[list[float]]) -> None:
    assert [len(row) for row in a] == [len(row) for row in b]
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a == pytest.approx(row_b, abs=1e-9, rel=0)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_utilities_equal_sacrebleu_on_edge_cases(utility: str) -> None:
    assert_close(utility_matrix(EDGE_CASES, utility), sacrebleu_matrix(EDGE_CASES, utility))


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=5))
def test_utilities_equal_sacrebleu_on_random_strings(texts: list[str]) -> None:
    for utility in ("chrf", "bleu"):
        assert_close(utility_matrix(texts, utility), sacrebleu_matrix(texts, utility))


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_expected_utilities_are_the_average_over_all_candidates(utility: str) -> None:
    candidates = [
        "a man rides a bike .",
        "a man rides a bicycle .",
        "a man rides a bike .",  # a duplicate counts twice, itself included
        "a woman walks a dog .",
        "",
        "a man on a bike .",
    ]
    best, expected = mbr_select(candidates, utility)
    naive = [sum(row) / len(candidates) for row in sacrebleu_matrix(candidates, utility)]
    assert expected == pytest.approx(naive, abs=1e-9, rel=0)
    assert best == naive.index(max(naive)) == 0  # the first of the two equal best


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_one_candidate_is_returned(utility: str) -> None:
    best, expected = mbr_select(["a dog runs ."], utility)
    assert best == 0 and expected == [pytest.approx(100.0)]  # BLEU: exp(log 100)
    assert mbr_select([""], utility) == (0, [0.0])


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_identical_candidates_return_that_text(utility: str) -> None:
    best, expected = mbr_select(["two dogs play in the snow ."] * 5, utility)
    assert best == 0 and expected == [pytest.approx(100.0)] * 5


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_the_consensus_candidate_wins(utility: str) -> None:
    """Each sample differs from the others in its own way; the one that shares the most with
    all of them is the 'centre', even though it is not the most frequent string."""
    candidates = [
        "a black dog runs through the snow .",
        "a black dog runs in the snow .",
        "the black dog runs through the white snow .",
        "a dog runs through the snow .",
        "a black cat sits on a wall .",
        "a black dog is running through the snow",
        "two men play football in a park .",
    ]
    best, expected = mbr_select(candidates, utility)
    assert best == 0
    assert min(expected[4], expected[6]) < min(expected[:4])  # the outliers score lowest


def test_duplicates_weigh_by_their_count() -> None:
    """With chrF, 'a cat' drawn three times beats a string that shares half of each sample."""
    best, expected = mbr_select(["a dog", "a cat", "a cow", "a cat", "a cat"])
    assert best == 1 and expected[1] == expected[3] == expected[4]


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(TformerError, match="unknown MBR utility 'ter'"):
        mbr_select(["a", "b"], "ter")
    with pytest.raises(TformerError, match="at least one candidate"):
        mbr_select([])
