"""Tests for the catalogue of tformer_cli.learn: each exercise is a function of tformer named
after it, in the paper's order, and the searches' checks reach every branch."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tformer_cli.learn.exercises import BY_NAME, EXERCISES
from tformer_cli.learn.search_exercises import BEAM, GREEDY


def test_each_solution_is_a_function_of_tformer_defined_where_the_check_says():
    for e in EXERCISES:
        path, name = e.where.split(": ")
        assert name == e.name == e.solution.__name__
        text = (REPO / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", text, re.M), e.where
        assert path.startswith(("tformer_cli/model/", "tformer_cli/decode/reference.py",
                                "tformer_cli/training/", "tformer_cli/report/"))  # fmt: skip


def test_the_exercises_follow_the_paper():
    assert list(BY_NAME)[:11] == [
        "sinusoidal_positions", "attention", "causal_mask", "padding_mask",
        "multi_head_attention", "layer_norm", "residual", "feed_forward", "embed",
        "output_logprobs", "label_smoothed_loss",
    ]  # fmt: skip
    assert all(e.task and e.hint and e.cases for e in EXERCISES)


def test_the_searches_are_checked_on_ends_of_every_kind():
    """Hypotheses ended by </s> and cut at the limit, of several lengths: a search that got one
    of those branches wrong fails its check."""
    hyps = [GREEDY.solution(*c.args()) for c in GREEDY.cases]
    hyps += [h for c in BEAM.cases for h in BEAM.solution(*c.args())]
    assert {h.finished for h in hyps} == {True, False}
    assert len({len(h.tokens) for h in hyps if h.finished}) >= 3
