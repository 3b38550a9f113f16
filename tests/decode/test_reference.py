"""Tests for tformer_cli.decode.reference: the naive searches against what they define (a
brute-force enumeration, teacher-forced log-probabilities, the length limit)."""

from __future__ import annotations

import itertools

import pytest

from tests.decode.conftest import random_sources
from tests.decode.test_search import CFG, as_src, greedy, never_eos, teacher_forced_logprob
from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import EOS_ID
from tformer_cli.decode import reference
from tformer_cli.decode.search import batched_beam


def test_reference_greedy_logprob_is_the_teacher_forced_sum(trained_model):
    sources, short = random_sources(8, seed=6), DecodeConfig(max_len_a=0.0, max_len_b=2)
    hyps = [reference.greedy_search(trained_model, s, cfg) for cfg in (CFG, short) for s in sources]
    assert any(h.finished for h in hyps) and any(not h.finished for h in hyps)
    for s, h in zip(sources * 2, hyps, strict=True):
        assert EOS_ID not in h.tokens and h.score == h.logprob
        expected = teacher_forced_logprob(trained_model, s, h.tokens, h.finished)
        assert h.logprob == pytest.approx(expected, abs=1e-4)


def test_reference_searches_stop_at_the_length_limit_and_respect_min_len(tiny_model):
    model = never_eos(tiny_model(seed=2))
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1.5, max_len_b=2)
    for source, limit in (([4, 5], 6), ([9], 5), ([10, 11, 12, 13, 14], 11)):  # int(1.5|src| + 2)
        h = reference.greedy_search(model, source, cfg)
        assert len(h.tokens) == limit and not h.finished
        assert [len(h.tokens) for h in reference.beam_search(model, source, cfg)] == [limit] * 3
    free = tiny_model(seed=4)
    cfg = DecodeConfig(beam=2, nbest=2, min_len=4, max_len_a=0.0, max_len_b=8)
    hyps = [reference.greedy_search(free, [5, 6], cfg), *reference.beam_search(free, [5, 6], cfg)]
    assert all(len(h.tokens) >= 4 for h in hyps)


@pytest.mark.parametrize("implementation", ["reference", "search"])
def test_wide_beam_finds_every_hypothesis_of_a_brute_force_search(tiny_model, implementation):
    """Vocabulary <pad> <unk> <s> </s> w: two generable words (<unk>, w) and a limit of 3.
    A beam of 12 keeps every prefix, so its 15-best list must be all 15 candidates (finished
    ones and those cut at the limit), ranked by logprob / lp(|Y|), each logprob from a
    teacher-forced pass. The reference loop and the batched search alike."""
    model = tiny_model(seed=6, vocab_size=5)
    cfg = DecodeConfig(beam=12, nbest=15, alpha=0.6, max_len_a=0.0, max_len_b=3)
    src_row = [4, 1, 4]
    if implementation == "reference":
        found = reference.beam_search(model, src_row, cfg)
    else:
        (found,) = batched_beam(model, as_src([src_row]), cfg)
    candidates = []
    for n in range(3):
        for words in itertools.product([1, 4], repeat=n):
            candidates.append((list(words), True))
    candidates += [(list(w), False) for w in itertools.product([1, 4], repeat=3)]
    assert len(candidates) == 15
    expected = []
    for tokens, finished in candidates:
        lp = teacher_forced_logprob(model, src_row, tokens, finished)
        expected.append((lp / ((5 + len(tokens) + finished) / 6) ** 0.6, tokens, finished))
    expected.sort(key=lambda r: -r[0])
    assert len(found) == 15
    assert sorted((h.tokens, h.finished) for h in found) == sorted((r[1], r[2]) for r in expected)
    assert [h.score for h in found] == pytest.approx([r[0] for r in expected], abs=1e-5)


@pytest.mark.parametrize("cfg", [CFG, DecodeConfig(min_len=3, max_len_a=0.5, max_len_b=4)])
def test_cached_greedy_equals_the_batched_search(trained_model, cfg):
    """The one-sentence greedy with the KV cache against the batched, cached search: the same
    tokens, ends and log-probabilities; sentences finish at different steps."""
    sources = random_sources(8, seed=5)
    hyps = greedy(trained_model, as_src(sources), cfg)
    assert len({(len(h.tokens), h.finished) for h in hyps}) >= 3
    for s, h in zip(sources, hyps, strict=True):
        ours = reference.greedy_search_cached(trained_model, s, cfg)
        assert (ours.tokens, ours.finished) == (h.tokens, h.finished)
        assert ours.logprob == pytest.approx(h.logprob, abs=1e-4) and ours.score == ours.logprob
