"""`tformer inspect-attention`: the panels asked for (``--kind/--layer/--head``), each head's
entropy and agreement with gold word alignments (``align``), shown by ``render``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from torch import Tensor

from tformer_cli.checkpoint import LoadedRun, load_run
from tformer_cli.config import DecodeConfig
from tformer_cli.data.corpus import toy_corpus_dir
from tformer_cli.data.tokenizer import EOS_ID, encode
from tformer_cli.decode.search import search
from tformer_cli.device import inference
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.report.attention import render
from tformer_cli.report.attention.align import (
    AlignmentScore,
    alignment_accuracy,
    read_aligned_corpus,
)
from tformer_cli.report.attention.maps import (
    KIND_NAMES,
    AttentionMaps,
    HeadRow,
    Heatmap,
    View,
    inspect_pair,
)
from tformer_cli.report.pick import choose_run
from tformer_cli.report.picture import check_picture, save_picture


# ---------------------------------------------------------------------------- selection
def _parse_index(
    value: str, count: int, option: str, noun: str, words: tuple[str, ...]
) -> int | str:
    """A 1-based number in 1..count (returned 0-based) or one of ``words``."""
    value = value.strip().lower()
    if value in words:
        return value
    choices = f"use 1..{count}, {' or '.join(words)}"
    try:
        number = int(value)
    except ValueError:
        raise TformerError(f"--{option} {value!r} is not a number ({choices})") from None
    if not 1 <= number <= count:
        raise TformerError(f"--{option} {number} is out of range: {count} {noun} ({choices})")
    return number - 1


def check_kind(kind: str) -> None:
    if kind not in KIND_NAMES:
        kinds = ", ".join(KIND_NAMES)
        raise TformerError(f"unknown attention kind {kind!r} (choose from: {kinds})")


def check_selection(
    kind: str, layer: str, head: str, n_layers: int, n_heads: int
) -> tuple[int | str, int | str]:
    """Validate ``--kind/--layer/--head`` before any work: (layer, head) 0-based or a word."""
    check_kind(kind)
    stack = "encoder" if kind == "encoder" else "decoder"
    return (
        _parse_index(layer, n_layers, "layer", f"{stack} layers", ("last", "all")),
        _parse_index(head, n_heads, "head", "heads", ("all", "mean")),
    )


def select(
    maps: AttentionMaps,
    kind: str,
    layer: str = "last",
    head: str = "all",
    accuracy: Tensor | None = None,
) -> View:
    """The panels for ``--kind/--layer/--head``, with each head's alignment ``accuracy`` if any."""
    w = maps.weights.get(kind)  # (L, h, rows, cols)
    L, h = w.shape[:2] if w is not None else (0, 0)
    li, hi = check_selection(kind, layer, head, L, h)
    layers = range(L) if li == "all" else [L - 1 if li == "last" else int(li)]
    panels = []
    for i in layers:
        if hi == "mean":
            panels.append(
                Heatmap(f"layer {i + 1} · mean of {h} heads", f"L{i + 1} mean", w[i].mean(0))
            )
            continue
        for j in range(h) if hi == "all" else [int(hi)]:
            score = "" if accuracy is None else f"{accuracy[i, j]:.0%}"
            title = f"layer {i + 1} · head {j + 1}" + (f" · aligned {score}" if score else "")
            short = f"L{i + 1} H{j + 1}" + (f" {score}" if score else "")
            panels.append(Heatmap(title, short, w[i, j]))
    which = "all layers" if li == "all" else f"layer {layers[0] + 1} of {L}"
    rows, cols = maps.labels(kind)
    return View(
        kind, f"{KIND_NAMES[kind]}, {which}", rows, cols, panels, len(panels) // len(layers)
    )


# ---------------------------------------------------------------------------- measures
def entropy_bits(weights: Tensor) -> Tensor:
    """Mean over query rows of H(row) = -sum_j p_j log2 p_j, in bits: (..., rows, cols) -> (...)."""
    p = weights.clamp_min(1e-30)
    return -(weights * p.log2()).sum(dim=-1).mean(dim=-1)


def summary_rows(
    maps: AttentionMaps, kind: str, score: AlignmentScore | None = None
) -> list[HeadRow]:
    """Every (layer, head) of a kind: entropy, each row's strongest column, alignment accuracy."""
    w = maps.weights[kind]  # (L, h, rows, cols)
    entropy, strongest = entropy_bits(w), w.argmax(dim=-1)  # (L, h), (L, h, rows)
    cols = maps.labels(kind)[1]
    return [
        HeadRow(
            layer + 1,
            head + 1,
            float(entropy[layer, head]),
            [cols[j] for j in strongest[layer, head].tolist()],
            None if score is None else float(score.accuracy[layer, head]),
            None if score is None else float(score.crossing[layer, head]),
        )
        for layer in range(w.size(0))
        for head in range(w.size(1))
    ]


# ---------------------------------------------------------------------------- the command
ALIGNED = "\naligned: share of gold-aligned target words whose strongest source word is aligned"


@dataclass(frozen=True)
class AttentionRequest:
    """What `tformer inspect-attention` shows of a run: the panels, the search (``beam``), each
    cross-attention head's alignment accuracy on ``align_sentences`` toy test sentences
    (``align``), and where the run is loaded."""

    kind: str = "cross"
    layer: str = "last"
    head: str = "all"
    beam: int = 1
    align: bool = True
    align_sentences: int = 200
    device: str = "auto"
    precision: str = "fp32"
    compile: str = "auto"


def attend(run: LoadedRun, text: str, cfg: DecodeConfig) -> AttentionMaps:
    """Translate ``text`` with ``cfg``'s search and collect every attention map of that pair."""
    src_ids = encode(run.tokenizer, [text])[0]
    if not src_ids:
        raise TformerError("nothing to translate: the text is empty")
    if len(src_ids) + 1 > run.model.cfg.max_positions:
        raise TformerError(  # counted with </s>, as translate and serve count
            f"the text has {len(src_ids) + 1} tokens; this model reads at most"
            f" {run.model.cfg.max_positions}"
        )
    with inference(run.device, run.dtype):
        src = torch.tensor([[*src_ids, EOS_ID]], device=run.device)  # (1, S)
        best = search(run.model, src, dataclasses.replace(cfg, nbest=1))[0][0]
        targets = best.tokens + [EOS_ID] * best.finished
        return inspect_pair(run.model, run.tokenizer, text, src_ids, targets)


def alignment(run: LoadedRun, request: AttentionRequest) -> tuple[AlignmentScore | None, str]:
    """Each cross-attention head's toy alignment accuracy, or ``None`` with a note why not."""
    if not request.align or request.kind != "cross":
        return None, ""
    if run.config.train.data != "toy":
        return None, "alignment accuracy needs gold word alignments: only runs trained on toy"
    pairs, links = read_aligned_corpus(toy_corpus_dir(), "test", request.align_sentences)
    with inference(run.device, run.dtype):
        score = alignment_accuracy(run.model, run.tokenizer, pairs, links)
    if score.words == 0:
        return None, "alignment accuracy: no test pair's subwords map to its words"
    li, hi = score.best()
    return score, (
        f"best aligned head: layer {li + 1} head {hi + 1}, "
        f"{score.accuracy[li, hi]:.1%} of {score.words} gold-aligned target words "
        f"({score.crossing[li, hi]:.1%} of {score.crossing_words} with crossing links) "
        f"on {score.sentences} toy test sentences"
    )


def inspect_attention(
    text: str,
    model_dir: Path | None,
    request: AttentionRequest,
    out: Console,
    err: Console,
    *,
    save: Path | None = None,
    json_path: Path | None = None,
) -> None:
    """Translate, print the heatmaps and the per-head summary, and write the picture (``save``)
    and JSON asked for; bad options fail before any work."""
    kind = request.kind
    check_kind(kind)
    check_picture(save)
    run = load_run(choose_run(model_dir), request.device, request.precision, request.compile)
    n_layers = len(run.model.encoder if kind == "encoder" else run.model.decoder)
    check_selection(kind, request.layer, request.head, n_layers, run.model.cfg.h)
    cfg = DecodeConfig(beam=request.beam, alpha=run.config.train.beam_alpha)  # the run's penalty
    maps = attend(run, text, cfg)
    score, note = alignment(run, request)
    rows = summary_rows(maps, kind, score)
    search_name = "greedy" if request.beam == 1 else f"beam {request.beam}, best hypothesis"
    out.print(f"source: {maps.source}", markup=False)
    out.print(f"translation ({search_name}): {maps.translation}", markup=False)
    out.print()
    accuracy = None if score is None else score.accuracy
    view = select(maps, kind, request.layer, request.head, accuracy)
    color = out.color_system in ("256", "truecolor") and not out.no_color  # 16 colours: shades
    out.print(render.view_terminal(view, out.width, color))
    out.print()
    best_head = score.best() if score is not None else None
    out.print(render.summary_table(rows, kind, best_head, out.width))
    if note:
        out.print(note, markup=False)
    if save is not None:
        legend = note + (ALIGNED if score is not None else "")  # the SVG's; the page has the table
        save_picture(
            save,
            svg=lambda: render.view_svg(view, maps.source, maps.translation, legend),
            html=lambda: render.view_html(view, maps.source, maps.translation, rows, note),
            png=lambda tmp: render.view_png(view, tmp, maps.source, maps.translation),
        )
        err.print(f"wrote {save}", markup=False, highlight=False)
    if json_path is not None:
        extra = {"alignment_note": note} if note else {}
        atomic_write_text(json_path, render.to_json(maps, rows, extra))
        err.print(f"wrote {json_path}", markup=False, highlight=False)
