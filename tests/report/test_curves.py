"""Tests for tformer_cli.report.curves: series from a stored log.jsonl, the time axis, the
terminal chart and the SVG/HTML files."""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from tformer_cli.errors import TformerError
from tformer_cli.report.curves import (
    SERIES,
    Chart,
    chart_html,
    chart_svg,
    chart_terminal,
    make_chart,
    nice_ticks,
    run_series,
    step_clock,
)

SVG = "{http://www.w3.org/2000/svg}"


def synthetic_log(last: int = 300, ss: bool = True) -> list[dict]:
    """A training record every 25 updates (with eps when ``ss``), a validation every 100
    (none has ``elapsed``, as the trainer writes them), a final one at ``last + 10``, then the
    stop and test records. Training takes 2 s per update."""
    records = []
    for step in range(25, last + 1, 25):
        record = {"step": step, "epoch": 1 + step // 150, "loss": 6 * math.exp(-step / 100) + 1,
                  "lr": 1e-3 * min(1.0, step / 100), "tgt_tokens_per_s": 1000.0 + step,
                  "elapsed": 2.0 * step}  # fmt: skip
        if ss:
            record["eps"] = 1 - step / 1000
        records.append(record)
        if step % 100 == 0:
            records.append(
                {"step": step, "epoch": 1 + step // 150, "valid_loss": 3 - step / 200,
                 "valid_ppl": math.exp(3 - step / 200), "valid_acc": 0.5, "valid_bleu": step / 10}
            )  # fmt: skip
    records.append({"step": last + 10, "epoch": 3, "valid_loss": 1.0, "valid_ppl": math.e,
                    "valid_acc": 0.9, "valid_bleu": 35.0})  # fmt: skip
    records.append({"step": last + 10, "epoch": 3, "stopped_by": "reached --max-steps 310",
                    "peak_memory_mib": 100.0})  # fmt: skip
    records.append({"step": last + 10, "epoch": 3, "test_bleu": 33.0})
    return records


def test_series_hold_every_logged_metric_in_order():
    series = run_series(synthetic_log())
    assert [s.spec.key for s in series] == [s.key for s in SERIES]
    by_key = {s.spec.key: s for s in series}
    assert [p.step for p in by_key["valid_bleu"].points] == [100, 200, 300, 310]
    assert [p.value for p in by_key["valid_bleu"].points] == [10.0, 20.0, 30.0, 35.0]
    assert len(by_key["loss"].points) == 12
    assert "eps" not in {s.spec.key for s in run_series(synthetic_log(ss=False))}


def test_validation_times_come_from_the_training_records_around_them():
    records = synthetic_log()
    clock = step_clock(records)
    assert clock(100) == 200.0  # a training record at the same step
    assert clock(110) == pytest.approx(220.0)  # between 100 and 125
    assert clock(10) == pytest.approx(20.0)  # between update 0 (0 s) and 25
    assert clock(310) == pytest.approx(620.0)  # after the last one, at its rate
    valid = next(s for s in run_series(records) if s.spec.key == "valid_bleu")
    assert [p.seconds for p in valid.points] == pytest.approx([200.0, 400.0, 600.0, 620.0])
    assert step_clock([{"step": 5, "valid_bleu": 1.0}])(5) is None  # no time at all


def test_the_time_axis_is_in_minutes_and_says_what_it_left_out():
    chart = make_chart([("a", run_series(synthetic_log()))], x="time")
    bleu = next(p for p in chart.panels if p.spec.key == "valid_bleu")
    assert bleu.lines[0].points[0] == pytest.approx((200.0 / 60, 10.0))
    assert chart.notes == ()
    untimed = [{"step": 100, "valid_bleu": 5.0}, {"step": 200, "valid_bleu": 7.0}]
    chart = make_chart([("a", run_series(untimed))], x="time")
    assert chart.panels == () and "2 points without a training time" in chart.notes[0]
    with pytest.raises(TformerError, match=r"--x .*: use updates or time"):
        make_chart([], x="epochs")


def test_the_terminal_chart_draws_every_series_within_the_width():
    chart = make_chart([("a", run_series(synthetic_log()))])
    console = Console(file=io.StringIO(), width=90, color_system=None)
    console.print(chart_terminal(chart, width=90))
    out = console.file.getvalue()
    for spec in SERIES:
        assert spec.title in out, spec.title
    assert any("\u2801" <= ch <= "\u28ff" for ch in out)  # braille dots
    assert max(len(line) for line in out.splitlines()) <= 90
    assert "last 35 at 310 · min 10 at 100 · max 35 at 310" in out  # valid BLEU
    assert "(log scale)" in out  # perplexity


def svg_series(svg: str) -> dict[str, list[str]]:
    """Each polyline's series -> the runs drawn in it."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    found: dict[str, list[str]] = {}
    for line in root.iter(f"{SVG}polyline"):
        found.setdefault(line.get("data-series"), []).append(line.get("data-run"))
        assert len(line.get("points").split()) >= 1
    return found


def test_the_svg_parses_and_has_every_series():
    chart = make_chart([("run <1>", run_series(synthetic_log()))], title="a & b")
    assert svg_series(chart_svg(chart)) == {spec.key: ["run <1>"] for spec in SERIES}
    html = chart_html(chart, "<table></table>")
    assert html.startswith("<!doctype html>") and "<svg" in html and "a &amp; b" in html


def test_several_runs_overlay_in_one_panel_per_series():
    chart = make_chart(
        [("a", run_series(synthetic_log())), ("b", run_series(synthetic_log(200, ss=False)))]
    )
    found = svg_series(chart_svg(chart))
    assert found["valid_bleu"] == ["a", "b"] and found["eps"] == ["a"]
    assert chart.labels == ["a", "b"]


def test_an_empty_chart_still_renders():
    chart = Chart("nothing", "updates", ())
    assert svg_series(chart_svg(chart)) == {}
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(chart_terminal(chart))
    assert "no curves" in console.file.getvalue()


def test_nice_ticks_are_round_and_inside_the_range():
    assert nice_ticks(0, 1, 5) == ([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], 0.2)
    ticks, step = nice_ticks(25, 910, 5)
    assert step == 200 and ticks == [200, 400, 600, 800]
