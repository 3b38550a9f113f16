"""Tests for tformer_cli.model.attention: eq. 1 by hand, the masks, explicit path == SDPA path."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.model.attention import (
    MultiHeadAttention,
    attention,
    causal_mask,
    fold_beams,
    padding_mask,
    unfold_beams,
)

INF = float("inf")


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None):
    """softmax(q k^T / sqrt(d_k) + mask) v with Python loops and ``math.exp`` (4-D inputs)."""
    B, h, T, d_k = q.shape
    S = k.size(2)
    full = torch.zeros(B, h, T, S) if mask is None else mask.expand(B, h, T, S)
    out = torch.zeros(B, h, T, v.size(-1), dtype=torch.float64)
    weights = torch.zeros(B, h, T, S, dtype=torch.float64)
    for b in range(B):
        for i in range(h):
            for t in range(T):
                scores = []
                for s in range(S):
                    dot = sum(float(q[b, i, t, c]) * float(k[b, i, s, c]) for c in range(d_k))
                    scores.append(dot / math.sqrt(d_k) + float(full[b, i, t, s]))
                top = max(scores)
                exps = [math.exp(x - top) if x != -INF else 0.0 for x in scores]
                total = sum(exps)
                for s in range(S):
                    weights[b, i, t, s] = exps[s] / total
                    out[b, i, t] += weights[b, i, t, s] * v[b, i, s].double()
    return out, weights


# ---------------------------------------------------------------------------- masks
def test_causal_mask_matches_docstring_matrix():
    expected = torch.tensor([[0.0, -INF, -INF], [0.0, 0.0, -INF], [0.0, 0.0, 0.0]])
    assert torch.equal(causal_mask(3), expected)


def test_causal_mask_hides_exactly_the_future():
    m = causal_mask(6)
    assert m.shape == (6, 6)
    for i in range(6):
        for j in range(6):
            assert m[i, j] == (-INF if j > i else 0.0)


def test_padding_mask_is_minus_inf_at_pad_positions_with_broadcast_shape():
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [9, 9, 9, 9]])
    m = padding_mask(tokens, pad_id=0)
    assert m.shape == (3, 1, 1, 4)
    expected = torch.tensor([[0.0, 0.0, 0.0, -INF], [0.0, -INF, -INF, -INF], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(m[:, 0, 0, :], expected)


def test_padding_mask_uses_the_given_pad_id():
    m = padding_mask(torch.tensor([[1, 2, 1]]), pad_id=1)
    assert torch.equal(m[0, 0, 0], torch.tensor([-INF, 0.0, -INF]))


# ---------------------------------------------------------------------------- eq. 1 by hand
Q_EXAMPLE = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
V_EXAMPLE = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]


def hand_example() -> tuple[list[list[float]], list[list[float]]]:
    """Weights and output of the 3-token example, computed with ``math`` only."""
    weights, out = [], []
    for qi in Q_EXAMPLE:
        scores = [(qi[0] * kj[0] + qi[1] * kj[1]) / math.sqrt(2) for kj in Q_EXAMPLE]
        exps = [math.exp(s) for s in scores]
        row = [e / sum(exps) for e in exps]
        weights.append(row)
        out.append([sum(row[j] * V_EXAMPLE[j][c] for j in range(3)) for c in range(2)])
    return weights, out


def test_attention_matches_the_hand_computed_example():
    q = torch.tensor(Q_EXAMPLE)[None, None]  # (1, 1, 3, 2)
    v = torch.tensor(V_EXAMPLE)[None, None]
    out, weights = attention(q, q, v)
    hand_weights, hand_out = hand_example()
    # the first row by hand once more: scores [1, 0, 1]/sqrt 2
    a, b = math.exp(1 / math.sqrt(2)), 1.0
    assert hand_weights[0] == pytest.approx([a / (2 * a + b), b / (2 * a + b), a / (2 * a + b)])
    assert torch.allclose(weights[0, 0], torch.tensor(hand_weights), atol=1e-6, rtol=0)
    assert torch.allclose(out[0, 0], torch.tensor(hand_out), atol=1e-6, rtol=0)


def test_sdpa_gives_the_hand_computed_example_output():
    q = torch.tensor(Q_EXAMPLE)[None, None]
    v = torch.tensor(V_EXAMPLE)[None, None]
    _, hand_out = hand_example()
    out = F.scaled_dot_product_attention(q, q, v)
    assert torch.allclose(out[0, 0], torch.tensor(hand_out), atol=1e-6, rtol=0)


def test_attention_weights_are_zero_on_masked_keys_and_rows_sum_to_one():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3)
    tokens = torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0]])
    mask = padding_mask(tokens, 0) + causal_mask(4)  # (2, 1, 4, 4)
    out, weights = attention(q, k, v, mask)
    ref_out, ref_weights = naive_attention(q, k, v, mask)
    assert torch.allclose(weights.double(), ref_weights, atol=1e-6)
    assert torch.allclose(out.double(), ref_out, atol=1e-5)
    assert torch.all(weights[0, :, :, 3] == 0) and torch.all(weights[1, :, :, 2:] == 0)
    assert torch.all(weights.triu(1) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 4))


# ---------------------------------------------------------------------------- two paths, one result
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_attention_equals_sdpa_with_masks(causal):
    torch.manual_seed(1)
    B, h, T, d_k = 3, 2, 5, 4
    q, k, v = (torch.randn(B, h, T, d_k) for _ in range(3))
    tokens = torch.tensor([[4] * 5, [4, 4, 4, 0, 0], [4, 0, 0, 0, 0]])
    mask = padding_mask(tokens, 0)  # (B, 1, 1, T)
    if causal:
        mask = mask + causal_mask(T)  # (B, 1, T, T)
    explicit, _ = attention(q, k, v, mask)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(explicit, fused, atol=1e-5, rtol=0)


def per_head_reference(m: MultiHeadAttention, x, mask=None, memory=None):
    """Concat_i softmax(Q_i K_i^T / sqrt(d_k) + M) V_i, then W_O: one head at a time."""
    d = x.size(-1)
    if m.cross:
        q = x @ m.w_q.weight.T + m.w_q.bias
        kv = memory @ m.w_kv.weight.T + m.w_kv.bias
        k, v = kv[..., :d], kv[..., d:]
    else:
        qkv = x @ m.w_qkv.weight.T + m.w_qkv.bias
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    heads = []
    for i in range(m.h):
        cols = slice(i * m.d_k, (i + 1) * m.d_k)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(m.d_k)  # (B, T, S)
        if mask is not None:
            scores = scores + mask[:, 0]
        heads.append(scores.softmax(-1) @ v[..., cols])
    return torch.cat(heads, dim=-1) @ m.w_o.weight.T + m.w_o.bias


@pytest.mark.parametrize("record", [False, True])
def test_self_attention_module_equals_per_head_reference(record):
    torch.manual_seed(2)
    m = MultiHeadAttention(16, 4, cross=False).eval()
    m.record_weights = record
    x = torch.randn(2, 5, 16)
    mask = padding_mask(torch.tensor([[4, 4, 4, 4, 4], [4, 4, 4, 0, 0]]), 0) + causal_mask(5)
    with torch.no_grad():
        assert torch.allclose(m(x, mask), per_head_reference(m, x, mask), atol=1e-5)


@pytest.mark.parametrize("record", [False, True])
def test_cross_attention_module_equals_per_head_reference(record):
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 2, cross=True).eval()
    m.record_weights = record
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    mask = padding_mask(torch.tensor([[4, 4, 4, 4, 4, 4], [4, 4, 0, 0, 0, 0]]), 0)
    with torch.no_grad():
        out = m(x, mask, kv=m.project_kv(memory))
        assert torch.allclose(out, per_head_reference(m, x, mask, memory), atol=1e-5)


def test_multi_head_attention_explicit_path_equals_sdpa_path_and_keeps_weights():
    torch.manual_seed(4)
    m = MultiHeadAttention(16, 4, cross=False).eval()
    x = torch.randn(3, 6, 16)
    tokens = torch.tensor([[4] * 6, [4] * 4 + [0] * 2, [4] + [0] * 5])
    mask = padding_mask(tokens, 0) + causal_mask(6)
    with torch.no_grad():
        fused = m(x, mask)
        m.record_weights = True
        explicit = m(x, mask)
    assert torch.allclose(explicit, fused, atol=1e-5, rtol=0)
    assert m.weights is not None and m.weights.shape == (3, 4, 6, 6)
    assert torch.allclose(m.weights.sum(-1), torch.ones(3, 4, 6), atol=1e-6)
    assert torch.all(m.weights[1, :, :, 4:] == 0)


@pytest.mark.parametrize("record", [False, True])
def test_cross_attention_shares_memory_kv_across_beams(record):
    """n beams per sentence (rows sentence-major) == each beam given its own copy of K, V."""
    torch.manual_seed(5)
    m = MultiHeadAttention(16, 4, cross=True).eval()
    m.record_weights = record
    n, T = 3, 2
    memory = torch.randn(2, 5, 16)
    mask = padding_mask(torch.tensor([[4, 4, 4, 4, 4], [4, 4, 4, 0, 0]]), 0)  # (2, 1, 1, 5)
    x = torch.randn(2 * n, T, 16)  # rows: s0b0 s0b1 s0b2 s1b0 s1b1 s1b2
    with torch.no_grad():
        kv = m.project_kv(memory)  # (2, B', h, S, d_k)
        shared = m(x, mask, kv=kv)
        shared_w = m.weights
        copied = m(x, mask.repeat_interleave(n, 0), kv=kv.repeat_interleave(n, 1))
        copied_w = m.weights
    assert shared.shape == (2 * n, T, 16)
    assert torch.allclose(shared, copied, atol=1e-5, rtol=0)
    if record:
        assert shared_w.shape == (2 * n, 4, T, 5)
        assert torch.allclose(shared_w, copied_w, atol=1e-6)


def filled_slots(t: int, span: int) -> torch.Tensor:
    """The additive mask (1, span) of a query at slot t over a buffer of ``span`` slots."""
    return torch.zeros(1, span).masked_fill(torch.arange(span) > t, float("-inf"))


def test_fold_beams_makes_a_sentences_beams_its_query_rows_and_unfold_undoes_it():
    q = torch.randn(6, 2, 3, 4)  # 3 sentences x 2 beams (sentence-major), h 2, T 3, d_k 4
    folded = fold_beams(q, 2)
    assert folded.shape == (3, 2, 6, 4)
    assert torch.equal(folded[1, :, :3], q[2]) and torch.equal(folded[1, :, 3:], q[3])
    assert torch.equal(unfold_beams(folded, 2), q)
    assert fold_beams(q, 1) is q and unfold_beams(q, 1) is q


def test_cached_self_attention_writes_keys_in_place_and_matches_full_pass():
    torch.manual_seed(6)
    m = MultiHeadAttention(16, 4, cross=False).eval()
    x = torch.randn(2, 5, 16)
    kv_buf = torch.zeros(2, 2, 4, 8, 4)  # (K/V, B, h, T_max, d_k)
    ptr = kv_buf.data_ptr()
    with torch.no_grad():
        full = m(x, causal_mask(5))
        steps = [
            m(x[:, t : t + 1], filled_slots(t, 8), cache=kv_buf, slots=torch.tensor([t]))
            for t in range(5)
        ]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert kv_buf.data_ptr() == ptr
    assert torch.all(kv_buf[..., 5:, :] == 0) and torch.all(kv_buf[..., :5, :] != 0)
