"""docs/reading.md, the learner's path through the code: every file it names has the line count
it states, every name it says to read is defined there, and the path stays an afternoon's read."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

READING = REPO / "docs" / "reading.md"
PATH_CEILING = 2500  # lines in all, config to a translated sentence

ROW = re.compile(r"^\| \d+ \| \[([\w/.]+)\]\(\.\./(tformer_cli/[\w/.]+)\) \| (\d+) \| (.+?) \|")


def path_rows() -> list[tuple[str, int, list[str]]]:
    """(file, stated lines, names to read) for each numbered row of the table."""
    rows = []
    for line in READING.read_text(encoding="utf-8").splitlines():
        if m := ROW.match(line):
            shown, target, lines, names = m.groups()
            assert target == f"tformer_cli/{shown}", line[:60]
            rows.append((target, int(lines), re.findall(r"`([\w.]+)`", names)))
    return rows


def defined_names(path: str) -> set[str]:
    """Top-level functions and classes of ``path``, and ``Class.method`` for their methods."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{m.name}" for m in node.body if hasattr(m, "name"))
    return names


def test_each_file_of_the_path_has_the_lines_the_page_states():
    rows = path_rows()
    assert len(rows) >= 10
    for path, stated, _ in rows:
        actual = len((REPO / path).read_text(encoding="utf-8").splitlines())
        assert stated == actual, f"docs/reading.md says {path} has {stated} lines; it has {actual}"


def test_each_name_to_read_is_defined_in_its_file():
    for path, _, names in path_rows():
        assert names, path
        missing = set(names) - defined_names(path)
        assert not missing, f"{sorted(missing)} not defined in {path}"


def test_the_total_is_the_sum_and_an_afternoon_s_read():
    total = sum(stated for _, stated, _ in path_rows())
    said = re.search(r"\*\*in all\*\* \| \*\*(\d+)\*\*", READING.read_text(encoding="utf-8"))
    assert said is not None and int(said.group(1)) == total
    assert total <= PATH_CEILING


def test_the_path_names_the_paper_s_parts_in_order():
    """config, model, loss, schedule, loop, step, reference search, fast search."""
    files = [path for path, _, _ in path_rows()]
    order = [
        "config/model.py",
        "model/",
        "training/loss.py",
        "training/schedule.py",
        "training/trainer.py",
        "decode/step.py",
        "decode/reference.py",
        "decode/search.py",
    ]
    positions = [next(i for i, f in enumerate(files) if part in f) for part in order]
    assert positions == sorted(positions)
