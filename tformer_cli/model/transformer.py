"""The encoder-decoder Transformer: ``encode()`` the source once, ``decode()`` target prefixes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer_cli.config import ModelConfig
from tformer_cli.model.attention import MultiHeadAttention, padding_mask
from tformer_cli.model.layers import DecoderLayer, Embeddings, EncoderLayer

PAD_ID = 0


@dataclass
class DecoderCache:
    """Decoder state for incremental decoding, static in shape from step to step: self-attention
    keys/values in a buffer written in place at slot ``pos`` (a tensor, so that one compiled
    step serves every position), each step attending to its first ``span`` slots; the memory's
    cross-attention keys/values once per sentence, shared by its beams.
    """

    self_kv: Tensor  # (L, 2, B, h, T_max, d_k): K and V of each decoder layer
    cross_kv: Tensor  # (L, 2, B', h, S, d_k), B' sentences, B = n * B' rows
    src_mask: Tensor  # (B', 1, 1, S)
    pos: Tensor  # (), long: slots 0 .. pos-1 are filled, the next token goes to slot pos
    span: int  # slots attended to: pos + (new tokens) <= span <= T_max
    spare: Tensor | None = None  # a second buffer like self_kv, for eager beam search

    def reorder(self, rows: Tensor) -> None:
        """Row i of the buffer becomes row ``rows[i]`` (beam search), in place; with a ``spare``
        buffer, gathered into it and the two swap places."""
        filled = self.self_kv.narrow(4, 0, self.span)  # (L, 2, B, h, span, d_k)
        if self.spare is None:
            filled.copy_(filled.index_select(2, rows))
            return
        torch.index_select(filled, 2, rows, out=self.spare.narrow(4, 0, self.span))
        self.self_kv, self.spare = self.spare, self.self_kv

    def select(
        self, rows: Tensor, sentences: Tensor, into: DecoderCache | None = None, blank: bool = False
    ) -> DecoderCache:
        """A cache of the decoder ``rows`` (index into B) and memory ``sentences`` (into B'), in
        the buffers ``into`` (kept by a captured step), else new ones: zeroed (finite in the
        slots a rounded-up span attends to but masks), or left ``blank`` where every slot
        attended to is written first (spans of exactly pos + 1 slots)."""
        if into is None:
            L, _, _, h, T_max, d_k = self.self_kv.shape
            new = self.self_kv.new_empty if blank else self.self_kv.new_zeros
            self_kv = new((L, 2, rows.numel(), h, T_max, d_k))
            into = DecoderCache(
                self_kv,
                self.cross_kv.new_empty(
                    (*self.cross_kv.shape[:2], sentences.numel(), *self.cross_kv.shape[3:])
                ),
                self.src_mask.new_empty((sentences.numel(), *self.src_mask.shape[1:])),
                self.pos.clone(),
                self.span,
                None if self.spare is None else new(self_kv.shape),
            )
        torch.index_select(
            self.self_kv.narrow(4, 0, self.span), 2, rows, out=into.self_kv.narrow(4, 0, self.span)
        )
        torch.index_select(self.cross_kv, 2, sentences, out=into.cross_kv)
        torch.index_select(self.src_mask, 0, sentences, out=into.src_mask)
        into.pos.copy_(self.pos)
        into.span = self.span
        return into


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
        # logits = x W_out^T (+ b_out with ``output_bias``, zero at first)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.output_bias)
        if cfg.output_bias:
            nn.init.zeros_(self.generator.bias)
        # Xavier on every matrix but the embeddings (N(0, 1/d): times sqrt(d) gives unit-variance
        # inputs, and tied output logits start small). On the fused (3d, d) W^Q|W^K|W^V this is
        # Xavier per block with gain 1/sqrt(2), the scaling fairseq chooses on purpose; on the
        # cross-attention (2d, d) W^K|W^V, gain sqrt(2/3).
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
        (N, V) at the positions ``at`` picks (a (B, T) mask, or (N,) flat indices).

        Without a cache, y is the whole prefix ``<s> y_1 .. y_{T-1}`` and ``memory``/``src_mask``
        come from ``encode``. With a cache, y holds the next tokens at positions ``cache.pos ..``
        and the memory's K, V come from the cache, which is advanced. Padding sits at the end of
        a target, so the causal mask is the only one self-attention needs.
        """
        T = y.size(1)
        if cache is None:
            assert memory is not None and src_mask is not None
            x = self.tgt_embed(y)  # (B, T, d)
            causal = T > 1  # the square causal mask: the attention kernel's own
            for layer in self.decoder:
                x = layer(x, None, layer.cross_attn.project_kv(memory), src_mask, causal=causal)
        else:
            slots = cache.pos + torch.arange(T, device=y.device)  # (T,) positions of y
            x = self.tgt_embed(y, slots)  # (B, T, d)
            filled = torch.arange(cache.span, device=y.device) <= slots[:, None]  # (T, span)
            tgt_mask = torch.zeros(filled.shape, device=y.device).masked_fill(
                ~filled, float("-inf")
            )
            for layer, self_kv, cross_kv in zip(
                self.decoder, cache.self_kv.unbind(0), cache.cross_kv.unbind(0), strict=True
            ):  # self_kv (2, B, h, T_max, d_k), attended over its first span slots (tgt_mask)
                x = layer(x, tgt_mask, cross_kv, cache.src_mask, self_kv, slots)
            cache.pos += T  # in place: a replayed step advances it too
        x = self.decoder_norm(x)
        if at is not None:
            x = x[at] if at.dtype == torch.bool else x.flatten(0, 1).index_select(0, at)  # (N, d)
        return self.generator(x)  # (B, T, d) -> (B, T, V), or (N, d) -> (N, V)

    def forward(self, src: Tensor, y: Tensor, at: Tensor | None = None) -> Tensor:
        """Teacher forcing: logits (B, T, V) for decoder input y (B, T) given src (B, S);
        (N, V) at the positions ``at`` picks (see ``decode``)."""
        memory, src_mask = self.encode(src)
        return self.decode(y, memory, src_mask, at=at)

    def init_cache(
        self, memory: Tensor, src_mask: Tensor, max_len: int, beams: int = 1
    ) -> DecoderCache:
        """Empty self-attention buffers of ``max_len`` slots for ``beams`` rows per sentence,
        and the memory's K, V."""
        B, L, h, d_k = memory.size(0), len(self.decoder), self.cfg.h, self.cfg.d_k
        cross_kv = torch.stack(
            [layer.cross_attn.project_kv(memory) for layer in self.decoder]
        )  # (L, 2, B, h, S, d_k)
        self_kv = cross_kv.new_zeros((L, 2, B * beams, h, max_len, d_k))
        pos = torch.zeros((), dtype=torch.long, device=memory.device)
        return DecoderCache(self_kv, cross_kv, src_mask, pos, max_len)

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
