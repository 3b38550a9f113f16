"""The paper's equations as functions of tensors: multi-head attention, LayerNorm, the residual
sublayer, the position-wise FFN, the scaled embeddings and the tied output layer. Each takes its
weights as its module holds them (``nn.Linear``'s (out, in): y = x W^T + b), and the tests hold
each equal to its module; ``tformer learn`` checks a learner's functions against them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from tformer_cli.model.attention import MultiHeadAttention, attention


class AttentionWeights(NamedTuple):
    """W^Q, W^K, W^V and W^O of an attention sublayer, each (d, d) as ``nn.Linear`` holds it,
    and their biases (d,). Rows of W^Q, W^K, W^V are head-major: head i owns rows i*d_k ..
    (i+1)*d_k - 1."""

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o: Tensor
    b_q: Tensor
    b_k: Tensor
    b_v: Tensor
    b_o: Tensor

    @classmethod
    def of(cls, module: MultiHeadAttention) -> AttentionWeights:
        """The weights of ``module``, its fused projection (W^Q|W^K|W^V, or W^K|W^V in
        cross-attention) split in (d, d) blocks."""
        if module.cross:
            w_q, b_q = module.w_q.weight, module.w_q.bias
            (w_k, w_v), (b_k, b_v) = module.w_kv.weight.chunk(2), module.w_kv.bias.chunk(2)
        else:
            (w_q, w_k, w_v), (b_q, b_k, b_v) = (
                module.w_qkv.weight.chunk(3),
                module.w_qkv.bias.chunk(3),
            )
        return cls(w_q, w_k, w_v, module.w_o.weight, b_q, b_k, b_v, module.w_o.bias)


def split_heads(x: Tensor, h: int) -> Tensor:
    """(B, T, d) -> (B, h, T, d_k): each position's d features cut in h pieces of d_k."""
    B, T, d = x.shape
    return x.view(B, T, h, d // h).transpose(1, 2)


def multi_head_attention(
    x: Tensor, memory: Tensor, weights: AttentionWeights, h: int, mask: Tensor | None = None
) -> Tensor:
    """MultiHead(Q, K, V) = Concat(head_1, .., head_h) W^O, head_i = Attention(Q W^Q_i,
    K W^K_i, V W^V_i) (section 3.2.2): queries from x (B, T, d), keys and values from memory
    (B, S, d), which is x itself in self-attention; ``mask`` as ``attention`` takes it. (B, T, d).
    """
    w = weights
    q = split_heads(x @ w.w_q.T + w.b_q, h)  # (B, h, T, d_k)
    k = split_heads(memory @ w.w_k.T + w.b_k, h)  # (B, h, S, d_k)
    v = split_heads(memory @ w.w_v.T + w.b_v, h)  # (B, h, S, d_k)
    heads, _ = attention(q, k, v, mask)  # (B, h, T, d_k): eq. 1 in each head
    B, _, T, _ = heads.shape
    return heads.transpose(1, 2).reshape(B, T, -1) @ w.w_o.T + w.b_o  # Concat, then W^O


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm(x) = gamma * (x - mean) / sqrt(var + eps) + beta, mean and variance over the
    last axis (Ba et al., 2016); the variance divides by d, not d - 1, as ``nn.LayerNorm``.
    x (..., d), gamma and beta (d,)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def residual(
    x: Tensor, sublayer: Callable[[Tensor], Tensor], gamma: Tensor, beta: Tensor, pre_norm: bool
) -> Tensor:
    """A sublayer with its residual connection and LayerNorm (section 3.1): post-LN, the
    paper's, LayerNorm(x + Sublayer(x)); pre-LN x + Sublayer(LayerNorm(x)). Dropout (section
    5.4) is left out, as at inference. x (B, T, d) -> (B, T, d)."""
    if pre_norm:
        return x + sublayer(layer_norm(x, gamma, beta))
    return layer_norm(x + sublayer(x), gamma, beta)


def feed_forward(x: Tensor, w_1: Tensor, b_1: Tensor, w_2: Tensor, b_2: Tensor) -> Tensor:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3), at each position alike: w_1
    (d_ff, d) and w_2 (d, d_ff) as ``nn.Linear`` holds them. x (B, T, d) -> (B, T, d)."""
    return torch.relu(x @ w_1.T + b_1) @ w_2.T + b_2


def embed(tokens: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    """E[tokens] * sqrt(d_model) + PE[0 .. T-1] (sections 3.4 and 3.5): each token's row of the
    embedding table E (V, d), scaled, plus the position table's (max_len, d) row of its
    position. tokens (B, T) -> (B, T, d)."""
    return table[tokens] * math.sqrt(table.size(1)) + positions[: tokens.size(1)]


def output_logprobs(x: Tensor, table: Tensor) -> Tensor:
    """log softmax(x E^T): the output layer tied to the embedding table E (V, d) (section
    3.4), its logits turned into log-probabilities over the vocabulary. x (..., d) -> (..., V)."""
    return torch.log_softmax(x @ table.T, dim=-1)
