"""Embeddings with positional encoding, the position-wise FFN, and the encoder/decoder layers."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.config import ModelConfig
from tformer_cli.model import fast
from tformer_cli.model.attention import MultiHeadAttention


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (section 3.5):
    (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (d_model/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # one cosine fewer when d_model is odd
    return pe


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout (section 5.4): zero each element with probability p, scale the rest by 1/(1-p)
    (on an eager CPU from a cheaper random draw: ``fast.draws_16bit_masks``)."""
    if not training or p == 0.0:
        return x
    if fast.draws_16bit_masks(x):
        return fast.dropout_16bit_mask(x, p)
    return F.dropout(x, p, training=True)


class Embeddings(nn.Module):
    """Token embedding times sqrt(d_model), plus positional encoding, then dropout (3.4, 3.5)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.scale = math.sqrt(cfg.d_model)
        # padding_idx: lookups of <pad> add no gradient (the row is initialised like the others;
        # padded positions are masked everywhere, and a tied output layer still trains the row)
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=0)
        nn.init.normal_(self.tokens.weight, std=cfg.d_model**-0.5)
        self.is_learned = cfg.positional == "learned"
        if self.is_learned:
            # small next to the sqrt(d)-scaled token embeddings (unit variance), as in BERT/GPT-2
            self.learned = nn.Parameter(torch.randn(cfg.max_positions, cfg.d_model) * 0.02)
        else:
            self.register_buffer("sinusoid", sinusoidal_positions(cfg.max_positions, cfg.d_model))
        self.p = cfg.dropout

    @property
    def positions(self) -> Tensor:
        return self.learned if self.is_learned else self.sinusoid

    def forward(self, tokens: Tensor, slots: Tensor | None = None) -> Tensor:
        """tokens (B, T) at positions 0 .. T-1, or at ``slots`` (T,) -> (B, T, d_model)."""
        T = tokens.size(1)
        pe = (
            self.positions[:T] if slots is None else self.positions.index_select(0, slots)
        )  # (T, d)
        x = self.tokens(tokens) * self.scale + pe  # (B, T, d)
        return dropout(fast.autocast_stream(x), self.p, self.training)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3); with ``activation`` silu,
    SiLU(z) = z * sigmoid(z) in place of max(0, z), as Marian's models use."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.act: Callable[[Tensor], Tensor] = {"relu": torch.relu, "silu": F.silu}[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.act(self.w_1(x)))  # (B, T, d) -> (B, T, d_ff) -> (B, T, d)


class Residual(nn.Module):
    """A sublayer with its residual connection and LayerNorm (sections 3.1 and 5.4): post-LN (the
    paper's) LayerNorm(x + Dropout(Sublayer(x))), or pre-LN x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, p: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm, self.p, self.pre_norm = nn.LayerNorm(d_model), p, pre_norm

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + dropout(sublayer(self.norm(x)), self.p, self.training)
        return self.norm(x + dropout(sublayer(x), self.p, self.training))


class EncoderLayer(nn.Module):
    """Self-attention over the source, then the FFN, each wrapped in ``Residual``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cross=False)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation)
        self.res_attn = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ffn = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.res_attn(x, lambda x: self.self_attn(x, src_mask))  # (B, S, d)
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, then the FFN."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cross=False)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.h, cross=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation)
        self.res_self = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_cross = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ffn = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(
        self,
        y: Tensor,
        tgt_mask: Tensor | None,
        memory_kv: Tensor,
        src_mask: Tensor,
        cache: Tensor | None = None,
        slots: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """y (B, T, d) -> (B, T, d); ``cache``, ``slots``, ``causal`` as ``MultiHeadAttention``."""
        y = self.res_self(
            y, lambda y: self.self_attn(y, tgt_mask, cache=cache, slots=slots, causal=causal)
        )
        y = self.res_cross(y, lambda y: self.cross_attn(y, src_mask, kv=memory_kv))
        return self.res_ffn(y, self.ffn)
