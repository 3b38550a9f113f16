"""The encoder-decoder Transformer: ``encode()`` the source once, ``decode()`` target prefixes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer_cli.config import ModelConfig
from tformer_cli.model.attention import MultiHeadAttention, causal_mask, padding_mask
from tformer_cli.model.layers import DecoderLayer, Embeddings, EncoderLayer

PAD_ID = 0


@dataclass
class DecoderCache:
    """Decoder state for incremental decoding: one new token per row and step.

    Self-attention keys/values live in preallocated buffers written in place at slot ``length``
    (never grown by ``torch.cat``). Cross-attention keys/values are projected from the memory
    once, per sentence: during beam search a sentence's n beams share them.
    """

    self_k: Tensor  # (L, B, h, T_max, d_k)
    self_v: Tensor  # (L, B, h, T_max, d_k)
    cross_k: Tensor  # (L, B', h, S, d_k), B' sentences, B = n * B' rows
    cross_v: Tensor  # (L, B', h, S, d_k)
    src_mask: Tensor  # (B', 1, 1, S)
    length: int = 0
    spare: tuple[Tensor, Tensor] | None = None  # buffers of self_k's shape for ``select``

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep or reorder decoder ``rows`` (index into B) and memory ``sentences`` (into B').

        The ``length`` filled slots of the chosen rows are gathered in one copy into spare
        buffers, which then swap places with the current ones (beam search reorders every step).
        """
        t, (L, B, h, T_max, d_k) = self.length, self.self_k.shape
        if self.spare is None or rows.numel() != B:  # first reorder, or rows leave: new buffers
            shape = (L, rows.numel(), h, T_max, d_k)
            self.spare = (self.self_k.new_empty(shape), self.self_v.new_empty(shape))
        spare_k, spare_v = self.spare
        torch.index_select(self.self_k[..., :t, :], 1, rows, out=spare_k[..., :t, :])
        torch.index_select(self.self_v[..., :t, :], 1, rows, out=spare_v[..., :t, :])
        self.spare = (self.self_k, self.self_v) if rows.numel() == B else None
        self.self_k, self.self_v = spare_k, spare_v
        if sentences is not None:
            self.cross_k = self.cross_k.index_select(1, sentences)
            self.cross_v = self.cross_v.index_select(1, sentences)
            self.src_mask = self.src_mask.index_select(0, sentences)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al., 2017, figure 1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed, self.tgt_embed = Embeddings(cfg), Embeddings(cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        pre = cfg.norm == "pre"  # pre-LN needs a final LayerNorm on each stack's output
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        if cfg.tie_embeddings:  # one shared vocabulary: tie both embeddings and the output layer
            self.tgt_embed.tokens.weight = self.src_embed.tokens.weight
            self.generator.weight = self.src_embed.tokens.weight

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids -> memory (B, S, d_model) and its padding mask (B, 1, 1, S)."""
        src_mask = padding_mask(src, PAD_ID)
        x = self.src_embed(src)  # (B, S, d)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def decode(
        self,
        y: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        cache: DecoderCache | None = None,
        at: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits for each position of the decoder input y (B, T): (B, T, V), or
        (N, V) for the N positions where ``at`` (B, T) is True (training skips the padding).

        Without a cache, y is the whole prefix ``<s> y_1 .. y_{T-1}`` and ``memory``/``src_mask``
        come from ``encode``. With a cache, y holds the next tokens at positions
        ``cache.length ..`` and the memory's K, V come from the cache, which is advanced.
        The causal mask is the only one the decoder's self-attention needs: padding sits at the
        end of a target, so a real position never sees a padded one.
        """
        T = y.size(1)
        start = 0 if cache is None else cache.length
        x = self.tgt_embed(y, start)  # (B, T, d)
        causal = start == 0 and T > 1  # a square causal mask: the attention kernel's own
        tgt_mask = causal_mask(start + T, y.device)[start:] if T > 1 and not causal else None
        for i, layer in enumerate(self.decoder):
            if cache is None:
                assert memory is not None and src_mask is not None
                kv = layer.cross_attn.project_kv(memory)
                x = layer(x, tgt_mask, kv, src_mask, causal=causal)
            else:
                kv = (cache.cross_k[i], cache.cross_v[i])
                self_cache = (cache.self_k[i], cache.self_v[i])
                x = layer(x, tgt_mask, kv, cache.src_mask, self_cache, start, causal)
        if cache is not None:
            cache.length += T
        x = self.decoder_norm(x)
        return self.generator(x if at is None else x[at])  # (B, T, d) -> (B, T, V) or (N, V)

    def forward(self, src: Tensor, y: Tensor, at: Tensor | None = None) -> Tensor:
        """Teacher forcing: logits (B, T, V) for decoder input y (B, T) given src (B, S);
        (N, V) at the positions where ``at`` (B, T) is True."""
        memory, src_mask = self.encode(src)
        return self.decode(y, memory, src_mask, at=at)

    def init_cache(
        self, memory: Tensor, src_mask: Tensor, max_len: int, beams: int = 1
    ) -> DecoderCache:
        """Empty self-attention buffers for ``beams`` rows per sentence, and the memory's K, V."""
        B, _, _ = memory.shape
        L, h, d_k = len(self.decoder), self.cfg.h, self.cfg.d_k
        kvs = [
            layer.cross_attn.project_kv(memory) for layer in self.decoder
        ]  # L x 2 x (B, h, S, d_k)
        cross_k = torch.stack([k for k, _ in kvs])  # (L, B, h, S, d_k)
        cross_v = torch.stack([v for _, v in kvs])
        shape = (L, B * beams, h, max_len, d_k)
        buf = dict(dtype=cross_k.dtype, device=memory.device)
        return DecoderCache(
            torch.empty(shape, **buf), torch.empty(shape, **buf), cross_k, cross_v, src_mask
        )

    def attention_modules(self) -> dict[str, list[MultiHeadAttention]]:
        """The attention sublayers by kind (``encoder``, ``decoder``, ``cross``), in layer order."""
        return {
            "encoder": [layer.self_attn for layer in self.encoder],
            "decoder": [layer.self_attn for layer in self.decoder],
            "cross": [layer.cross_attn for layer in self.decoder],
        }

    def record_attention(self, on: bool = True) -> None:
        """Switch every attention sublayer to the explicit path that keeps its weights."""
        for modules in self.attention_modules().values():
            for m in modules:
                m.record_weights, m.weights = on, None
