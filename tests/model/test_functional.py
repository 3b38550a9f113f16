"""Tests for tformer_cli.model.functional: each equation as a function of tensors equals the
module that computes it in the model, with that module's weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.model.attention import causal_mask, padding_mask
from tformer_cli.model.functional import (
    AttentionWeights,
    embed,
    feed_forward,
    layer_norm,
    multi_head_attention,
    output_logprobs,
    residual,
)
from tformer_cli.model.layers import FeedForward, Residual

TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture
def model(tiny_model):
    return tiny_model(seed=3)


def test_self_attention_equals_the_module_with_padding_and_causal_masks(model, token_batch):
    module = model.encoder[0].self_attn
    tokens = token_batch([5, 3, 4], seed=1)  # (3, 5), two rows padded
    x = torch.randn(3, 5, 32)
    weights = AttentionWeights.of(module)
    with torch.no_grad():
        for mask in (padding_mask(tokens, 0), causal_mask(5)):
            ours = multi_head_attention(x, x, weights, model.cfg.h, mask)
            assert torch.allclose(ours, module(x, mask), **TOL)


def test_cross_attention_equals_the_module(model, token_batch):
    module = model.decoder[1].cross_attn
    memory, y = torch.randn(2, 6, 32), torch.randn(2, 4, 32)
    mask = padding_mask(token_batch([6, 2], seed=2), 0)
    with torch.no_grad():
        theirs = module(y, mask, kv=module.project_kv(memory))
        ours = multi_head_attention(y, memory, AttentionWeights.of(module), model.cfg.h, mask)
    assert torch.allclose(ours, theirs, **TOL)


def test_layer_norm_equals_torch_s_on_ordinary_and_constant_rows():
    x = torch.randn(2, 3, 8)
    x[1, 2] = 4.0  # a constant row: variance 0, eps alone keeps it finite
    gamma, beta = torch.randn(8), torch.randn(8)
    assert torch.allclose(layer_norm(x, gamma, beta), F.layer_norm(x, (8,), gamma, beta), **TOL)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_residual_equals_the_module_post_and_pre_ln(pre_norm):
    torch.manual_seed(0)
    module, sublayer = Residual(16, 0.0, pre_norm).eval(), torch.nn.Linear(16, 16)
    torch.nn.init.normal_(module.norm.weight), torch.nn.init.normal_(module.norm.bias)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ours = residual(x, sublayer, module.norm.weight, module.norm.bias, pre_norm)
        assert torch.allclose(ours, module(x, sublayer), **TOL)


def test_feed_forward_equals_the_module():
    torch.manual_seed(0)
    module, x = FeedForward(16, 40), torch.randn(2, 5, 16)
    w = (module.w_1.weight, module.w_1.bias, module.w_2.weight, module.w_2.bias)
    with torch.no_grad():
        assert torch.allclose(feed_forward(x, *w), module(x), **TOL)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_embed_and_the_tied_output_equal_the_model_s(tiny_model, token_batch, positional):
    model = tiny_model(seed=4, positional=positional)
    tokens, x = token_batch([6, 4], seed=3), torch.randn(2, 6, 32)
    table = model.src_embed.tokens.weight
    with torch.no_grad():
        ours = embed(tokens, table, model.src_embed.positions)
        assert torch.allclose(ours, model.src_embed(tokens), **TOL)
        logits = model.generator(x)  # the tied output layer: x E^T
        assert torch.allclose(output_logprobs(x, table), logits.log_softmax(-1), **TOL)
