"""The collected attention weights and the types every view shares.

The weights come from one teacher-forced pass over (source + ``</s>``, ``<s>`` + the chosen
hypothesis), which computes what cached decoding computed step by step. Rows of cross- and
decoder self-attention are labelled with the token *generated* at that step. Layers and heads
are numbered from 1 in everything a person reads; tensors are 0-based."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torch import Tensor

from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID
from tformer_cli.model import Transformer

KIND_NAMES = {  # the kinds of attention maps, in order, and what each is
    "cross": "cross-attention (target → source)",
    "encoder": "encoder self-attention (source → source)",
    "decoder": "decoder self-attention (target → target prefix, causal)",
}


@dataclass(frozen=True)
class AttentionMaps:
    """Every attention weight of one sentence pair: ``weights[kind]`` (L, h, rows, cols) is
    (S, S) for ``encoder``, (T, T) for ``decoder``, (T, S) for ``cross``."""

    source: str
    translation: str
    src_tokens: list[str]  # encoder input: subwords + "</s>"
    tgt_inputs: list[str]  # decoder input: "<s>" y_1 .. y_{T-1}
    tgt_tokens: list[str]  # generated at each step: y_1 .. y_T ("</s>" last when finished)
    weights: dict[str, Tensor]

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a kind's maps."""
        if kind == "encoder":
            return self.src_tokens, self.src_tokens
        if kind == "decoder":
            return self.tgt_tokens, self.tgt_inputs
        return self.tgt_tokens, self.src_tokens


@torch.inference_mode()
def collect(
    model: Transformer, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> dict[str, Tensor]:
    """Attention weights of a batch of pairs by kind, each (B, L, h, rows, cols), fp32 on CPU,
    right-padded with zeros. ``sources``: ids without ``</s>``; ``targets``: the tokens to
    generate (``</s>`` included when finished); the decoder reads ``<s>`` + all but the last."""
    src = pad([[*s, EOS_ID] for s in sources]).to(next(model.parameters()).device)  # (B, S)
    y = pad([[BOS_ID, *t[:-1]] for t in targets]).to(src.device)  # (B, T)
    model.record_attention(True)
    try:
        model(src, y)
        modules = model.attention_modules()
        out = {
            kind: torch.stack([m.weights for m in modules[kind]], dim=1).float().cpu()
            for kind in KIND_NAMES
        }  # L x (B, h, rows, cols) -> (B, L, h, rows, cols)
    finally:
        model.record_attention(False)
    return out  # padded keys got exactly 0: exp(-inf) = 0


def inspect_pair(
    model: Transformer, tok: Tokenizer, source: str, src_ids: list[int], targets: list[int]
) -> AttentionMaps:
    """The maps of one (source, generated tokens) pair, with readable token labels."""
    weights = {kind: w[0] for kind, w in collect(model, [src_ids], [targets]).items()}
    names = [tok.id_to_token(i) for i in targets]
    text_ids = [i for i in targets if i != EOS_ID]
    return AttentionMaps(
        source=source,
        translation=tok.decode(text_ids, skip_special_tokens=True),
        src_tokens=[*(tok.id_to_token(i) for i in src_ids), "</s>"],
        tgt_inputs=["<s>", *names[:-1]],
        tgt_tokens=names,
        weights=weights,
    )


@dataclass(frozen=True)
class Heatmap:
    """One heatmap: a (layer, head) map or a mean over heads, with its title."""

    title: str  # "layer 2 · head 3"
    short: str  # "L2 H3", for narrow terminal panels
    weights: Tensor  # (rows, cols)


@dataclass(frozen=True)
class View:
    """What to draw: panels of one kind sharing row and column labels."""

    kind: str
    title: str
    row_labels: list[str]
    col_labels: list[str]
    panels: list[Heatmap]
    per_layer: int = 1  # panels of one layer: pictures start each layer on a new row

    def columns(self, fit: int) -> int:
        """Panels per row when ``fit`` would fit: one layer per row if it fits, else as many."""
        if 1 < self.per_layer <= fit:
            return self.per_layer
        return max(1, min(len(self.panels), fit))


@dataclass(frozen=True)
class HeadRow:
    """One line of the per-head summary (layer and head numbered from 1)."""

    layer: int
    head: int
    entropy: float  # mean bits per row on this sentence
    strongest: list[str]  # the column label each row attends to most
    alignment: float | None = None  # share of gold-aligned target words (toy test split)
    crossing: float | None = None  # the same on target words with crossing (reordered) links
