"""docs/learn.md holds together with the code: its tables of exercises and of mistakes are the
catalogue's own (rendered from it: ``python -m tests.learn.test_docs`` rewrites them), and its
Python blocks run as shown."""

from __future__ import annotations

import itertools
import re
import sys

from tests.conftest import REPO
from tformer_cli.learn import EXERCISES, MISTAKES

PAGE = REPO / "docs" / "learn.md"
HEADING = "## The exercises\n"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def rendered() -> str:
    """The page from ``HEADING`` on: a row per exercise, then a row per mistake."""
    lines = [HEADING, "In the order they build a Transformer and translate with it; the sections"
             " are the paper's where no other source is named.", "",
             "| | exercise | section | what it builds | tformer's function |",
             "|---|---|---|---|---|"]  # fmt: skip
    for i, e in enumerate(EXERCISES, 1):
        path, name = e.where.split(": ")
        link = f"[`{path.removeprefix('tformer_cli/')}: {name}`](../{path})"
        lines.append(f"| {i} | `{e.name}` | {cell(e.section)} | {cell(e.title)} | {link} |")
    lines += ["", "## The mistakes it recognises", "",
              f"{len(MISTAKES)} common mistakes, each recognised by the outputs of a known-wrong"
              " version of tformer's function (`tformer_cli/learn/mistakes.py`), and the hint"
              " the check prints with it:", "",
              "| exercise | mistake | hint |", "|---|---|---|"]  # fmt: skip
    lines += [f"| `{m.exercise}` | {cell(m.title)} | {cell(m.hint)} |" for m in MISTAKES]
    return "\n".join(lines) + "\n"


def test_the_tables_are_the_catalogue_s():
    text = PAGE.read_text(encoding="utf-8")
    assert HEADING in text
    assert text[text.index(HEADING) :] == rendered(), "run: python -m tests.learn.test_docs"


def test_the_page_s_python_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        exec(compile(code, str(PAGE), "exec"), namespace)
    out = capsys.readouterr().out
    assert "attention              passed" in out
    assert "causal_mask            failed: the causal mask off by one" in out


if __name__ == "__main__":  # rewrite the page's tables
    text = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(text[: text.index(HEADING)] + rendered(), encoding="utf-8")
    sys.exit(0)


def test_the_page_names_the_exercises_that_act_in_translation_and_in_training():
    from tformer_cli.learn.use import ACTING, TRAINED

    text = PAGE.read_text(encoding="utf-8")
    marks = ["Acting in translation:", "Acting in training:", "Acting in checking only:", HEADING]
    at = [text.index(mark) for mark in marks]
    acting, training, checking = (text[a:b] for a, b in itertools.pairwise(at))
    named = lambda part: [e.name for e in EXERCISES if f"`{e.name}`" in part]  # noqa: E731
    assert named(acting) == list(ACTING)
    assert named(training) == list(TRAINED)
    assert named(checking) == [e.name for e in EXERCISES if e.name not in (*ACTING, *TRAINED)]
