"""What the pictures of the curves and the attention maps share: SVG elements, the SVG and
HTML documents, matplotlib for PNG (the ``plot`` extra), a ``--save`` file by its suffix."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from xml.sax.saxutils import escape  # SVG and HTML text: & < > escaped

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write, atomic_write_text

SUFFIXES = (".svg", ".html", ".htm", ".png")
CHAR_W = 6.6  # average glyph width of 11 px text, for layout


# ---------------------------------------------------------------------------- SVG and HTML
def quoted(value: object) -> str:
    """A value between single quotes: a float to a tenth, anything else escaped, ``'`` too."""
    return f"{value:.1f}" if isinstance(value, float) else escape(str(value), {"'": "&apos;"})


def element(name: str, content: str | None = None, **attrs: object) -> str:
    """``<name attrs>content</name>``, ``<name attrs/>`` without; ``font_size`` is ``font-size``."""
    pairs = "".join(f" {k.rstrip('_').replace('_', '-')}='{quoted(v)}'" for k, v in attrs.items())
    return f"<{name}{pairs}/>" if content is None else f"<{name}{pairs}>{content}</{name}>"


def text(x: float, y: float, raw: str, size: int, **attrs: object) -> str:
    """The text ``raw`` at ``(x, y)``, ``size`` px high."""
    return element("text", escape(raw), x=x, y=y, font_size=size, **attrs)


def title(tip: str) -> str:
    """The tooltip of the element it is put in."""
    return element("title", escape(tip))


def group(body: Sequence[str], x: float, y: float, **attrs: object) -> str:
    """``body``'s elements as one group moved to ``(x, y)``."""
    return element("g", "".join(body), **attrs, transform=f"translate({quoted(x)} {quoted(y)})")


def text_lines(lines: Sequence[str], y: int, first: int | None) -> list[str]:
    """Lines of 11 px text at x 10, 18 px apart from ``y``; the first ``first`` px and bold."""
    out = [text(10, y + 18 * k, line, 11) for k, line in enumerate(lines)]
    if lines and first:
        out[0] = text(10, y, lines[0], first, font_weight="bold")
    return out


def svg_document(width: int, height: int, body: Sequence[str], style: str = "") -> str:
    """A standalone SVG on a white background: ``style`` (CSS), then ``body``, an element a line."""
    head = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='DejaVu Sans, Helvetica, Arial, sans-serif'>"
    )
    css = [f"<style>{style}</style>"] if style else []
    background = element("rect", width=width, height=height, fill="#fff")
    return "\n".join([head, *css, background, *body, "</svg>\n"])


def html_page(heading: str, body: str, style: str = "") -> str:
    """A self-contained page: ``heading`` as title and first line, ``body``, ``style`` its CSS."""
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(heading)}</title><style>body{{font-family:'DejaVu Sans',Helvetica,Arial,"
        f"sans-serif;margin:1.5em;color:#222}}{style}</style></head><body>\n"
        f"<h1>{escape(heading)}</h1>\n{body}</body></html>\n"
    )


def html_table(head: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "") -> str:
    """A table of text cells (escaped): ``caption``, the ``head`` row, then ``rows``."""
    top = "".join(f"<th>{escape(cell)}</th>" for cell in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    caption = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{caption}<tr>{top}</tr>{body}</table>"


# ---------------------------------------------------------------------------- PNG
def require_matplotlib() -> ModuleType:
    """``matplotlib.pyplot``, drawing off screen; one line of error without the ``plot`` extra."""
    try:
        import matplotlib
    except ImportError:
        raise TformerError(
            "saving .png needs matplotlib, the plot extra: pip install -e '.[plot]' in the"
            " tformer clone (or pip install matplotlib), or save .svg / .html"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_panels(
    n: int, per_row: int, panel: tuple[float, float], margin: tuple[float, float] = (0.0, 0.0)
) -> tuple[Any, Any, list[Any]]:
    """A figure for ``n`` panels of ``panel`` inches, ``per_row`` to a row (``margin`` more):
    the figure, its axes grid, the ``n`` axes."""
    rows = max(1, math.ceil(n / per_row))
    size = (panel[0] * per_row + margin[0], panel[1] * rows + margin[1])
    plt = require_matplotlib()
    fig, axes = plt.subplots(rows, per_row, figsize=size, squeeze=False, constrained_layout=True)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes, list(axes.flat[:n])


def save_png(fig: Any, path: Path, dpi: int) -> None:
    """Write the figure to ``path`` as PNG and free it."""
    fig.savefig(path, dpi=dpi, format="png")
    require_matplotlib().close(fig)


# ---------------------------------------------------------------------------- saving
def check_picture(path: Path | None) -> None:
    """Fail before any work on a ``--save`` name that is no picture, or .png without matplotlib."""
    if path is not None and path.suffix.lower() not in SUFFIXES:
        raise TformerError(f"--save {path}: use a .svg, .html or .png file name")
    if path is not None and path.suffix.lower() == ".png":
        require_matplotlib()


def save_picture(
    path: Path, svg: Callable[[], str], html: Callable[[], str], png: Callable[[Path], object]
) -> None:
    """Write ``path`` as its suffix says: ``svg()``, ``html()``, or ``png(tmp)`` then moved."""
    check_picture(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        atomic_write(path, png, durable=False)
    else:
        atomic_write_text(path, svg() if suffix == ".svg" else html(), durable=False)
