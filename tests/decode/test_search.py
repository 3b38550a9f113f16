"""Tests for tformer_cli.decode.search: greedy and beam search against naive references, the cache,
batching, the length limit, scores recomputed by a teacher-forced pass, sampling and ensembles."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from tests.decode.conftest import random_sources
from tformer_cli.config import DecodeConfig, SamplingConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.decode import reference
from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.search import (
    Rows,
    batched_beam,
    batched_greedy,
    max_lengths,
    search,
)
from tformer_cli.decode.translate import translate_ids
from tformer_cli.errors import TformerError
from tformer_cli.model import Transformer

CFG = DecodeConfig(max_len_a=1.0, max_len_b=3)


def greedy(*args, **kwargs) -> list[Hypothesis]:
    """``batched_greedy``'s hypothesis of each sentence."""
    return [h for (h,) in batched_greedy(*args, **kwargs)]


def as_src(sources: list[list[int]]) -> torch.Tensor:
    return pad([[*s, EOS_ID] for s in sources])


def teacher_forced_logprob(model: Transformer, src_row: list[int], tokens, finished) -> float:
    """Sum of log-softmax of the tokens (+ ``</s>`` when finished) given the gold prefix."""
    gold = [*tokens, EOS_ID] if finished else list(tokens)
    src = torch.tensor([[*src_row, EOS_ID]])
    y = torch.tensor([[BOS_ID, *gold[:-1]]])
    with torch.no_grad():
        logp = model(src, y)[0].double().log_softmax(-1)
    return float(sum(logp[t, g] for t, g in enumerate(gold)))


# ---------------------------------------------------------------------------- greedy
def test_trained_fixture_finishes_sentences_at_different_steps(trained_model):
    hyps = greedy(trained_model, as_src(random_sources(8, seed=2)), CFG)
    assert sum(h.finished for h in hyps) >= 4
    assert len({len(h.tokens) for h in hyps if h.finished}) >= 3


@pytest.mark.parametrize("which", ["trained", "random"])
@pytest.mark.parametrize("cfg", [CFG, DecodeConfig(min_len=3, max_len_a=0.5, max_len_b=4)])
def test_greedy_equals_the_reference_loop(trained_model, tiny_model, which, cfg):
    """The batched, cached search against ``reference.greedy_search``: one sentence at a time,
    the whole prefix decoded again each step."""
    model = trained_model if which == "trained" else tiny_model(seed=8)
    sources = random_sources(6, seed=3)
    for use_cache in (True, False):
        hyps = greedy(model, as_src(sources), cfg, use_cache=use_cache)
        for s, h in zip(sources, hyps, strict=True):
            ref = reference.greedy_search(model, s, cfg)
            assert (h.tokens, h.finished) == (ref.tokens, ref.finished)
            assert h.logprob == pytest.approx(ref.logprob, abs=1e-4)


@pytest.mark.parametrize("which", ["trained", "random"])
def test_greedy_with_cache_equals_greedy_without_cache(trained_model, tiny_model, which):
    model = trained_model if which == "trained" else tiny_model(seed=1)
    src = as_src(random_sources(7, seed=4))
    cached = greedy(model, src, CFG, use_cache=True)
    plain = greedy(model, src, CFG, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in plain]
    assert [h.finished for h in cached] == [h.finished for h in plain]
    for a, b in zip(cached, plain, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert a.score == pytest.approx(b.score, abs=1e-5)


def test_batched_greedy_equals_one_sentence_at_a_time(trained_model):
    sources = random_sources(8, seed=5)
    batched = greedy(trained_model, as_src(sources), CFG)
    for s, h in zip(sources, batched, strict=True):
        (alone,) = greedy(trained_model, as_src([s]), CFG)
        assert (alone.tokens, alone.finished) == (h.tokens, h.finished)
        assert alone.logprob == pytest.approx(h.logprob, abs=1e-4)


def test_greedy_logprob_equals_teacher_forced_sum(trained_model):
    sources = random_sources(8, seed=6)
    hyps = greedy(trained_model, as_src(sources), CFG)
    assert any(h.finished for h in hyps) and any(h.tokens for h in hyps)
    for s, h in zip(sources, hyps, strict=True):
        expected = teacher_forced_logprob(trained_model, s, h.tokens, h.finished)
        assert h.logprob == pytest.approx(expected, abs=1e-4)
        assert h.score == pytest.approx(h.logprob, abs=1e-6)  # greedy: no length penalty


def never_eos(model: Transformer) -> Transformer:
    model.generator.register_forward_hook(lambda m, inp, out: out.index_fill(-1, _EOS, -1e4))
    return model


_EOS = torch.tensor([EOS_ID])


def test_length_limit_a_times_src_plus_b_is_respected_exactly(tiny_model):
    model = never_eos(tiny_model(seed=2))
    cfg = DecodeConfig(max_len_a=1.5, max_len_b=2)
    sources = [[4, 5], [6, 7, 8], [9], [10, 11, 12, 13, 14]]
    # |src| counts </s>: 3, 4, 2, 6 tokens -> int(1.5 * n + 2) = 6, 8, 5, 11
    hyps = greedy(model, as_src(sources), cfg)
    assert [len(h.tokens) for h in hyps] == [6, 8, 5, 11]
    assert not any(h.finished for h in hyps)
    assert EOS_ID not in [t for h in hyps for t in h.tokens]
    results = translate_ids(model, sources, cfg)
    assert [len(r.hypotheses[0].tokens) for r in results] == [6, 8, 5, 11]
    assert [r.hypotheses[0].finished for r in results] == [False] * 4


def test_length_limit_is_capped_by_max_positions(tiny_model):
    model = never_eos(tiny_model(seed=3, max_positions=8))
    (h,) = greedy(model, as_src([[4, 5]]), DecodeConfig(max_len_a=2.0, max_len_b=50))
    assert len(h.tokens) == 7 and not h.finished


def test_max_lengths_by_hand():
    src = torch.tensor([[4, 5, 3, 0, 0], [4, 5, 6, 7, 3], [3, 0, 0, 0, 0]])
    cfg = DecodeConfig(max_len_a=1.5, max_len_b=10)
    assert max_lengths(src, cfg, 1024).tolist() == [14, 17, 11]  # 14.5, 17.5, 11.5 floored
    assert max_lengths(src, cfg, 16).tolist() == [14, 15, 11]
    assert max_lengths(src, DecodeConfig(max_len_a=0.0, max_len_b=0), 16).tolist() == [1, 1, 1]


def test_greedy_never_generates_pad_or_bos(tiny_model):
    model = tiny_model(seed=4)
    bias = torch.zeros(40)
    bias[PAD_ID] = bias[BOS_ID] = 1e3  # the model's favourite tokens, yet never generated
    model.generator.register_forward_hook(lambda m, inp, out: out + bias)
    hyps = greedy(model, as_src([[4, 5, 6], [7]]), CFG)
    tokens = [t for h in hyps for t in h.tokens]
    assert tokens and PAD_ID not in tokens and BOS_ID not in tokens


# ---------------------------------------------------------------------------- beam
def test_beam_size_one_equals_greedy(trained_model):
    src = as_src(random_sources(6, seed=7))
    argmax = greedy(trained_model, src, CFG)
    beam = batched_beam(trained_model, src, DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3))
    assert [b[0].tokens for b in beam] == [g.tokens for g in argmax]
    assert [b[0].logprob for b in beam] == pytest.approx([g.logprob for g in argmax], abs=1e-4)


@pytest.mark.parametrize("which", ["trained", "random"])
@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(beam=2, nbest=2, alpha=0.0, max_len_a=1.0, max_len_b=3),
        DecodeConfig(beam=3, nbest=3, alpha=0.6, max_len_a=1.0, max_len_b=3),
        DecodeConfig(beam=4, nbest=2, alpha=1.0, min_len=2, max_len_a=0.5, max_len_b=4),
    ],
)
def test_beam_equals_the_reference_loop(trained_model, tiny_model, which, cfg):
    """The batched, cached beam against ``reference.beam_search`` (lists, one sentence, the
    whole prefix decoded again each step): the same n-best lists, in order, the same scores."""
    model = trained_model if which == "trained" else tiny_model(seed=9)
    sources = random_sources(5, seed=11)
    for s, nbest in zip(sources, batched_beam(model, as_src(sources), cfg), strict=True):
        ref = reference.beam_search(model, s, cfg)
        assert [(h.tokens, h.finished) for h in nbest] == [(h.tokens, h.finished) for h in ref]
        assert [h.score for h in nbest] == pytest.approx([h.score for h in ref], abs=1e-5)
        assert [h.logprob for h in nbest] == pytest.approx([h.logprob for h in ref], abs=1e-4)


@pytest.mark.parametrize("which", ["trained", "random"])
def test_beam_with_cache_equals_beam_without_cache(trained_model, tiny_model, which):
    model = trained_model if which == "trained" else tiny_model(seed=5)
    src = as_src(random_sources(5, seed=8))
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1.0, max_len_b=3)
    cached = batched_beam(model, src, cfg, use_cache=True)
    plain = batched_beam(model, src, cfg, use_cache=False)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in plain]
    for a, b in zip(itertools.chain(*cached), itertools.chain(*plain), strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-5)


def test_batched_beam_equals_one_sentence_at_a_time(trained_model):
    sources = random_sources(5, seed=9)
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=3)
    batched = batched_beam(trained_model, as_src(sources), cfg)
    for s, nbest in zip(sources, batched, strict=True):
        (alone,) = batched_beam(trained_model, as_src([s]), cfg)
        assert [h.tokens for h in alone] == [h.tokens for h in nbest]


def test_beam_scores_are_teacher_forced_logprob_over_gnmt_penalty(trained_model):
    sources = random_sources(4, seed=10)
    cfg = DecodeConfig(beam=4, nbest=4, alpha=0.6, max_len_a=1.0, max_len_b=3)
    for s, nbest in zip(sources, batched_beam(trained_model, as_src(sources), cfg), strict=True):
        assert 1 <= len(nbest) <= 4
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        for h in nbest:
            expected = teacher_forced_logprob(trained_model, s, h.tokens, h.finished)
            assert h.logprob == pytest.approx(expected, abs=1e-4)
            n = len(h.tokens) + h.finished  # |Y| counts </s>
            assert h.score == pytest.approx(h.logprob / ((5 + n) / 6) ** 0.6, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_forbids_eos_before_it_and_forced_lengths_equal_min_len(tiny_model, beam):
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    cfg = DecodeConfig(beam=beam, min_len=6, max_len_a=0, max_len_b=6)
    for nbest in search(model, src, cfg):
        assert all(len(h.tokens) == 6 and not h.finished for h in nbest)
    free = search(model, src, DecodeConfig(beam=beam, min_len=2, max_len_a=0, max_len_b=12))
    assert all(len(h.tokens) >= 2 or not h.finished for nbest in free for h in nbest)


# ---------------------------------------------------------------------------- sampling, MBR, ense
def sampled(model, src, seed: int = 5, use_cache: bool = True, **settings) -> list[list[int]]:
    cfg = DecodeConfig(max_len_a=1.0, max_len_b=3, sampling=SamplingConfig(**settings), seed=seed)
    return [h.tokens for nbest in search(model, src, cfg, use_cache, "off") for h in nbest]


def test_sampling_at_a_vanishing_temperature_or_top_k_one_is_greedy(trained_model):
    src = as_src(random_sources(12, seed=40))
    argmax = [h.tokens for h in greedy(trained_model, src, CFG)]
    assert sampled(trained_model, src, temperature=1e-4) == argmax
    assert sampled(trained_model, src, top_k=1) == argmax
    assert sampled(trained_model, src, temperature=3.0) != greedy  # it does sample


def test_a_seed_gives_the_same_samples_with_and_without_the_cache(trained_model):
    src = as_src(random_sources(12, seed=41))
    cached = sampled(trained_model, src, temperature=2.0)
    assert cached == sampled(trained_model, src, temperature=2.0, use_cache=False)
    assert cached == sampled(trained_model, src, temperature=2.0)  # repeatable
    assert cached != sampled(trained_model, src, seed=6, temperature=2.0)


def test_sampled_scores_are_the_models_own_logprob(trained_model):
    """Whatever truncation draws the tokens, a sample's logprob is the model's (TF pass)."""
    src = as_src(random_sources(6, seed=42))
    cfg = DecodeConfig(max_len_a=1.0, max_len_b=3, sampling=SamplingConfig(top_k=3), nbest=2)
    for row, nbest in zip(src, search(trained_model, src, cfg, compile="off"), strict=True):
        assert len(nbest) == 2
        for h in nbest:
            y = torch.tensor([[BOS_ID, *h.tokens]])
            gold = torch.tensor([[*h.tokens, EOS_ID]])[:, : y.size(1)]
            with torch.inference_mode():
                lp = trained_model(row[None], y).log_softmax(-1).gather(2, gold[..., None]).sum()
            assert h.logprob == pytest.approx(float(lp), abs=1e-4) or not h.finished


def test_an_ensemble_of_one_run_is_the_run_and_of_a_run_with_itself_gives_its_tokens(
    trained_model,
):
    src = as_src(random_sources(10, seed=43))
    for cfg in (CFG, dataclasses.replace(CFG, beam=3, nbest=3)):
        alone = search(trained_model, src, cfg, compile="off")
        assert search([trained_model], src, cfg, compile="off") == alone
        twice = search([trained_model, trained_model], src, cfg, compile="off")
        assert [[h.tokens for h in n] for n in twice] == [[h.tokens for h in n] for n in alone]
        for a, b in zip(twice, alone, strict=True):  # log((p + p) / 2) = log p
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_an_ensemble_averages_probabilities(tiny_model):
    a, b = tiny_model(seed=1), tiny_model(seed=2)
    src = as_src(random_sources(3, seed=44, vocab=40))
    with torch.inference_mode():
        state = Rows([a, b], src, 1, 4, use_cache=True, compile="off")
        y = torch.full((src.size(0), 5), BOS_ID)
        both = state.logprobs(y, 0)
        alone = [Rows([m], src, 1, 4, True, "off").logprobs(y, 0) for m in (a, b)]
    mean = (alone[0].exp() + alone[1].exp()) / 2
    assert torch.allclose(both.exp(), mean, atol=1e-6)


def test_runs_with_different_tokenizers_make_no_ensemble(tmp_path, make_run):
    from tformer_cli.checkpoint import load_runs
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer

    a, _ = make_run(tmp_path / "a")
    b, _ = make_run(tmp_path / "b", seed=1)
    assert len(load_runs([a, b], "cpu")) == 2
    words = [f"w{i}" for i in range(100)]  # another vocabulary of the same size
    other = train_tokenizer(
        [" ".join(words)] * 3,
        vocab_size=load_runs([a])[0].config.model.vocab_size,
        kind="wordlevel",
        min_frequency=1,
    )
    save_tokenizer(other, b / "tokenizer.json")
    with pytest.raises(TformerError, match="different tokenizers"):
        load_runs([a, b], "cpu")
