"""Scaled dot-product attention, multi-head attention and the masks they use (paper section 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.model import fast


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Additive mask hiding padded keys: 0 where a token is real, -inf where it is padding.
    tokens (B, S) -> (B, 1, 1, S), broadcast over heads and query positions."""
    mask = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    return mask.masked_fill(tokens == pad_id, float("-inf"))[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """Additive "subsequent" mask: position i may attend to j <= i only. Shape (T, T).

    >>> causal_mask(3)
    tensor([[0., -inf, -inf],
            [0., 0., -inf],
            [0., 0., 0.]])
    """
    future = torch.ones(size, size, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(size, size, device=device).masked_fill(future, float("-inf"))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V (eq. 1): the output (B, h, T, d_k)
    and the weights (B, h, T, S) that inspection needs."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, d_k) x (B, h, d_k, S)
    if mask is not None:
        scores = scores + mask
    weights = scores.softmax(dim=-1)  # (B, h, T, S), each row sums to 1
    return weights @ v, weights  # (B, h, T, S) x (B, h, S, d_k) -> (B, h, T, d_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW^Q_i, KW^K_i, VW^V_i).

    Self-attention projects Q, K and V with one fused linear layer; cross-attention projects Q
    from the decoder and K, V from the encoder memory (``project_kv``). ``record_weights`` keeps
    the last weights in ``weights`` (B, h, T, S)."""

    def __init__(self, d_model: int, h: int, *, cross: bool) -> None:
        super().__init__()
        self.h, self.d_k, self.cross = h, d_model // h, cross
        if cross:
            self.w_q = nn.Linear(d_model, d_model)
            self.w_kv = nn.Linear(d_model, 2 * d_model)
        else:
            self.w_qkv = nn.Linear(d_model, 3 * d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.record_weights = False
        self.weights: Tensor | None = None
        self.explicit = False  # always the explicit ops (a compiled step for many rows)

    def project_kv(self, memory: Tensor) -> Tensor:
        """K, V of the encoder memory (B, S, d) for cross-attention, stacked: (2, B, h, S, d_k)."""
        B, S, _ = memory.shape
        return self.w_kv(memory).view(B, S, 2, self.h, self.d_k).permute(2, 0, 3, 1, 4)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        kv: Tensor | None = None,
        cache: Tensor | None = None,
        slots: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O from x (B, T, d): (B, T, d).

        With a ``cache``, the K, V buffer (2, B, h, T_max, d_k), the new keys and values are
        written at ``slots`` (T,) and the queries attend to its first ``span`` slots, ``mask``
        (T, span) hiding those not yet filled. Cross-attention takes the memory's ``kv`` (2, B',
        h, S, d_k); B = n * B' rows (n beams a sentence) attend as extra query rows of their
        sentence (``fold_beams``). ``causal``: the square causal mask of a pass from position 0.
        """
        B, T, _ = x.shape
        span = None if mask is None else mask.size(-1)  # the slots a cached step attends to
        q, k, v = self.project(x, kv, cache, slots, span)  # Q (B, h, T, d_k); K, V (B', h, S, d_k)
        n = B // k.size(0)  # beams per sentence (1 unless cross-attention during beam search)
        heads = self.attend(fold_beams(q, n), k, v, mask, causal)  # (B', h, nT, d_k): eq. 1
        heads = unfold_beams(heads, n)  # (B, h, T, d_k)
        if self.record_weights:
            self.weights = unfold_beams(self.weights, n)  # (B, h, T, S)
        return self.w_o(heads.transpose(1, 2).reshape(B, T, self.h * self.d_k))  # Concat W^O

    def project(
        self,
        x: Tensor,
        kv: Tensor | None,
        cache: Tensor | None,
        slots: Tensor | None,
        span: int | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Q = x W^Q (B, h, T, d_k), heads split, and K, V (B', h, S, d_k): from x (self-attention,
        through the ``cache`` if given) or the memory's ``kv`` (cross-attention)."""
        B, T, _ = x.shape
        if self.cross:
            assert kv is not None, "cross-attention needs the memory's K, V"
            k, v = kv.unbind(0)  # (B', h, S, d_k)
            return self.w_q(x).view(B, T, self.h, self.d_k).transpose(1, 2), k, v
        qkv = self.w_qkv(x).view(B, T, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
        # (B, T, 3d) -> (3, B, h, T, d_k): Q, K, V stacked, heads split
        if cache is None:
            return qkv.unbind(0)  # 3 x (B, h, T, d_k)
        k, v = write_cache(cache, slots, qkv[1:], span)  # (B, h, span, d_k)
        return qkv[0], k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """Attention(Q, K, V) (eq. 1), (B, h, T, d_k): the explicit ``attention``, or PyTorch's
        fused kernel where it is the faster (``fast.fused_attention``)."""
        if mask is not None and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
        if not self.record_weights and fast.fused_attention(q, self.explicit):
            # is_causal lets the kernel skip the masked blocks instead of adding -inf
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        if causal:  # the mask the fused kernel applies by itself (T == S)
            mask = causal_mask(q.size(2), q.device).to(q.dtype)
        out, weights = attention(q, k, v, mask)
        self.weights = weights if self.record_weights else None
        return out


def write_cache(
    cache: Tensor, slots: Tensor | None, kv: Tensor, span: int | None
) -> tuple[Tensor, Tensor]:
    """K_{1..t} = [K_{1..t-1}; K_t]: the new keys and values ``kv`` (2, B, h, T, d_k) written in
    place at ``slots`` (T,) of the buffer ``cache`` (2, B, h, T_max, d_k) (the whole buffer, so
    that a compiled step writes in place); returns the K and V of its first ``span`` slots."""
    assert slots is not None and span is not None, "a cache write needs its slots and span"
    cache[:, :, :, slots] = kv  # (2, B, h, T, d_k) at slots

    return cache.narrow(3, 0, span).unbind(0)  # (B, h, span, d_k) each


def fold_beams(q: Tensor, n: int) -> Tensor:
    """(n * B', h, T, d_k) queries of n beams per sentence (sentence-major) -> (B', h, n * T,
    d_k): the beams become extra query rows of their sentence, so K, V are never copied."""
    if n == 1:
        return q
    _, h, T, d_k = q.shape
    return q.view(-1, n, h, T, d_k).transpose(1, 2).reshape(-1, h, n * T, d_k)


def unfold_beams(x: Tensor, n: int) -> Tensor:
    """The inverse of ``fold_beams``, for outputs (B', h, n * T, d_k) and weights (B', h,
    n * T, S): (n * B', h, T, .)."""
    if n == 1:
        return x
    _, h, nT, last = x.shape
    return x.view(-1, h, n, nT // n, last).transpose(1, 2).reshape(-1, h, nT // n, last)
