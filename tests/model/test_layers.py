"""Tests for tformer_cli.model.layers: positional encoding, embeddings, FFN, residual + norm."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.model.layers import (
    Embeddings,
    FeedForward,
    Residual,
    dropout,
    sinusoidal_positions,
)


def pe_by_hand(max_len: int, d: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    for pos in range(max_len):
        for col in range(d):
            two_i = col - col % 2
            angle = pos / 10000 ** (two_i / d)
            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("d", [2, 6, 7, 32])
def test_sinusoidal_positions_follow_the_paper_formula(d):
    pe = sinusoidal_positions(50, d)
    assert pe.shape == (50, d)
    assert torch.allclose(pe.double(), pe_by_hand(50, d), atol=1e-5, rtol=0)


def test_sinusoidal_positions_first_rows_by_hand():
    pe = sinusoidal_positions(2, 4)
    # pos 0: sin 0, cos 0, sin 0, cos 0; pos 1: sin 1, cos 1, sin 1/100, cos 1/100
    expected = [[0, 1, 0, 1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]]
    assert torch.allclose(pe, torch.tensor(expected, dtype=torch.float32), atol=1e-7)


def test_embedding_is_token_vector_times_sqrt_d_model_plus_sinusoid(tiny_cfg):
    torch.manual_seed(0)
    emb = Embeddings(tiny_cfg(d_model=8, dropout=0.0)).eval()
    tokens = torch.tensor([[5, 9, 0, 3], [7, 7, 7, 7]])
    E, pe = emb.tokens.weight.detach().double(), pe_by_hand(10, 8)
    out = emb(tokens).double()
    for b in range(2):
        for t in range(4):
            expected = E[int(tokens[b, t])] * math.sqrt(8) + pe[t]
            assert torch.allclose(out[b, t], expected, atol=1e-5)
    # decoding step t sees the position t, not 0
    shifted = emb(tokens[:, 2:3], torch.tensor([2])).double()
    assert torch.allclose(shifted[:, 0], E[tokens[:, 2]] * math.sqrt(8) + pe[2], atol=1e-5)


def test_learned_positions_are_added_per_position(tiny_cfg):
    torch.manual_seed(1)
    emb = Embeddings(tiny_cfg(d_model=8, positional="learned")).eval()
    assert isinstance(emb.learned, torch.nn.Parameter)
    assert not hasattr(emb, "sinusoid")
    tokens = torch.tensor([[4, 5, 6]])
    E, P = emb.tokens.weight.detach(), emb.learned.detach()
    out = emb(tokens, torch.arange(1, 1 + tokens.size(1))).detach()
    expected = E[tokens[0]] * math.sqrt(8) + P[1:4]
    assert torch.allclose(out[0], expected, atol=1e-6)


def test_embedding_dropout_is_active_in_training_only(tiny_cfg):
    torch.manual_seed(2)
    emb = Embeddings(tiny_cfg(d_model=8, dropout=0.5))
    tokens = torch.tensor([[4, 5, 6, 7]])
    emb.eval()
    a, b = emb(tokens), emb(tokens)
    assert torch.equal(a, b)
    emb.train()
    dropped = emb(tokens)
    assert (dropped == 0).any() and not torch.equal(dropped, a)


def test_feed_forward_is_relu_of_first_layer_then_second_layer():
    torch.manual_seed(3)
    ffn = FeedForward(4, 16).eval()
    x = torch.randn(2, 3, 4)
    W1, b1 = ffn.w_1.weight.detach(), ffn.w_1.bias.detach()
    W2, b2 = ffn.w_2.weight.detach(), ffn.w_2.bias.detach()
    expected = torch.clamp(x @ W1.T + b1, min=0) @ W2.T + b2  # max(0, x W1 + b1) W2 + b2
    assert torch.allclose(ffn(x).detach(), expected, atol=1e-6)
    assert ffn.w_1.out_features == 16


def test_feed_forward_with_silu_is_silu_of_first_layer_then_second_layer():
    torch.manual_seed(3)
    ffn = FeedForward(4, 16, "silu").eval()
    x = torch.randn(2, 3, 4)
    z = ffn.w_1(x)
    assert torch.allclose(ffn(x), ffn.w_2(z * torch.sigmoid(z)), atol=1e-6)  # SiLU(z) = z σ(z)


def test_post_norm_residual_is_layer_norm_of_x_plus_sublayer():
    torch.manual_seed(4)
    res = Residual(6, p=0.0, pre_norm=False).eval()
    x = torch.randn(2, 3, 6)
    sub = torch.nn.Linear(6, 6)
    expected = F.layer_norm(x + sub(x), (6,))  # LayerNorm starts at weight 1, bias 0
    assert torch.allclose(res(x, sub), expected, atol=1e-6)


def test_pre_norm_residual_is_x_plus_sublayer_of_layer_norm():
    torch.manual_seed(5)
    res = Residual(6, p=0.0, pre_norm=True).eval()
    x = torch.randn(2, 3, 6)
    sub = torch.nn.Linear(6, 6)
    expected = x + sub(F.layer_norm(x, (6,)))
    assert torch.allclose(res(x, sub), expected, atol=1e-6)


def test_dropout_zeroes_a_fraction_p_and_scales_the_rest():
    torch.manual_seed(0)
    x = torch.ones(200, 500)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert float(kept.float().mean()) == pytest.approx(0.7, abs=0.005)
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.7))
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0, training=True) is x


def test_dropout_draws_every_element_alike_and_from_the_global_generator():
    """Four elements share one 64-bit draw: each of the four 16-bit lanes must drop at rate p
    (a draw whose top bit were always 0 would keep every fourth element), and the same seed
    gives the same mask."""
    x = torch.ones(1000, 400)
    torch.manual_seed(3)
    y = dropout(x, 0.3, training=True)
    lanes = (y != 0).float().view(-1, 4).mean(0)  # keep rate of lanes 0..3
    assert torch.allclose(lanes, torch.full((4,), 0.7), atol=0.005), lanes
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.3, training=True), y)
    assert not torch.equal(dropout(x, 0.3, training=True), y)


def test_dropout_just_below_one_drops_almost_everything_and_scales_finitely():
    """p = 0.999999 rounds to 65536/65536 on 16 bits: it must stay at 65535/65536 (no division
    by zero), as ModelConfig allows any p < 1."""
    torch.manual_seed(4)
    y = dropout(torch.ones(1000, 1000), 0.999999, training=True)
    assert torch.isfinite(y).all()
    assert 0 < int((y != 0).sum()) < 100  # ~15 of a million kept, each scaled by 65536
    assert torch.allclose(y[y != 0], torch.tensor(65536.0))


def test_dropout_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(1)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.5, training=True)
    y.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, (y != 0).float() * 2.0)  # d/dx of x * mask / (1 - p)


def test_dropout_keeps_bf16_under_autocast():
    """Under CPU bf16 autocast a linear layer's output is bf16; dropout must keep it bf16 (its
    fp32 random mask must not promote it) and still zero or scale each element."""
    torch.manual_seed(6)
    linear, x = torch.nn.Linear(16, 16), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        y = dropout(h, 0.25, training=True)
    assert h.dtype == y.dtype == torch.bfloat16  # h: autocast was on (x and weights are fp32)
    kept = y != 0
    assert kept.any() and not kept.all()
    scaled = (h[kept].float() / 0.75).to(torch.bfloat16)
    assert torch.allclose(y[kept].float(), scaled.float(), rtol=1e-2, atol=0)
