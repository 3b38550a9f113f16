"""The traced search: the same hypotheses and scores as the untraced one, and a faithful record
of each step."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from tests.decode.conftest import random_sources
from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import EOS_ID
from tformer_cli.decode.search import search
from tformer_cli.decode.trace import FINISHED, KEPT, PRUNED, trace_search

CFG = DecodeConfig(max_len_a=1.0, max_len_b=3, alpha=0.6)


def one(source: list[int]) -> torch.Tensor:
    return pad([[*source, EOS_ID]])  # (1, S)


@pytest.mark.parametrize("beam", [1, 2, 5])
def test_traced_search_ends_with_the_untraced_n_best(trained_model, beam):
    cfg = dataclasses.replace(CFG, beam=beam, nbest=beam)
    for source in random_sources(12, seed=7):
        expected = search(trained_model, one(source), cfg)[0]
        got = trace_search(trained_model, one(source), cfg).final
        assert [h.tokens for h in got] == [h.tokens for h in expected]
        assert [h.finished for h in got] == [h.finished for h in expected]
        for g, e in zip(got, expected, strict=True):
            assert g.score == pytest.approx(e.score, abs=1e-6)
            assert g.logprob == pytest.approx(e.logprob, abs=1e-6)


def test_an_untrained_model_that_rarely_ends_gives_the_same_trace_results(tiny_model):
    model = tiny_model(seed=3)  # hypotheses stop at the length limit, not at </s>
    cfg = dataclasses.replace(CFG, beam=3, nbest=3)
    for source in random_sources(4, seed=2, vocab=40):
        expected = search(model, one(source), cfg)[0]
        got = trace_search(model, one(source), cfg).final
        assert [(h.tokens, h.finished) for h in got] == [(h.tokens, h.finished) for h in expected]


def test_each_step_records_live_hypotheses_their_best_next_tokens_and_their_fate(trained_model):
    cfg = dataclasses.replace(CFG, beam=3, nbest=3)
    trace = trace_search(trained_model, one([5, 6, 7, 8]), cfg, top=4)
    assert len(trace.steps[0]) == 1 and trace.steps[0][0].parent is None
    numbers = {h.number for step in trace.steps for h in step}
    for t, step in enumerate(trace.steps):
        assert 1 <= len(step) <= 3
        kept = [c for h in step for c in h.candidates if c.status == KEPT]
        assert len(kept) <= 3
        for h in step:
            assert len(h.tokens) == t
            assert len(h.candidates) == 4
            assert {c.status for c in h.candidates} <= {KEPT, PRUNED, FINISHED}
            logps = [c.logprob for c in h.candidates]
            assert logps == sorted(logps, reverse=True)
            assert sum(math.exp(v) for v in logps) <= 1 + 1e-5
            assert h.parent is None or h.parent in numbers
            assert h.attention.shape == (2, 4, 5)  # (L, h, S): 4 source tokens and </s>
            assert torch.allclose(h.attention.sum(-1), torch.ones(2, 4), atol=1e-5)
        if t + 1 < len(trace.steps):  # the kept candidates are the next step's hypotheses
            nxt = sorted(tuple(h.tokens) for h in trace.steps[t + 1])
            grown = sorted(
                (*h.tokens, c.token) for h in step for c in h.candidates if c.status == KEPT
            )
            assert grown == nxt
    finished = {tuple(h.tokens) for h in trace.final if h.finished}
    ended = {
        (*h.tokens,) for step in trace.steps for h in step
        for c in h.candidates if c.status == FINISHED and c.token == EOS_ID
    }  # fmt: skip
    assert finished <= ended


def test_greedy_trace_keeps_the_argmax_and_prunes_the_rest(trained_model):
    trace = trace_search(trained_model, one([9, 10, 11]), CFG, top=3)
    for step in trace.steps:
        (h,) = step
        assert h.candidates[0].status in (KEPT, FINISHED)
        assert all(c.status == PRUNED for c in h.candidates[1:])


class Pieces:
    """A tokenizer's two methods the JSON needs: token ``i`` is ``w<i>``."""

    def id_to_token(self, i: int) -> str:
        return f"w{i}"

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(self.id_to_token, ids))


def test_trace_json_names_tokens_and_probabilities(trained_model):
    cfg = dataclasses.replace(CFG, beam=2, nbest=2)
    trace = trace_search(trained_model, one([5, 6, 7]), cfg, top=2)
    data = json.loads(trace.to_json(Pieces(), "a b c"))
    assert data["source"] == "a b c" and data["beam"] == 2
    assert data["source_tokens"] == ["w5", "w6", "w7", "</s>"]
    first = data["steps"][0][0]
    assert first["parent"] is None and len(first["next"]) == 2
    assert first["next"][0]["p"] == pytest.approx(math.exp(first["next"][0]["logprob"]), abs=1e-5)
    assert len(data["final"]) == len(trace.final)
