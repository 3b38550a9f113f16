"""docs/python.md runs: its Python blocks, in order, in one namespace, in a folder whose runs/
holds two tiny runs (``toy``, ``toy2``); a block after ``<!-- not run: ... -->`` is shown only."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "python.md"
BLOCK = re.compile(r"(<!-- not run:[^>]*-->\n)?```python\n(.*?)```", re.S)


def blocks() -> list[tuple[bool, str]]:
    """(runs, code) of each Python block of the page."""
    return [(not skip, code) for skip, code in BLOCK.findall(PAGE.read_text(encoding="utf-8"))]


def test_the_page_has_blocks_and_few_are_shown_only():
    found = blocks()
    assert len(found) >= 8 and sum(not runs for runs, _ in found) == 1


def traced_pieces(out: str) -> set[str]:
    """The candidate tokens printed by the trace block: ``step number parent [(token, status)]``."""
    lines = [re.fullmatch(r"\d+ \d+ (?:None|\d+) (\[.*\])", line) for line in out.splitlines()]
    found = [c for m in lines if m for c, _ in ast.literal_eval(m[1])]
    assert found, "no trace lines"
    return set(found)


def test_the_python_page_s_examples_run(tmp_path, make_run, monkeypatch, capsys):
    make_run(tmp_path / "runs" / "toy")
    make_run(tmp_path / "runs" / "toy2", seed=1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tformer_cli.device._process_wide", False)  # setup() undone after
    for var in ("TORCHINDUCTOR_CACHE_DIR", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    namespace: dict = {}
    for runs, code in blocks():
        if runs:
            exec(compile(code, str(PAGE), "exec"), namespace)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "0.6"  # the run's own beam_alpha
    vocabulary = namespace["trace"].tokenizer.get_vocab()
    assert traced_pieces(out) <= set(vocabulary)  # the trace's tokens as text, not ids
    shown = namespace["comparison"]  # compare() prints nothing, as evaluate(); print() shows it
    assert "tformer compare" not in out and "tformer compare  2 runs" in str(shown)
    assert "<table>" in shown._repr_html_()
    assert (tmp_path / "out.txt").read_text().count("\n") == 2
    assert namespace["comparison"].names == ["toy", "toy2"]


@pytest.mark.parametrize("name", ["load", "train", "runs", "compare", "setup", "TformerError"])
def test_the_page_shows_each_public_name(name):
    assert f"tformer.{name}" in PAGE.read_text(encoding="utf-8")
