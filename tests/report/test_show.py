"""Tests for tformer_cli.report.show: `tformer show` prints a run's settings and curves, and
saves them."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.report.test_curves import svg_series, synthetic_log
from tformer_cli.errors import TformerError
from tformer_cli.report.curves import SERIES
from tformer_cli.report.show import show_run


@pytest.fixture
def logged_run(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "runs" / "curvy")
    text = "".join(json.dumps(r) + "\n" for r in synthetic_log())
    (run_dir / "log.jsonl").write_text(text, encoding="utf-8")
    return run_dir


def show(run_dir: Path, **options) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    err = Console(file=io.StringIO())
    show_run(run_dir, console, err=err, **options)
    return console.file.getvalue()


def test_show_prints_the_settings_then_the_curves_and_saves_them(logged_run, tmp_path):
    out = show(logged_run, save=tmp_path / "c.svg", x="time")
    for text in ("runs/curvy", "finished: reached --max-steps 310", "2+2 layers, d 32",
                 "best valid BLEU 35.00 at step 310", "greedy 33.00 (end of training)",
                 "valid BLEU (greedy)", "minutes"):  # fmt: skip
        assert text in out, text
    assert set(svg_series((tmp_path / "c.svg").read_text())) == {s.key for s in SERIES}
    show(logged_run, save=tmp_path / "c.html")
    html = (tmp_path / "c.html").read_text()
    assert "reached --max-steps 310" in html and "<svg" in html


def test_show_by_name_under_runs(logged_run):
    assert "valid BLEU" in show(Path("curvy"), runs_dir=logged_run.parent)


def test_show_fails_in_one_line_on_a_broken_run_or_a_bad_file_name(logged_run, tmp_path):
    with pytest.raises(TformerError, match=r"use a \.svg, \.html or \.png"):
        show(logged_run, save=tmp_path / "c.pdf")
    with pytest.raises(TformerError, match="--x epochs"):
        show(logged_run, x="epochs")
    (logged_run / "log.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(TformerError, match="line 2 is not a JSON object"):
        show(logged_run)
    (logged_run / "config.json").write_text("{")
    with pytest.raises(TformerError, match=r"config\.json is corrupt"):
        show(logged_run)
    with pytest.raises(TformerError, match="does not exist"):
        show(tmp_path / "missing")


def test_png_without_matplotlib_names_the_plot_extra(logged_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(TformerError, match=r"pip install -e '\.\[plot\]'"):
        show(logged_run, save=tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()
