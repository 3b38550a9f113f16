"""Attention maps drawn: in the terminal, as SVG, HTML and PNG (with ``picture.py``), and JSON.

Rows are queries (the generated target tokens, or the source for the encoder), columns keys,
weights coloured from 0 to 1, and each row's strongest cell marked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from torch import Tensor

from tformer_cli.report import picture
from tformer_cli.report.attention.maps import AttentionMaps, HeadRow, Heatmap, View
from tformer_cli.report.picture import CHAR_W, element, escape, text, title

# matplotlib's viridis at 10 even steps: dark purple (0) -> yellow (1), readable in grey too.
VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e",
           "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")  # fmt: skip
SHADES = " ·░▒▓█"  # weight ~0, .2, .4, .6, .8, 1 when the terminal shows no colour
CELL = 2  # terminal characters per column
MAX_LABEL = 12  # longest token label shown in the terminal (longer ones end in "…")


def colour(weight: float) -> str:
    """The viridis colour of a weight in [0, 1], as ``#rrggbb`` (linear between the stops)."""
    x = min(max(weight, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(x), len(VIRIDIS) - 2)
    lo, hi = (tuple(int(c[k : k + 2], 16) for k in (1, 3, 5)) for c in VIRIDIS[i : i + 2])
    return "#" + "".join(f"{round(a + (b - a) * (x - i)):02x}" for a, b in zip(lo, hi, strict=True))


def shade(weight: float) -> str:
    return SHADES[min(len(SHADES) - 1, round(weight * (len(SHADES) - 1)))]


def crop(label: str, width: int = MAX_LABEL) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def axis_names(kind: str) -> tuple[str, str]:
    """What the rows and the columns of a kind's maps are."""
    rows = "source tokens" if kind == "encoder" else "target tokens (generated)"
    return rows, "target prefix (decoder input)" if kind == "decoder" else "source tokens"


def plain(token: str) -> str:
    """A subword without its word-start mark ``▁`` (kept when it is the whole token)."""
    return token[1:] if token.startswith("▁") and len(token) > 1 else token


# ---------------------------------------------------------------------------- terminal
def _panel_text(panel: Heatmap, rows: Sequence[str], cols: Sequence[str], color: bool) -> Text:
    """One heatmap as text over the first len(cols) columns: labels written downwards, a shade
    per weight, each row's strongest cell (over all columns) as its weight in percent."""
    w = panel.weights  # (rows, all columns)
    label_w = max(len(crop(r)) for r in rows)
    col_labels = [crop(c) for c in cols]
    height = max(len(c) for c in col_labels)
    width = label_w + 1 + CELL * len(cols)
    text = Text()
    text.append((panel.title if len(panel.title) <= width else panel.short) + "\n", style="bold")
    for line in range(height):  # labels written downwards, ending just above the grid
        chars = [
            (c[line - height + len(c)] if line >= height - len(c) else " ") for c in col_labels
        ]
        text.append(" " * (label_w + 1) + "".join(ch.ljust(CELL) for ch in chars).rstrip() + "\n")
    best = w.argmax(dim=-1).tolist()
    for r, row in enumerate(rows):
        text.append(crop(row).rjust(label_w) + " ")
        for c, weight in enumerate(w[r, : len(cols)].tolist()):
            cell = f"{min(99, round(100 * weight)):2d}" if c == best[r] else None
            if color:
                fg = "#000000" if weight > 0.55 else "#ffffff"
                text.append(cell or " " * CELL, Style(color=fg, bgcolor=colour(weight)))
            else:
                text.append(cell or shade(weight) * CELL)
        text.append("\n")
    text.rstrip()
    return text


def legend(color: bool) -> Text:
    """The colour (or shade) scale and what the numbers mean."""
    text = Text("weights: ")
    if color:
        text.append("0 ")
        for k in range(11):
            text.append(" ", Style(bgcolor=colour(k / 10)))
        text.append(" 1")
    else:
        text.append("blank ~0  · .2  ░ .4  ▒ .6  ▓ .8  █ 1")
    text.append("; digits: each row's strongest cell, its weight in %")
    return text


def view_terminal(view: View, width: int = 100, color: bool = True) -> RenderableType:
    """The view's panels side by side as far as ``width`` allows; columns that do not fit are
    cropped, with a note."""
    rows, cols = [plain(t) for t in view.row_labels], [plain(t) for t in view.col_labels]
    label_w = max(len(crop(r)) for r in rows)
    fit = max(1, (width - label_w - 1) // CELL)
    notes = []
    if len(cols) > fit:
        notes.append(
            f"cropped: first {fit} of {len(cols)} columns shown;"
            " widen the terminal or --save FILE.svg for all"
        )
    shown = cols[:fit]
    panels = [_panel_text(p, rows, shown, color) for p in view.panels]
    panel_w = label_w + 1 + CELL * len(shown)
    per_row = view.columns((width + 3) // (panel_w + 3))
    grid = Table.grid(padding=(1, 3))
    for _ in range(per_row):
        grid.add_column(no_wrap=True)
    for i in range(0, len(panels), per_row):
        chunk = panels[i : i + per_row]
        grid.add_row(*chunk, *[""] * (per_row - len(chunk)))
    row_axis, col_axis = axis_names(view.kind)
    head = Text(f"{view.title}\nrows: {row_axis} · columns: {col_axis}", style="bold")
    return Group(head, grid, Text(), legend(color), *(Text(n, style="yellow") for n in notes))


def head_cells(row: HeadRow, aligned: bool) -> list[str]:
    """A head's numbers as the per-head tables show them."""
    cells = [str(row.layer), str(row.head), f"{row.entropy:.2f}"]
    return cells + ([f"{row.alignment:.1%}", f"{row.crossing:.1%}"] if aligned else [])


def summary_table(
    rows: Sequence[HeadRow], kind: str, best: tuple[int, int] | None, width: int = 100
) -> Table:
    """Per head: entropy, alignment accuracy, each row's strongest column; the best head bold."""
    table = Table(title=f"{kind} attention per head", title_justify="left")
    names = ["layer", "head", "entropy (bits)"]
    aligned = any(r.alignment is not None for r in rows)
    if aligned:
        names += ["aligned", "crossing"]
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    fixed = sum(map(len, names)) + 3 * len(names) + 4  # padding and borders
    what = "source" if kind != "decoder" else "prefix"
    table.add_column(
        f"strongest {what} token per row",
        no_wrap=True,
        overflow="ellipsis",
        max_width=max(10, width - fixed),
    )
    for r in rows:  # no_wrap: the headers are wider than the numbers
        cells = [*head_cells(r, aligned), " ".join(plain(t) for t in r.strongest)]
        star = best is not None and (r.layer - 1, r.head - 1) == best
        table.add_row(*cells, style="bold green" if star else None)
    return table


# ---------------------------------------------------------------------------- SVG / HTML
def _heatmap_svg(
    heading: str, w: Tensor, rows: Sequence[str], cols: Sequence[str], c: float
) -> tuple[list[str], tuple[float, float]]:
    """SVG elements of one heatmap at the origin, and its (width, height)."""
    left = max(len(r) for r in rows) * CHAR_W + 10
    top = 22 + max(len(s) for s in cols) * CHAR_W * 0.87 + 8  # labels rotated by 60 degrees
    out = [text(left, 14, heading, 12, font_weight="bold")]
    for j, col in enumerate(cols):
        x, y = left + (j + 0.5) * c, top - 4
        out.append(text(x, y, col, 11, transform=f"rotate(-60 {x:.1f} {y:.1f})"))
    best = w.argmax(dim=-1).tolist()
    for i, row in enumerate(rows):
        y = top + i * c
        out.append(text(left - 5, y + c / 2 + 4, row, 11, text_anchor="end"))
        for j, weight in enumerate(w[i].tolist()):
            tip, x = title(f"{row} → {cols[j]}: {weight:.3f}"), left + j * c
            out.append(element("rect", tip, x=x, y=y, width=c, height=c, fill=colour(weight)))
        cx, cy = left + (best[i] + 0.5) * c, y + c / 2
        mark = {"fill": "#fff", "stroke": "#000", "stroke_width": 0.8}
        out.append(element("circle", cx=cx, cy=cy, r=c / 5, **mark))
    return out, (left + len(cols) * c + 16, top + len(rows) * c + 16)


def view_svg(view: View, source: str = "", translation: str = "", note: str = "") -> str:
    """A standalone SVG: title, source and translation, one panel per head/layer, colour bar."""
    rows, cols = view.row_labels, view.col_labels
    c = max(10.0, min(22.0, 520 / max(len(rows), len(cols))))
    panels = [_heatmap_svg(p.title, p.weights, rows, cols, c) for p in view.panels]
    pw, ph = panels[0][1]
    per_row = view.columns(int(1600 // pw))
    lines = [view.title]
    if source:
        lines.append(f"source: {source}")
    if translation:
        lines.append(f"translation: {translation}")
    row_axis, col_axis = axis_names(view.kind)
    lines.append(f"rows: {row_axis} · columns: {col_axis} · dot: strongest cell per row")
    lines += note.splitlines()
    header = 18 * len(lines) + 40
    n_rows = math.ceil(len(panels) / per_row)
    width = max(per_row * pw, 360, max(len(s) for s in lines) * CHAR_W * 1.05 + 20)
    stops = "".join(
        element("stop", offset=f"{k / (len(VIRIDIS) - 1):.3f}", stop_color=s)
        for k, s in enumerate(VIRIDIS)
    )
    scale = element("defs", element("linearGradient", stops, id="scale"))
    body = [scale, *picture.text_lines(lines, 20, 14)]
    y0 = 18 * len(lines) + 12
    bar = element("rect", x=62, y=y0, width=200, height=14, fill="url(#scale)", stroke="#888")
    body += [text(10, y0 + 11, "weight 0", 11), bar, text(268, y0 + 11, "1", 11)]
    for k, (elements, _) in enumerate(panels):
        body.append(picture.group(elements, (k % per_row) * pw, header + (k // per_row) * ph))
    crisp = "rect{shape-rendering:crispEdges}"  # no seams between cells
    return picture.svg_document(round(width), round(header + n_rows * ph), body, crisp)


def view_html(
    view: View, source: str, translation: str, rows: Sequence[HeadRow] = (), note: str = ""
) -> str:
    """One self-contained page: the SVG inline, how to read it, and the per-head table."""
    table = ""
    if rows:
        aligned = any(r.alignment is not None for r in rows)
        head = ["layer", "head", "entropy (bits)"]
        head += ["alignment accuracy", "on crossing links"] if aligned else []
        cells = [head_cells(r, aligned) for r in rows]
        caption = "Entropy: mean bits per row on this sentence (0 = one position). " + (
            "Alignment accuracy: share of gold-aligned target words of the toy test split "
            "whose strongest source word is an aligned one; crossing: the same for reordered "
            "words only."
            if aligned
            else ""
        )
        table = picture.html_table(head, cells, caption)
    body = (
        f"<p><b>Source:</b> {escape(source)}<br><b>Translation:</b> {escape(translation)}</p>\n"
        "<p>Each panel is one attention head: a row is a query token, a column a key token, and "
        "the colour the share of the row's attention given to that column (each row sums to 1). "
        "The dot marks each row's strongest cell. Hover a cell for its exact weight.</p>\n"
        f"{view_svg(view, source, translation, note)}"
        f"{f'<p>{escape(note)}</p>' if note else ''}{table}\n"
    )
    style = (
        "table{border-collapse:collapse;margin-top:1em}td,th{border:1px solid #ccc;"
        "padding:.2em .6em;text-align:right}th{background:#f3f3f3}p{max-width:60em}"
    )
    return picture.html_page(view.title, body, style)


# ---------------------------------------------------------------------------- PNG / JSON
def view_png(view: View, path: Path, source: str = "", translation: str = "") -> None:
    """Draw the view with matplotlib (the ``plot`` extra) into ``path``."""
    rows, cols = view.row_labels, view.col_labels
    per_row = view.columns(4)
    size = (0.3 * len(cols) + 1.8, 0.3 * len(rows) + 1.6)
    fig, grid, axes = picture.png_panels(len(view.panels), per_row, size, (1.2, 1.0))
    image = None
    for k, (panel, ax) in enumerate(zip(view.panels, axes, strict=True)):
        w = panel.weights.numpy()
        image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        ax.scatter(w.argmax(axis=1), range(len(rows)), s=12, c="white", edgecolors="black")
        ax.set_xticks(range(len(cols)), cols, rotation=60, ha="left", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.xaxis.tick_top()
        ax.set_xlabel(panel.title, fontsize=9, fontweight="bold")
        if k % per_row == 0:
            ax.set_ylabel(axis_names(view.kind)[0], fontsize=8)
    fig.colorbar(image, ax=grid, shrink=0.6, label="attention weight (dot: strongest per row)")
    lines = [view.title, f"columns: {axis_names(view.kind)[1]}"]
    lines += [f"source: {source}", f"translation: {translation}"]
    fig.suptitle("\n".join(lines), fontsize=9)
    picture.save_png(fig, path, 150)


def to_json(maps: AttentionMaps, rows: Sequence[HeadRow] = (), extra: dict | None = None) -> str:
    """The raw weights of every kind with their token labels, for notebooks."""
    kinds = {}
    for kind, w in maps.weights.items():
        row_labels, col_labels = maps.labels(kind)
        kinds[kind] = {
            "rows": row_labels,
            "cols": col_labels,
            "weights": [
                [[[round(x, 6) for x in r] for r in h] for h in layer] for layer in w.tolist()
            ],
        }
    record = {
        "source": maps.source,
        "translation": maps.translation,
        "src_tokens": maps.src_tokens,
        "tgt_inputs": maps.tgt_inputs,
        "tgt_tokens": maps.tgt_tokens,
        "layout": "attention[kind]['weights'][layer][head][row][col], 0-based; each row sums to 1",
        "attention": kinds,
        "heads": [vars(r) for r in rows],
        **(extra or {}),
    }
    return json.dumps(record, ensure_ascii=False) + "\n"
