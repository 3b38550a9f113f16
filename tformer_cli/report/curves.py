"""Training curves from ``log.jsonl``, for `tformer show` and `tformer compare --save`:
``run_series`` reads the records, ``make_chart`` lays runs out as panels over updates or training
time, and ``chart_terminal``, ``chart_svg``, ``chart_html`` and ``chart_png`` draw the chart.
Validation records have no ``elapsed``: their time is interpolated on the update count."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from tformer_cli.errors import TformerError
from tformer_cli.report import picture
from tformer_cli.report.picture import element, text, title

X_AXES = ("updates", "time")


@dataclass(frozen=True)
class SeriesSpec:
    """A log field drawn as a curve: its title, a log-scale y axis, dots at each point."""

    key: str
    title: str
    log_y: bool = False
    markers: bool = False


SERIES: tuple[SeriesSpec, ...] = (
    SeriesSpec("loss", "train loss (label-smoothed, per target token)"),
    SeriesSpec("valid_loss", "valid loss (cross-entropy)", markers=True),
    SeriesSpec("valid_ppl", "valid perplexity", log_y=True, markers=True),
    SeriesSpec("valid_bleu", "valid BLEU (greedy)", markers=True),
    SeriesSpec("lr", "learning rate"),
    SeriesSpec("tgt_tokens_per_s", "target tokens/s"),
    SeriesSpec("eps", "teacher-forcing probability eps (scheduled sampling)"),
)


# ---------------------------------------------------------------------------- measure
@dataclass(frozen=True)
class Point:
    step: int
    seconds: float | None  # training time at this update; None where it cannot be told
    value: float


@dataclass(frozen=True)
class Series:
    spec: SeriesSpec
    points: tuple[Point, ...]


def number(value: object) -> float | None:
    """A finite int or float of a record (bools and NaN are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def step_of(record: dict[str, Any]) -> int | None:
    """The record's update count, if it has one."""
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def step_clock(records: Sequence[dict[str, Any]]) -> Callable[[int], float | None]:
    """Training time at any update count from the records' ``elapsed`` (0 s at update 0), linear
    between known points and past the last."""
    known: dict[int, float] = {0: 0.0}
    for r in records:
        seconds, step = number(r.get("elapsed")), step_of(r)
        if seconds is not None and step is not None:
            known[step] = seconds
    steps = sorted(known)
    times = [known[s] for s in steps]

    def at(step: int) -> float | None:
        if len(steps) < 2:
            return None
        i = bisect.bisect_left(steps, step)
        if i < len(steps) and steps[i] == step:
            return times[i]
        lo, hi = (i - 1, i) if i < len(steps) else (len(steps) - 2, len(steps) - 1)
        lo = max(lo, 0)
        rate = (times[hi] - times[lo]) / (steps[hi] - steps[lo])
        return times[lo] + rate * (step - steps[lo])

    return at


def run_series(records: Sequence[dict[str, Any]]) -> list[Series]:
    """Every series of ``SERIES`` that the records hold, in that order, points by update."""
    clock = step_clock(records)
    out = []
    for spec in SERIES:
        points = []
        for r in records:
            value, step = number(r.get(spec.key)), step_of(r)
            if value is None or step is None:
                continue
            seconds = number(r.get("elapsed"))
            points.append(Point(step, seconds if seconds is not None else clock(step), value))
        if points:
            out.append(Series(spec, tuple(sorted(points, key=lambda p: p.step))))
    return out


@dataclass(frozen=True)
class Line:
    label: str  # the run's name
    points: tuple[tuple[float, float], ...]  # (x, y), x ascending


@dataclass(frozen=True)
class Panel:
    spec: SeriesSpec
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    panels: tuple[Panel, ...]
    notes: tuple[str, ...] = ()

    @property
    def labels(self) -> list[str]:
        """Each run's name once, in order of first appearance."""
        return list(dict.fromkeys(line.label for p in self.panels for line in p.lines))

    @property
    def colours(self) -> dict[str, str]:
        """Each run's colour in the pictures."""
        return {label: PALETTE[k % len(PALETTE)] for k, label in enumerate(self.labels)}

    @property
    def per_row(self) -> int:
        """Panels per row in the pictures."""
        return 1 if len(self.panels) < 2 else 2


def make_chart(
    runs: Sequence[tuple[str, Sequence[Series]]], x: str = "updates", title: str = ""
) -> Chart:
    """One panel per series any run has (in ``SERIES`` order), one line per run in it.
    ``x``: ``updates`` or ``time`` (minutes of training). Points without a time (on the time
    axis) or non-positive on a log axis are left out, and counted in the notes."""
    check_axis(x)
    panels, no_time, non_positive = [], 0, 0
    for spec in SERIES:
        lines = []
        for name, series in runs:
            found = next((s for s in series if s.spec.key == spec.key), None)
            if found is None:
                continue
            xy = []
            for p in found.points:
                if x == "time" and p.seconds is None:
                    no_time += 1
                elif spec.log_y and p.value <= 0:
                    non_positive += 1
                else:
                    xy.append((p.step if x == "updates" else p.seconds / 60, p.value))
            if xy:
                lines.append(Line(name, tuple(sorted(xy))))
        if lines:
            panels.append(Panel(spec, tuple(lines)))
    notes = []
    if no_time:
        notes.append(f"{no_time} points without a training time (no elapsed in the log) left out")
    if non_positive:
        notes.append(f"{non_positive} points <= 0 left out of log-scale panels")
    x_label = "updates" if x == "updates" else "training time (minutes, validation included)"
    return Chart(title, x_label, tuple(panels), tuple(notes))


# ---------------------------------------------------------------------------- numbers and axes
def num(value: float) -> str:
    """A value as a chart label: ``18,831``, ``98.91``, ``1.032``, ``9.70e-04``."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 0.01:
        return f"{value:.4g}"
    return f"{value:.2e}"


def value_range(values: Sequence[float], log_y: bool = False) -> tuple[float, float]:
    """``(lo, hi)`` covering the values, widened around a single value."""
    lo, hi = min(values), max(values)
    if hi > lo:
        return lo, hi
    if log_y:
        return lo / 1.5, hi * 1.5
    pad = abs(lo) * 0.05 or 1.0
    return lo - pad, hi + pad


def nice_ticks(lo: float, hi: float, n: int = 5) -> tuple[list[float], float]:
    """Round tick values within ``[lo, hi]`` (steps 1, 2, 2.5 or 5 x 10^k), and the step."""
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    k = math.ceil(lo / step - 1e-9)
    ticks = []
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12) + 0.0)  # + 0.0: no -0.0
        k += 1
    return ticks, step


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 x 10^k within ``[lo, hi]`` (powers of ten when too many; the ends when none)."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [m * 10**k for k in range(k0, k1 + 1) for m in (1, 2, 5) if lo <= m * 10**k <= hi]
    if len(ticks) > 7:
        ticks = [t for t in ticks if math.isclose(10 ** round(math.log10(t)), t)]
    return ticks if len(ticks) >= 2 else [lo, hi]


def tick_label(t: float, step: float | None) -> str:
    """A tick value with as many decimals as its step needs."""
    if step is None or not 1e-3 <= step < 1e5:
        return num(t)
    if float(step).is_integer():
        return f"{t:,.0f}"
    decimals = max(0, -math.floor(math.log10(step)))
    while decimals < 6 and not math.isclose(round(step, decimals), step):
        decimals += 1
    return f"{t:.{decimals}f}"


class Scale:
    """Data -> [0, 1] on a linear or log axis."""

    def __init__(self, lo: float, hi: float, log: bool = False) -> None:
        self.log = log
        self.lo, self.hi = (math.log10(lo), math.log10(hi)) if log else (lo, hi)

    def __call__(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        return (v - self.lo) / (self.hi - self.lo) if self.hi > self.lo else 0.5


def panel_ranges(
    panel: Panel, margin: float = 0.0
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The x and y ranges of a panel's points, widened by ``margin`` of their span each side."""
    xs = [x for line in panel.lines for x, _ in line.points]
    ys = [y for line in panel.lines for _, y in line.points]
    (x0, x1), (y0, y1) = value_range(xs), value_range(ys, panel.spec.log_y)
    dx = (x1 - x0) * margin
    if panel.spec.log_y:
        f = (y1 / y0) ** margin
        return (x0 - dx, x1 + dx), (y0 / f, y1 * f)
    dy = (y1 - y0) * margin
    return (x0 - dx, x1 + dx), (y0 - dy, y1 + dy)


# ---------------------------------------------------------------------------- terminal
BRAILLE_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [dot row][dot column]
STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def braille(
    lines: Sequence[Sequence[tuple[float, float]]], width: int, height: int, sx: Scale, sy: Scale
) -> list[list[tuple[int, int]]]:
    """Rows of ``(braille bits, index of the line drawn last in the cell)``: each line's points
    joined on a ``2*width`` x ``4*height`` dot grid."""
    grid = [[(0, -1) for _ in range(width)] for _ in range(height)]
    w, h = 2 * width - 1, 4 * height - 1

    def dot(px: int, py: int, k: int) -> None:
        bits, _ = grid[py // 4][px // 2]
        grid[py // 4][px // 2] = (bits | BRAILLE_DOTS[py % 4][px % 2], k)

    for k, points in enumerate(lines):
        dots = [(round(sx(x) * w), round((1 - sy(y)) * h)) for x, y in points]
        for (x0, y0), (x1, y1) in itertools.pairwise(dots):
            n = max(abs(x1 - x0), abs(y1 - y0), 1)
            for i in range(n + 1):
                dot(round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n), k)
        if len(dots) == 1:
            dot(*dots[0], k)
    return grid


def summary(points: Sequence[tuple[float, float]], x_unit: str) -> str:
    """``last 1.032 at 866 · min 0.97 at 850 · max 5.88 at 25``."""
    at = (lambda x: f"{x:,.0f}") if x_unit == "updates" else (lambda x: f"{x:.1f} min")
    last = points[-1]
    lo = min(points, key=lambda p: p[1])
    hi = max(points, key=lambda p: p[1])
    return (
        f"last {num(last[1])} at {at(last[0])} · min {num(lo[1])} at {at(lo[0])}"
        f" · max {num(hi[1])} at {at(hi[0])}"
    )


def render_panel(panel: Panel, x_label: str, width: int = 80, height: int = 4) -> Text:
    """One panel as text: title, a summary per line, a braille plot with its y and x ranges."""
    (x0, x1), (y0, y1) = panel_ranges(panel)
    sx, sy = Scale(x0, x1), Scale(y0, y1, panel.spec.log_y)
    top, bottom = num(y1), num(y0)
    label_w = max(len(top), len(bottom))
    cols = max(10, width - label_w - 2)
    grid = braille([line.points for line in panel.lines], cols, height, sx, sy)
    unit = "updates" if x_label == "updates" else "minutes"
    text = Text()
    text.append(panel.spec.title, style="bold")
    if panel.spec.log_y:
        text.append(" (log scale)", style="dim")
    many = len(panel.lines) > 1
    for k, line in enumerate(panel.lines):
        text.append("\n  ")
        if many:
            text.append(f"{line.label}: ", style=STYLES[k % len(STYLES)])
        text.append(summary(line.points, unit), style="dim")
    for r, row in enumerate(grid):
        label = top if r == 0 else bottom if r == height - 1 else ""
        text.append(f"\n{label.rjust(label_w)} {'┤' if label else '│'}")
        for bits, k in row:
            if bits:
                text.append(chr(0x2800 + bits), style=STYLES[k % len(STYLES)])
            else:
                text.append(" ")
    spec = ",.0f" if unit == "updates" else ".1f"
    left, right = f"{x0:{spec}}", f"{x1:{spec}}"
    middle = max(len(unit) + 2, cols - len(left) - len(right))
    axis = f"{left}{unit.center(middle)}{right}"
    text.append(f"\n{' ' * label_w} └{'─' * cols}\n{' ' * (label_w + 2)}{axis}", style="dim")
    return text


def chart_terminal(chart: Chart, width: int = 100, height: int = 4) -> RenderableType:
    """Every panel of the chart, one under the other, then the notes."""
    parts: list[RenderableType] = []
    if chart.title:
        parts.append(Text(chart.title, style="bold"))
    if len(chart.labels) > 1:
        legend = Text("runs: ")
        for k, label in enumerate(chart.labels):
            legend.append(f"⣿ {label}  ", style=STYLES[k % len(STYLES)])
        parts.append(legend)
    if not chart.panels:
        parts.append(Text("no curves: the log holds no training or validation records yet"))
    for panel in chart.panels:
        parts += [Text(""), render_panel(panel, chart.x_label, min(width - 1, 120), height)]
    parts += [Text(note, style="yellow") for note in chart.notes]
    return Group(*parts)


# ---------------------------------------------------------------------------- SVG / HTML / PNG
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
PANEL_W, PANEL_H = 460, 250
LEFT, TOP = 70, 34  # a panel's plot area, which ends 16 from its right and 44 from its bottom
PLOT_W, PLOT_H = PANEL_W - LEFT - 16, PANEL_H - TOP - 44


def _panel_svg(panel: Panel, x_label: str, colours: dict[str, str]) -> list[str]:
    """One panel's SVG elements at the origin: frame, grid and ticks, one polyline per run."""
    (x0, x1), (y0, y1) = panel_ranges(panel, margin=0.04)
    sx, sy = Scale(x0, x1), Scale(y0, y1, panel.spec.log_y)
    left, top, pw, ph = LEFT, TOP, PLOT_W, PLOT_H

    def px(x: float) -> float:
        return left + sx(x) * pw

    def py(y: float) -> float:
        return top + (1 - sy(y)) * ph

    heading = panel.spec.title + (" (log scale)" if panel.spec.log_y else "")
    out = [
        text(left, 20, heading, 13, font_weight="bold"),
        element("rect", x=left, y=top, width=pw, height=ph, fill="#fff", stroke="#999"),
    ]
    if panel.spec.log_y:
        yticks, ystep = log_ticks(y0, y1), None
    else:
        yticks, ystep = nice_ticks(y0, y1, 5)
    for t in yticks:
        y = py(t)
        out.append(element("line", x1=left, y1=y, x2=left + pw, y2=y, stroke="#e5e5e5"))
        out.append(text(left - 6, y + 4, tick_label(t, ystep), 11, text_anchor="end"))
    xticks, xstep = nice_ticks(x0, x1, 5)
    if x_label == "updates":
        xstep = max(xstep, 1.0)
        xticks = [t for t in xticks if float(t).is_integer()]
    for t in xticks:
        x = px(t)
        out.append(element("line", x1=x, y1=top, x2=x, y2=top + ph, stroke="#f0f0f0"))
        out.append(text(x, top + ph + 16, tick_label(t, xstep), 11, text_anchor="middle"))
    out.append(text(left + pw / 2, PANEL_H - 6, x_label, 11, text_anchor="middle", fill="#555"))
    for line in panel.lines:
        colour = colours[line.label]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line.points)
        tip = title(f"{line.label}: {panel.spec.title}")
        out.append(
            element("polyline", tip, class_="series", data_series=panel.spec.key,
                    data_run=line.label, points=points, fill="none", stroke=colour,
                    stroke_width=1.6, stroke_linejoin="round")
        )  # fmt: skip
        if panel.spec.markers or len(line.points) == 1:
            for x, y in line.points:
                tip = title(f"{line.label}: {num(y)} at {num(x)}")
                out.append(element("circle", tip, cx=px(x), cy=py(y), r=2.6, fill=colour))
    return out


def chart_svg(chart: Chart) -> str:
    """A standalone SVG: title, legend (several runs), notes, the panels two per row."""
    labels, colours, per_row = chart.labels, chart.colours, chart.per_row
    header = [chart.title] if chart.title else []
    header += list(chart.notes)
    legend_h = 20 if len(labels) > 1 else 0
    top = 10 + 18 * len(header) + legend_h + 6
    rows = max(1, math.ceil(len(chart.panels) / per_row))
    body = picture.text_lines(header, 22, 15 if chart.title else None)
    if legend_h:
        x, y = 10.0, 10 + 18 * len(header) + 14
        for label in labels:
            key = element("rect", x=round(x), y=y - 9, width=14, height=4, fill=colours[label])
            body.append(key + text(round(x + 18), y, label, 11))
            x += 18 + len(label) * picture.CHAR_W + 16
    if not chart.panels:
        body.append(text(10, top + 20, "no curves in the log yet", 12))
    for k, panel in enumerate(chart.panels):
        x, y = (k % per_row) * PANEL_W, top + (k // per_row) * PANEL_H
        inner = _panel_svg(panel, chart.x_label, colours)
        body.append(picture.group(inner, x, y, class_="panel", data_series=panel.spec.key))
    return picture.svg_document(per_row * PANEL_W, top + rows * PANEL_H, body)


def chart_html(chart: Chart, intro: str = "") -> str:
    """One self-contained page: ``intro`` (HTML, e.g. a settings table), then the SVG."""
    body = f"{intro}<p>Hover a line or a dot for its run and value.</p>\n{chart_svg(chart)}"
    style = (
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:.2em .6em;text-align:left}th{background:#f3f3f3;font-weight:normal}"
    )
    return picture.html_page(chart.title or "training curves", body, style)


def chart_png(chart: Chart, path: Path) -> None:
    """Draw the chart with matplotlib (the ``plot`` extra) into ``path``, panels two per row."""
    fig, _, axes = picture.png_panels(len(chart.panels), chart.per_row, (6.2, 3.2))
    for panel, ax in zip(chart.panels, axes, strict=True):
        for line in panel.lines:
            xs, ys = zip(*line.points, strict=True)
            marker = "o" if panel.spec.markers or len(xs) == 1 else None
            ax.plot(xs, ys, color=chart.colours[line.label], marker=marker, markersize=3,
                    linewidth=1.4, label=line.label)  # fmt: skip
        if panel.spec.log_y:
            ax.set_yscale("log")
        ax.set_title(panel.spec.title, fontsize=10)
        ax.set_xlabel(chart.x_label, fontsize=9)
        ax.grid(alpha=0.3)
        if len(chart.labels) > 1:
            ax.legend(fontsize=8)
    if chart.title:
        fig.suptitle(chart.title, fontsize=11)
    picture.save_png(fig, path, 130)


def check_axis(x: str) -> None:
    """Fail before any work on an x axis (``--x``) this module does not draw."""
    if x not in X_AXES:
        raise TformerError(f"--x {x}: use updates or time")


def save_chart(chart: Chart, path: Path, intro_html: str = "") -> None:
    """Write ``path`` as the suffix says: .svg, .html/.htm (with ``intro_html``) or .png."""
    picture.save_picture(
        path,
        svg=lambda: chart_svg(chart),
        html=lambda: chart_html(chart, intro_html),
        png=lambda tmp: chart_png(chart, tmp),
    )
