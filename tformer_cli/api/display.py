"""What the API returns, and how a notebook shows it (``_repr_html_``): translations with their
n-best lists, attention maps, a traced search as a beam tree, an evaluation report, curves."""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from html import escape
from typing import Any

from rich.console import Console, RenderableType
from tokenizers import Tokenizer
from torch import Tensor

from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.trace import FINISHED, KEPT, Live, Trace
from tformer_cli.report.attention import render
from tformer_cli.report.attention.maps import AttentionMaps, HeadRow
from tformer_cli.report.attention.view import select
from tformer_cli.report.curves import Chart, chart_svg
from tformer_cli.report.evaluation import EvalReport, render_report


def rich_html(renderable: RenderableType, width: int = 100) -> str:
    """A rich renderable (the CLI's tables) as an HTML fragment with inline styles."""
    console = Console(
        record=True, width=width, file=io.StringIO(), force_terminal=True, force_jupyter=False
    )
    console.print(renderable)
    return console.export_html(
        inline_styles=True, code_format="<pre style='{stylesheet}'>{code}</pre>"
    )


@dataclass(frozen=True)
class Hyp:
    """One hypothesis of an n-best list: its text, token pieces (``</s>`` last when
    ``finished``: ``</s>`` ended it), score (beam: length-normalised; MBR: expected utility),
    summed log-probability, and the log-probability of each token."""

    text: str
    tokens: list[str]
    score: float
    logprob: float
    token_logprobs: list[float]
    finished: bool


@dataclass(frozen=True)
class Translated:
    """One input's translation: the best hypothesis' fields, and the whole n-best list."""

    source: str
    nbest: list[Hyp]

    @property
    def text(self) -> str:
        return self.nbest[0].text

    @property
    def tokens(self) -> list[str]:
        return self.nbest[0].tokens

    @property
    def score(self) -> float:
        return self.nbest[0].score

    @property
    def logprob(self) -> float:
        return self.nbest[0].logprob

    @property
    def token_logprobs(self) -> list[float]:
        return self.nbest[0].token_logprobs

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{i}</td><td>{h.score:.4f}</td><td>{h.logprob:.3f}</td>"
            f"<td style='text-align:left'>{escape(h.text)}</td></tr>"
            for i, h in enumerate(self.nbest, start=1)
        )
        return (
            f"<p><b>source:</b> {escape(self.source)}</p><table><tr><th>#</th><th>score</th>"
            f"<th>log p</th><th style='text-align:left'>translation</th></tr>{rows}</table>"
        )


@dataclass(frozen=True)
class Score:
    """Teacher-forced log-probabilities of a target given its source: per token (``</s>``
    last) and their sum."""

    source: str
    target: str
    tokens: list[str]
    token_logprobs: list[float]

    @property
    def logprob(self) -> float:
        return sum(self.token_logprobs)


@dataclass(frozen=True)
class Attention:
    """Every attention map of one sentence pair: ``weights[kind]`` (layer, head, query, key)
    for ``cross``, ``encoder`` and ``decoder``, their token labels (``labels(kind)``), and the
    per-head summary of cross-attention ``tformer inspect-attention`` prints (entropy in bits,
    strongest source token per row, alignment accuracy for toy runs)."""

    maps: AttentionMaps
    heads: list[HeadRow]
    note: str = ""

    @property
    def source(self) -> str:
        return self.maps.source

    @property
    def translation(self) -> str:
        return self.maps.translation

    @property
    def weights(self) -> dict[str, Tensor]:
        return self.maps.weights

    def labels(self, kind: str = "cross") -> tuple[list[str], list[str]]:
        """(query labels, key labels) of a kind's maps."""
        return self.maps.labels(kind)

    def to_json(self) -> str:
        """Every weight with its tokens, the summary and its note: ``inspect-attention --json``."""
        return render.to_json(
            self.maps, self.heads, {"alignment_note": self.note} if self.note else {}
        )

    def _repr_html_(self) -> str:
        view = select(self.maps, "cross", "all", "all")
        rows = "".join(
            f"<tr><td>{r.layer}</td><td>{r.head}</td><td>{r.entropy:.2f}</td>"
            f"<td>{'' if r.alignment is None else f'{r.alignment:.1%}'}</td></tr>"
            for r in self.heads
        )
        table = (
            "<table><tr><th>layer</th><th>head</th><th>entropy (bits)</th><th>aligned</th></tr>"
            f"{rows}</table>"
        )
        note = f"<p>{escape(self.note)}</p>" if self.note else ""
        return render.view_svg(view, self.source, self.translation) + note + table


@dataclass(frozen=True)
class TraceView:
    """A traced search (``decode.trace.Trace``) with the tokenizer to read it: ``steps`` and
    ``final`` as the trace holds them; ``to_dict``/``to_json`` as ``translate --trace`` writes."""

    trace: Trace
    tokenizer: Tokenizer
    source: str

    @property
    def steps(self) -> list[list[Live]]:
        return self.trace.steps

    @property
    def final(self) -> list[Hypothesis]:
        return self.trace.final

    def to_dict(self) -> dict[str, Any]:
        return self.trace.to_dict(self.tokenizer, self.source)

    def to_json(self) -> str:
        return self.trace.to_json(self.tokenizer, self.source)

    def _repr_html_(self) -> str:
        return trace_html(self.to_dict())


COLOURS = {KEPT: "#1a7f37", FINISHED: "#0550ae", "pruned": "#8c959f"}


def trace_html(data: dict[str, Any]) -> str:
    """The beam tree: each hypothesis under its parent, with its next-token candidates coloured
    kept (green), finished (blue) or pruned (grey), then the final n-best list."""
    nodes = {h["id"]: h for step in data["steps"] for h in step}
    children: dict[int | None, list[int]] = {}
    for h in nodes.values():
        children.setdefault(h["parent"], []).append(h["id"])

    def node(number: int) -> str:
        h = nodes[number]
        label = escape(h["tokens"][-1]) if h["tokens"] else "&lt;s&gt;"
        chips = " ".join(
            f"<span style='color:{COLOURS[c['status']]}' title='{c['status']}, log p "
            f"{c['logprob']:.3f}'>{escape(c['token'])} {c['p']:.2f}</span>"
            for c in h["next"]
        )
        inner = "".join(node(c) for c in children.get(number, []))
        return f"<li><b>{label}</b> <small>→ {chips}</small><ul>{inner}</ul></li>"

    roots = "".join(node(c) for c in children.get(None, []))
    final = "".join(
        f"<li>{f['score']:.4f} {escape(f['text'])}{'' if f['finished'] else ' (cut off)'}</li>"
        for f in data["final"]
    )
    legend = " · ".join(f"<span style='color:{c}'>{s}</span>" for s, c in COLOURS.items())
    return (
        f"<p><b>source:</b> {escape(data['source'])} · beam {data['beam']} · {legend}</p>"
        f"<ul style='list-style:none;font-family:monospace'>{roots}</ul>"
        f"<p><b>final</b></p><ol>{final}</ol>"
    )


class Evaluated(EvalReport):
    """The ``EvalReport`` of ``tformer eval``, with ``to_dict()`` (its ``--json`` object) and a
    notebook display (the command's tables)."""

    @classmethod
    def of(cls, report: EvalReport) -> Evaluated:
        return cls(**{f.name: getattr(report, f.name) for f in dataclasses.fields(report)})

    def _repr_html_(self) -> str:
        return rich_html(render_report(self))


@dataclass(frozen=True)
class Curves:
    """A run's training curves (``tformer show``'s panels), drawn as SVG in a notebook."""

    chart: Chart

    def _repr_html_(self) -> str:
        return chart_svg(self.chart)
