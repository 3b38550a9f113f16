"""docs/python.md runs: its Python blocks, in order, in one namespace, in a folder whose runs/
holds two tiny runs (``toy``, ``toy2``); a block after ``<!-- not run: ... -->`` is shown only."""

from __future__ import annotations

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
    assert (tmp_path / "out.txt").read_text().count("\n") == 2
    assert namespace["comparison"].names == ["toy", "toy2"]


@pytest.mark.parametrize("name", ["load", "train", "runs", "compare", "setup", "TformerError"])
def test_the_page_shows_each_public_name(name):
    assert f"tformer.{name}" in PAGE.read_text(encoding="utf-8")
