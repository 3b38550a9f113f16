"""Scaled dot-product attention, multi-head attention and the masks they use (paper section 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Additive mask hiding padded keys: 0 where a token is real, -inf where it is padding.

    Shape: tokens (B, S) -> (B, 1, 1, S), broadcast over heads and query positions.
    """
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
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V, the explicit path (eq. 1).

    Returns the output (B, h, T, d_k) and the weights (B, h, T, S) that inspection needs.
    """
    scores = (
        q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    )  # (B,h,T,d_k) x (B,h,d_k,S) -> (B,h,T,S)
    if mask is not None:
        scores = scores + mask
    weights = scores.softmax(dim=-1)  # (B, h, T, S), each row sums to 1
    return weights @ v, weights  # (B, h, T, S) x (B, h, S, d_k) -> (B, h, T, d_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW^Q_i, KW^K_i, VW^V_i).

    Self-attention projects Q, K and V with one fused linear layer; cross-attention projects Q
    from the decoder and K, V from the encoder memory (once per sentence, see ``project_kv``).
    Setting ``record_weights`` switches to the explicit path and keeps the last weights in
    ``weights`` (B, h, T, S); training on the CPU takes the explicit path too (its backward is
    faster there); otherwise the fused ``F.scaled_dot_product_attention`` kernel runs.
    """

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
        """Attend from x (B, T, d) and return (B, T, d).

        Self-attention with a ``cache``, the K, V buffer (2, B, h, span, d_k): the new keys and
        values are written in place at ``slots`` (T,), and the queries attend to every slot of
        the buffer, ``mask`` (T, span) hiding those not yet filled: the shapes stay the same
        from one decoding step to the next. Cross-attention takes the memory's projected ``kv``
        (2, B', h, S, d_k); if it holds B' sentences and x holds B = n * B' rows (n beams per
        sentence, sentence-major), the n beams become extra query rows of their sentence, so
        K, V are never copied per beam.
        ``causal``: the square causal mask of a decoder pass from position 0, left to the kernel.
        """
        B, T, _ = x.shape
        if self.cross:
            assert kv is not None, "cross-attention needs the memory's K, V"
            q = self.w_q(x).view(B, T, self.h, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
            k, v = kv.unbind(0)  # (B', h, S, d_k)
        else:
            qkv = self.w_qkv(x).view(B, T, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
            # (B, T, 3d) -> (3, B, h, T, d_k): Q, K, V stacked, heads split
            if cache is None:
                q, k, v = qkv.unbind(0)  # 3 x (B, h, T, d_k)
            else:
                cache.index_copy_(3, slots, qkv[1:])  # the new K, V: (2, B, h, T, d_k)
                q, (k, v) = qkv[0], cache.unbind(0)  # K, V: (B, h, span, d_k)
        B, h, T, d_k = q.shape
        n = B // k.size(0)  # beams per sentence (1 unless cross-attention during beam search)
        if n > 1:
            q = (
                q.view(-1, n, h, T, d_k).transpose(1, 2).reshape(-1, h, n * T, d_k)
            )  # (B', h, nT, d_k)
        if mask is not None and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
        if self.record_weights or (torch.is_grad_enabled() and q.device.type == "cpu"):
            # Explicit ops: to keep the weights, and to train on CPU, where autograd through
            # them ran 1.3x (fp32) to 4x (bf16) faster than the fused kernel's backward.
            if causal:  # the mask the fused kernel applies by itself (T == S)
                mask = causal_mask(T, q.device).to(q.dtype)
            out, weights = attention(q, k, v, mask)
            self.weights = weights if self.record_weights else None
        else:  # is_causal lets the kernel skip the masked blocks instead of adding -inf
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        if n > 1:
            out = out.view(-1, h, n, T, d_k).transpose(1, 2).reshape(B, h, T, d_k)  # (B, h, T, d_k)
            if self.record_weights:
                self.weights = self.weights.view(-1, h, n, T, k.size(2)).transpose(1, 2)
                self.weights = self.weights.reshape(B, h, T, k.size(2))  # (B, h, T, S)
        out = out.transpose(1, 2).reshape(B, T, h * d_k)  # (B, h, T, d_k) -> (B, T, d)
        return self.w_o(out)
