"""docs/reading.md, the learner's path through the code: every file it names has the line count
it states, every name it says to read is defined there, the path stays an afternoon's read made
mostly of those names, a sentence goes in and comes out, and the plain definitions stand apart
from the fast code."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

READING = REPO / "docs" / "reading.md"
PATH_CEILING = 1500  # lines in all, from a sentence in to its translation out
NAMES_SHARE = 2 / 3  # of those lines, the least share inside the names to read

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


def definitions(path: str) -> dict[str, ast.AST]:
    """Top-level functions and classes of ``path``, and ``Class.method`` for their methods."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            found.update({f"{node.name}.{m.name}": m for m in node.body if hasattr(m, "name")})
    return found


def defined_names(path: str) -> set[str]:
    return set(definitions(path))


def named_lines(path: str, names: list[str]) -> set[int]:
    """The lines of ``path`` that the named definitions span, decorators included."""
    found = definitions(path)
    lines: set[int] = set()
    for name in names:
        node = found[name]
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        lines.update(range(first, node.end_lineno + 1))
    return lines


def imported_modules(path: str) -> set[str]:
    """The ``tformer_cli`` modules (or packages) ``path`` imports from, as written."""
    found = set()
    for node in ast.walk(ast.parse((REPO / path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("tformer_cli")}


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
    said = re.search(r"\*\*in all\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\*", read())
    assert said is not None and int(said.group(1)) == total
    assert total <= PATH_CEILING


def test_the_names_to_read_are_most_of_the_path():
    """The lines inside the names to read, as the page states them: at least ``NAMES_SHARE``
    of the path (the rest: imports, module docstrings, what a reader may skip)."""
    named = sum(len(named_lines(path, names)) for path, _, names in path_rows())
    total = sum(stated for _, stated, _ in path_rows())
    said = re.search(r"\*\*in all\*\* \| \*\*\d+\*\* \| \*\*(\d+)\*\*", read())
    assert said is not None and int(said.group(1)) == named
    assert named >= NAMES_SHARE * total, f"{named} of {total} lines are names to read"


def test_a_sentence_goes_in_and_comes_out():
    """The tokenizer's encode and decode are on the path, first, before the model."""
    path, _, names = path_rows()[0]
    assert path == "tformer_cli/data/tokenizer.py" and {"encode", "decode"} <= set(names)


def test_the_plain_definitions_import_nothing_of_the_fast_step():
    """Only the step itself dispatches to ``decode/fast/``; the reference searches import
    neither it nor the step."""
    for path, _, _ in path_rows():
        fast = {m for m in imported_modules(path) if m.startswith("tformer_cli.decode.fast")}
        assert path == "tformer_cli/decode/step.py" or not fast, f"{path} imports {fast}"
    reference = imported_modules("tformer_cli/decode/reference.py")
    assert not {m for m in reference if m.startswith("tformer_cli.decode.step")}


def test_the_path_names_the_paper_s_parts_in_order():
    """tokenizer, config, model, loss, schedule, loop, reference search, the cached step."""
    files = [path for path, _, _ in path_rows()]
    order = [
        "data/tokenizer.py",
        "config/model.py",
        "model/",
        "training/loss.py",
        "training/schedule.py",
        "training/trainer.py",
        "decode/reference.py",
        "decode/step.py",
    ]
    positions = [next(i for i, f in enumerate(files) if part in f) for part in order]
    assert positions == sorted(positions)


def read() -> str:
    return READING.read_text(encoding="utf-8")
