"""Tests for tformer_cli.learn.checker: what a check reports (passed, not written yet, the first
mismatch with its inputs), that it accepts each correct form of a piece, that it catches a
function that peeks at hidden inputs or loses its gradients, and that it runs a learner's piece
with tformer's own lower pieces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.learn import check
from tformer_cli.learn.checker import FAILED, NOT_WRITTEN, PASSED, expected, load
from tformer_cli.learn.model_exercises import attention_weights
from tformer_cli.model.attention import attention
from tformer_cli.model.functional import multi_head_attention, split_heads


def test_the_worked_example_is_the_classic_one_computed_by_hand():
    """Q = K = [[1,0],[0,1],[1,1]], V = [[1,2],[3,4],[5,6]], d_k = 2: the weights are the row
    softmax of Q K^T / sqrt(2), and the output their average of V's rows."""
    out, weights = expected("attention", 0)
    scores = [[1, 0, 1], [0, 1, 1], [1, 1, 2]]
    for i, row in enumerate(scores):
        e = [math.exp(s / math.sqrt(2)) for s in row]
        w = [x / sum(e) for x in e]
        assert weights[i].tolist() == pytest.approx(w, abs=1e-6)
        by_hand = [w[0] + 3 * w[1] + 5 * w[2], 2 * w[0] + 4 * w[1] + 6 * w[2]]
        assert out[i].tolist() == pytest.approx(by_hand, abs=1e-6)


def test_a_passing_function_shows_as_passed_in_a_notebook():
    def attention(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        weights = (scores if mask is None else scores + mask).softmax(dim=-1)
        return weights @ v, weights

    result = check(attention)
    assert result.status == PASSED and result.passed
    assert "passed" in result._repr_html_() and "green" in result._repr_html_()
    assert str(result).split() == ["attention", "passed"]


def test_a_failure_names_the_case_inputs_first_mismatch_and_a_hint():
    def layer_norm(x, gamma, beta, eps=1e-5):  # no gamma: a mistake with no name
        mean, var = x.mean(-1, keepdim=True), x.var(-1, correction=0, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) + beta

    result = check(layer_norm)
    assert (result.status, result.case, result.mistake) == (FAILED, "random rows", "")
    assert result.inputs == "x (2, 3, 8), gamma (8,), beta (8,)"
    assert result.problem.startswith("output at [0, 0, 0]: expected ")
    assert "got" in result.problem and "square root" in result.hint  # the exercise's own hint
    assert result.solution == "tformer_cli/model/functional.py: layer_norm"
    assert "hint: " in result._repr_html_()


def test_a_stub_or_a_missing_function_is_not_written_yet(tmp_path):
    def attention(q, k, v, mask=None):
        raise NotImplementedError

    assert check(attention).status == NOT_WRITTEN
    (tmp_path / "exercises.py").write_text("def causal_mask(size, device=None):\n    pass\n")
    report = check(tmp_path)
    assert [r.status for r in report.results].count(NOT_WRITTEN) == len(report.results) - 1
    assert not report.passed and "16 not written yet" in report.summary()
    assert report._repr_html_().count("not written yet") == 17  # 16 rows and the summary


def test_an_error_in_the_learner_s_code_is_a_failure_with_its_message():
    def padding_mask(tokens, pad_id):
        raise ValueError("no idea\nsecond line")

    result = check(padding_mask)
    assert result.status == FAILED and result.problem == "raised ValueError: no idea"


def test_a_function_that_peeks_at_what_a_mask_hides_is_caught():
    """A multi-head attention that never passes the mask on: the check changes only the padded
    memory positions, and the output moves."""

    def multi_head_attention(x, memory, weights, h, mask=None):
        w = weights
        q, k, v = (split_heads(t @ m.T + b, h) for t, m, b in
                   ((x, w.w_q, w.b_q), (memory, w.w_k, w.b_k), (memory, w.w_v, w.b_v)))  # fmt: skip
        out, _ = attention(q, k, v)
        return out.transpose(1, 2).flatten(2) @ w.w_o.T + w.b_o

    result = check(multi_head_attention)  # the second sentence is the padded one
    assert result.case == "cross-attention to a padded memory" and not result.mistake
    assert result.problem.startswith(
        "peeks at the padded memory positions: changing only them moved the output at [1, "
    )
    assert "before the softmax" in result.hint


def test_gradients_are_checked_where_a_piece_is_trained():
    def output_logprobs(x, table):
        with torch.no_grad():
            return torch.log_softmax(x @ table.T, dim=-1)

    result = check(output_logprobs)
    assert result.case == "gradients"
    assert result.problem.startswith("the gradient of x: none")
    assert "differentiable" in result.hint


def test_the_dtype_is_checked():
    def attention(q, k, v, mask=None):
        weights = (q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1)
        return weights @ v.float(), weights

    result = check(attention)
    assert result.case == "float64"
    assert result.problem == "output[0]: expected dtype torch.float64, got torch.float32"


def test_each_correct_form_passes():
    """Fused Q, K, V projections; an index_copy_ into the cache; coins drawn another way."""

    def multi_head_attention(x, memory, weights, h, mask=None):
        w = weights
        if x is memory:  # self-attention: one fused projection, then split
            qkv = x @ torch.cat([w.w_q, w.w_k, w.w_v]).T + torch.cat([w.b_q, w.b_k, w.b_v])
            q, k, v = (split_heads(t, h) for t in qkv.chunk(3, dim=-1))
        else:
            q = split_heads(x @ w.w_q.T + w.b_q, h)
            kv = memory @ torch.cat([w.w_k, w.w_v]).T + torch.cat([w.b_k, w.b_v])
            k, v = (split_heads(t, h) for t in kv.chunk(2, dim=-1))
        out, _ = attention(q, k, v, mask)
        return out.transpose(1, 2).flatten(2) @ w.w_o.T + w.b_o

    def write_cache(cache, slots, kv, span):
        cache.index_copy_(3, slots, kv)
        return cache[0, :, :, :span], cache[1, :, :, :span]

    def mix_inputs(tgt_in, predicted, eps, generator):
        model = torch.cat([tgt_in[:, :1], predicted[:, :-1]], dim=1)
        keep = torch.bernoulli(torch.full(tgt_in.shape, eps), generator=generator).bool()
        keep |= (tgt_in == 2) | (tgt_in == 0)
        return torch.where(keep, tgt_in, model)

    for fn in (multi_head_attention, write_cache, mix_inputs):
        assert check(fn).status == PASSED, check(fn)


def test_a_piece_is_checked_with_tformer_s_lower_pieces_and_the_module_is_restored(
    solutions_file: Path,
):
    """A learner whose attention has no scale still passes multi-head attention, which calls
    it: during that check, ``attention`` in the learner's module is tformer's; after it, the
    learner's own again, with which the same function gives other values."""
    learner = load(solutions_file)

    def attention(q, k, v, mask=None):
        weights = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return weights @ v, weights

    learner["attention"] = attention
    mha = learner["multi_head_attention"]
    assert check(mha).status == PASSED and learner["attention"] is attention
    assert check(attention).mistake == "no 1/sqrt(d_k)"
    x, w = torch.randn(1, 3, 8), attention_weights()
    assert not torch.allclose(mha(x, x, w, 2), multi_head_attention(x, x, w, 2), atol=1e-3)


def test_a_file_that_does_not_load_is_a_one_line_error(tmp_path):
    bad = tmp_path / "exercises.py"
    bad.write_text("def attention(q, k, v, mask=None)\n    return q\n")
    with pytest.raises(TformerError, match=r"exercises.py, line 1: "):
        check(bad)
    bad.write_text("import no_such_module\n")
    with pytest.raises(TformerError, match="fails as it loads: ModuleNotFoundError"):
        check(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TformerError, match=r"holds no exercises\.py"):
        check(tmp_path / "empty")
    with pytest.raises(TformerError, match="no such file or folder"):
        check(tmp_path / "nowhere.py")
    with pytest.raises(TformerError, match="no exercise 'attn': the exercises are"):
        check(tmp_path, "attn")
