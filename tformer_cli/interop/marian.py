"""tformer's Transformer and Hugging Face's ``MarianMTModel``, weight for weight.

The two differ in where the position table puts its sines and cosines: ours interleaves them,
Marian's puts the sines in the first half of the model dimension. A fixed permutation P of the
d_model coordinates maps one onto the other (``marian[..., j] = tformer[..., P[j]]``); applied to
every tensor that reads or writes the residual stream, it leaves every attention score and FFN
activation unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tformer_cli.config import ModelConfig

OURS_OF_VOCAB_KEY = {
    "model.shared.weight": "src_embed.tokens.weight",
    "model.encoder.embed_tokens.weight": "src_embed.tokens.weight",
    "model.decoder.embed_tokens.weight": "tgt_embed.tokens.weight",
    "lm_head.weight": "generator.weight",
}
VOCAB_KEYS = tuple(OURS_OF_VOCAB_KEY)  # the shared table first
POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


class Pair(NamedTuple):
    """A Marian tensor and the tformer tensor it is (a block of ``rows`` of it, if fused);
    ``axis``: the dimension that indexes the residual stream (None: neither)."""

    marian: str
    ours: str
    axis: int | None
    rows: slice | None = None


def stream_permutation(d_model: int) -> Tensor:
    """P: Marian's coordinate j is our coordinate P[j] (our sines, the even ones, then our
    cosines, the odd ones). Shape (d_model,)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def layer_pairs(cfg: ModelConfig) -> list[Pair]:
    """Every per-layer tensor of the two models, paired (embeddings and output layer aside)."""
    d = cfg.d_model
    pairs: list[Pair] = []

    def linear(marian: str, ours: str, reads: bool, rows: slice | None = None) -> None:
        # a Linear reading the stream has it on its weight's columns; one writing it, on the
        # rows of its weight and its bias
        pairs.append(Pair(f"{marian}.weight", f"{ours}.weight", 1 if reads else 0, rows))
        pairs.append(Pair(f"{marian}.bias", f"{ours}.bias", None if reads else 0, rows))

    def norm(marian: str, ours: str) -> None:
        pairs.extend(Pair(f"{marian}.{p}", f"{ours}.{p}", 0) for p in ("weight", "bias"))

    def attention(marian: str, ours: str, cross: bool) -> None:
        blocks = [slice(i * d, (i + 1) * d) for i in range(3)]
        if cross:  # W^Q alone, W^K|W^V fused
            linear(f"{marian}.q_proj", f"{ours}.w_q", True)
            linear(f"{marian}.k_proj", f"{ours}.w_kv", True, blocks[0])
            linear(f"{marian}.v_proj", f"{ours}.w_kv", True, blocks[1])
        else:
            for name, block in zip(("q_proj", "k_proj", "v_proj"), blocks, strict=True):
                linear(f"{marian}.{name}", f"{ours}.w_qkv", True, block)
        linear(f"{marian}.out_proj", f"{ours}.w_o", False)

    def ffn(marian: str, ours: str, residual: str) -> None:
        linear(f"{marian}.fc1", f"{ours}.ffn.w_1", True)
        linear(f"{marian}.fc2", f"{ours}.ffn.w_2", False)
        norm(f"{marian}.final_layer_norm", f"{ours}.{residual}.norm")

    for i in range(cfg.n_encoder_layers):
        m, t = f"model.encoder.layers.{i}", f"encoder.{i}"
        attention(f"{m}.self_attn", f"{t}.self_attn", cross=False)
        norm(f"{m}.self_attn_layer_norm", f"{t}.res_attn.norm")
        ffn(m, t, "res_ffn")
    for i in range(cfg.n_decoder_layers):
        m, t = f"model.decoder.layers.{i}", f"decoder.{i}"
        attention(f"{m}.self_attn", f"{t}.self_attn", cross=False)
        norm(f"{m}.self_attn_layer_norm", f"{t}.res_self.norm")
        attention(f"{m}.encoder_attn", f"{t}.cross_attn", cross=True)
        norm(f"{m}.encoder_attn_layer_norm", f"{t}.res_cross.norm")
        ffn(m, t, "res_ffn")
    return pairs


def to_marian(ours: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Marian's tensors (every one but its position tables, which it computes itself) from a
    post-LN, sinusoidal tformer state dict; the vocabulary keeps tformer's ids."""
    perm = stream_permutation(cfg.d_model)
    out = {}
    for p in layer_pairs(cfg):
        x = ours[p.ours] if p.rows is None else ours[p.ours][p.rows]
        out[p.marian] = x if p.axis is None else x.index_select(p.axis, perm)
    for key in VOCAB_KEYS if cfg.tie_embeddings else VOCAB_KEYS[1:]:  # untied: no shared table
        out[key] = ours[OURS_OF_VOCAB_KEY[key]].index_select(1, perm)
    bias = ours.get("generator.bias")
    out["final_logits_bias"] = (bias if bias is not None else torch.zeros(cfg.vocab_size))[
        None
    ]  # (1, V)
    return {k: v.contiguous() for k, v in out.items()}


def from_marian(marian: dict[str, Tensor], cfg: ModelConfig, order: Tensor) -> dict[str, Tensor]:
    """A tformer state dict (position buffers aside) from Marian's tensors; our token id i is
    Marian's id ``order[i]``. The output bias comes without changes; the caller adjusts it."""
    inverse = torch.argsort(stream_permutation(cfg.d_model))
    parts: dict[str, list[Tensor]] = {}
    for p in layer_pairs(cfg):  # fused blocks come in row order
        x = marian[p.marian]
        x = x if p.axis is None else x.index_select(p.axis, inverse)
        parts.setdefault(p.ours, []).append(x)
    out = {k: torch.cat(v) if len(v) > 1 else v[0] for k, v in parts.items()}
    for key in VOCAB_KEYS[1:]:  # embed_tokens of each side, and the output layer
        out[OURS_OF_VOCAB_KEY[key]] = marian[key][order].index_select(1, inverse)
    out["generator.bias"] = marian["final_logits_bias"][0][order]
    return {k: v.contiguous() for k, v in out.items()}
