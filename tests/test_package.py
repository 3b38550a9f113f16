"""Gates on the package as a whole, read with ``ast`` and text: functions and modules stay short
enough to read, and the code says what it does, not what it measured; and what
``import tformer_cli`` offers a notebook's tab completion."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "tformer_cli"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_over_80_lines(path: Path):
    """Lines from ``def`` (decorators excluded) to the last line of the body, signature included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [
        f"{f.name} ({f.end_lineno - f.lineno + 1} lines, line {f.lineno})"
        for f in functions(tree)
        if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_600_lines(path: Path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{lines} lines"


# Machine names and measured figures belong to the docs and the benchmarks' output.
MACHINE_WORDS = re.compile(
    r"\b(measured|EPYC|Xeon|Zen ?\d|Ryzen|Sapphire Rapids|Graviton|H100|H200|A100|V100|RTX ?\d+)\b",
    re.IGNORECASE,
)
MISSING_FILES = re.compile(r"DESIGN\.md|EXPOSURE_BIAS\.md|\.\./shared")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_code_names_no_machine_and_no_measurement(path: Path):
    found = [
        f"line {i}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if MACHINE_WORDS.search(line)
    ]
    assert not found, "\n".join(found)


# A figure with the unit of a measurement: a speed-up (1.7x, 2-3x), a time (12 ms, 40 µs), a
# rate (859 tok/s) or a percentage. Figures that measure nothing are allowed by name.
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?"
    r"(?:x|×|\s*(?:ms|µs|us|tok/s|tokens/s|sentences/s|%))(?![\w/])"
)
NOT_MEASURED = re.compile(r"\d+% interval|>= \d+\.\d+x")  # a confidence level; a version series


def comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each comment and of each line of each docstring of ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                yield from ((first + i, line) for i, line in enumerate(doc.splitlines()))


def measured_figures(source: str) -> list[str]:
    return [
        f"line {n}: {text.strip()}"
        for n, text in comments_and_docstrings(source)
        if FIGURE.search(NOT_MEASURED.sub("", text))
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_comments_and_docstrings_quote_no_measured_figure(path: Path):
    found = measured_figures(path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", [*MODULES, REPO / "README.md"], ids=lambda p: p.name)
def test_code_cites_no_file_the_repository_lacks(path: Path):
    found = [
        f"line {i}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if MISSING_FILES.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_gates_catch_what_they_guard(tmp_path: Path):
    """The checks above find a long function and a machine figure when there is one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def long():\n{body}\n")
    assert functions(tree)[0].end_lineno > MAX_FUNCTION_LINES
    assert MACHINE_WORDS.search("# 1.2 ms, measured on an AMD EPYC")
    assert not MACHINE_WORDS.search("@dataclass(frozen=True)")
    for figure in ("1.7x", "2-3x", "12 ms", "859 tok/s", "10-15%", "about 10% faster"):
        assert measured_figures(f'"""Fast."""\n# the fused path: {figure}\n'), figure
        assert measured_figures(f'def f():\n    """It was {figure} here."""\n'), figure
    for fine in ("# 3 x (B, h, T, d_k)", "# its 95% interval", "# 1 GiB", "x = 2  # 5x5 grid"):
        assert not measured_figures(fine + "\n"), fine
    assert not measured_figures('s = "1.7x"  # a string, not a comment\n')


def test_dir_lists_the_public_api_that_loads_on_first_use():
    import tformer_cli as tformer

    assert dir(tformer) == sorted(tformer.__all__)
    assert {"load", "train", "runs", "compare", "setup", "TformerError"} <= set(dir(tformer))
    assert all(getattr(tformer, name) is not None for name in dir(tformer))


# One name per concept: a top-level name (function, class, module constant) defined in two or
# more modules is a copy to merge or a name that means two things. The exceptions, each with
# its reason; "owned elsewhere" marks twins left to those who keep that folder.
SHARED_NAMES = {
    "S": "a type variable (of a settings class), local to the module that declares it",
    "main": "an entry point's conventional name (python -m, the console script)",
    "F": "a type variable (of a decorated function), local to the module that declares it",
}
LEARN = "learn"  # the exercises re-define the package's functions on purpose, to be checked


def top_level_names(path: Path) -> set[str]:
    """The functions, classes and assigned names at the top of a module."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("__")}


def names_defined_twice(modules: list[Path], root: Path) -> dict[str, list[str]]:
    """Each name defined at the top of two or more modules outside ``learn/`` (a name the
    exercises define is counted once for all of them), with those modules."""
    where: dict[str, list[str]] = {}
    for path in modules:
        module = path.relative_to(root).as_posix()
        for name in top_level_names(path):
            where.setdefault(name, []).append(module)
    return {
        name: modules
        for name, modules in where.items()
        if len([m for m in modules if not m.startswith(f"{LEARN}/")]) > 1
    }


def test_one_name_per_concept():
    twice = names_defined_twice(MODULES, PACKAGE)
    new = {name: modules for name, modules in twice.items() if name not in SHARED_NAMES}
    assert not new, "defined in two or more modules (rename or merge): " + "; ".join(
        f"{name}: {', '.join(modules)}" for name, modules in sorted(new.items())
    )
    stale = sorted(set(SHARED_NAMES) - set(twice))
    assert not stale, f"no longer defined twice, drop from SHARED_NAMES: {', '.join(stale)}"


def test_the_name_gate_sees_a_twin(tmp_path: Path):
    for name, text in (("a.py", "X = 1\ndef f(): ...\n"), ("b.py", "class f: ...\n")):
        (tmp_path / name).write_text(text)
    (tmp_path / LEARN).mkdir()
    (tmp_path / LEARN / "c.py").write_text("X = 2\n")
    found = names_defined_twice(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert found == {"f": ["a.py", "b.py"]}
