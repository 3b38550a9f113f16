"""Minimum Bayes risk (MBR) selection (Kumar & Byrne 2004, "Minimum Bayes-Risk Decoding for
Statistical Machine Translation"; Freitag et al. 2022, "High Quality Rather than High Model
Probability"): of N candidate translations, return the one with the highest expected utility
against the candidates themselves, taken as pseudo-references drawn from the model.

The utilities are sacrebleu's sentence chrF and BLEU, recomputed from n-gram counts extracted
once per distinct candidate: each unordered pair then costs a set intersection per order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from tformer_cli.errors import TformerError

CHRF_ORDER = 6  # character n-grams 1..6, word n-grams none (chrF, not chrF++)
CHRF_BETA = 2  # recall weighs beta^2 = 4 times as much as precision
BLEU_ORDER = 4
_tokenize_13a = Tokenizer13a()  # sacrebleu's default BLEU tokenization


@dataclass(frozen=True)
class NGrams:
    """A sentence's n-grams for n = 1..order and its length in units. Each order's multiset is
    the set of its numbered copies {(g, k) : k < c(g)}, so that the clipped matches of two
    sentences, sum_g min(c_a(g), c_b(g)) = |A ∩ B|, are one set intersection."""

    copies: tuple[frozenset[tuple[str | tuple[str, ...], int]], ...]
    totals: tuple[int, ...]  # t_n = sum_g c(g) = |copies[n - 1]|
    length: int


def ngrams(units: str | tuple[str, ...], order: int) -> NGrams:
    """Count the n-grams of a sequence of characters (a str) or of tokens (a tuple)."""
    L = len(units)
    counts = (Counter(units[i : i + n] for i in range(L - n + 1)) for n in range(1, order + 1))
    copies = tuple(frozenset((g, k) for g, c in cnt.items() for k in range(c)) for cnt in counts)
    return NGrams(copies, tuple(map(len, copies)), L)


def chrf_ngrams(text: str) -> NGrams:
    """chrF's statistics: character n-grams of the text with all whitespace removed."""
    return ngrams("".join(text.split()), CHRF_ORDER)


def bleu_ngrams(text: str) -> NGrams:
    """BLEU's statistics: word n-grams of the 13a-tokenized text (trailing whitespace stripped)."""
    return ngrams(tuple(_tokenize_13a(text.rstrip()).split()), BLEU_ORDER)


def matches(a: NGrams, b: NGrams) -> list[int]:
    """Clipped matches per order, m_n = sum_g min(c_a(g), c_b(g)): symmetric in a and b."""
    return [len(x & y) for x, y in zip(a.copies, b.copies, strict=True)]


def sentence_chrf(hyp: NGrams, ref: NGrams, m: list[int]) -> float:
    """Sentence chrF (Popović 2015) as sacrebleu >= 2 computes it: precision P and recall R
    averaged over the orders where both sentences have n-grams (the effective order), then
    F_beta = (1 + beta^2) P R / (beta^2 P + R), times 100; 0 when nothing matches."""
    prec, rec = [], []
    for h_n, r_n, m_n in zip(hyp.totals, ref.totals, m, strict=True):
        if h_n and r_n:
            prec.append(m_n / h_n)
            rec.append(m_n / r_n)
    if not prec:
        return 0.0
    P, R = sum(prec) / len(prec), sum(rec) / len(rec)
    if P + R == 0:
        return 0.0
    b2 = CHRF_BETA**2
    return 100 * ((1 + b2) * P * R / (b2 * P + R))


def sentence_bleu(hyp: NGrams, ref: NGrams, m: list[int]) -> float:
    """Sentence BLEU (Papineni et al. 2002) as sacrebleu's ``BLEU(effective_order=True)``: the
    geometric mean of p_n = m_n / t_n over the orders where the hypothesis has n-grams, with
    'exp' smoothing (the k-th order without a match gets p_n = 1 / (2^k t_n), as NIST's
    mteval), times the brevity penalty exp(1 - r / c) when c < r; 0 when nothing matches."""
    if not any(m):
        return 0.0
    log_p, unmatched = [], 0
    for t_n, m_n in zip(hyp.totals, m, strict=True):
        if t_n == 0:
            break
        if m_n:
            log_p.append(math.log(100 * m_n / t_n))  # p_n in percent, as sacrebleu
        else:
            unmatched += 1
            log_p.append(math.log(100 / (2.0**unmatched * t_n)))
    c, r = hyp.length, ref.length
    bp = math.exp(1 - r / c) if c < r else 1.0
    return bp * math.exp(sum(log_p) / len(log_p))


Utility = tuple[Callable[[str], NGrams], Callable[[NGrams, NGrams, list[int]], float]]
UTILITIES: dict[str, Utility] = {
    "chrf": (chrf_ngrams, sentence_chrf),
    "bleu": (bleu_ngrams, sentence_bleu),
}


def utility_matrix(texts: Sequence[str], utility: str = "chrf") -> list[list[float]]:
    """u[i][j]: the utility (``chrf`` or ``bleu``, 0..100) of ``texts[i]`` against ``texts[j]``
    as the reference, equal to sacrebleu's ``sentence_score``."""
    if utility not in UTILITIES:
        raise TformerError(f"unknown MBR utility {utility!r}: use one of {', '.join(UTILITIES)}")
    extract, score = UTILITIES[utility]
    stats = [extract(s) for s in texts]  # n-grams counted once per text
    N = len(texts)
    u = [[0.0] * N for _ in range(N)]
    for i in range(N):
        for j in range(i, N):
            m = matches(stats[i], stats[j])
            u[i][j] = score(stats[i], stats[j], m)
            u[j][i] = score(stats[j], stats[i], m)
    return u


def mbr_select(candidates: Sequence[str], utility: str = "chrf") -> tuple[int, list[float]]:
    """The index of the candidate of highest expected utility (the first on ties), and each
    candidate's expected utility E_i = (1/N) sum_j u(y_i, y_j) over all N candidates, itself
    included: the Monte Carlo estimate of E_{y ~ p}[u(y_i, y)], a string drawn k times counted
    k times. Each distinct string is scored once, weighted by its count."""
    if not candidates:
        raise TformerError("MBR needs at least one candidate")
    count = Counter(candidates)
    distinct = list(count)  # first-seen order
    u = utility_matrix(distinct, utility)  # (D, D)
    expected = {
        s: sum(count[r] * u[i][j] for j, r in enumerate(distinct)) / len(candidates)
        for i, s in enumerate(distinct)
    }
    utilities = [expected[s] for s in candidates]
    return max(range(len(candidates)), key=utilities.__getitem__), utilities
