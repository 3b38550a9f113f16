"""The two files ``tformer learn`` writes: ``exercises.py``, a stub for each exercise, and
``solutions.py``, tformer's own functions. Both are made from the solutions themselves (each
stub is its solution's signature, each solution its source), so neither drifts from the code.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.learn.cases import Exercise
from tformer_cli.learn.exercises import BY_NAME, EXERCISES

EXERCISES_DOC = '''"""Build a Transformer one function at a time: tformer's exercises
(docs/learn.md).

Write each function below in order, in place of its `raise NotImplementedError`, and check:

    tformer learn check {folder}                    every exercise
    tformer learn check {folder} --only attention   one of them

Each runs beside tformer's own function on random, edge-case and masked inputs, with tformer's
own versions of the other exercises' functions where it calls them. Answers: tformer learn
solutions {folder}.
"""'''
SOLUTIONS_DOC = '''"""tformer's own functions for the exercises of `tformer learn`
(docs/learn.md), copied from its source in the order of the exercises: `tformer learn check
{folder}/solutions.py` passes every one.
"""'''


def function_node(fn: Callable[..., Any]) -> tuple[str, ast.FunctionDef]:
    """The source of ``fn`` (dedented) and its parsed definition."""
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return source, node


def stub(exercise: Exercise) -> str:
    """The solution's decorators and signature, the exercise's task as docstring, no body."""
    source, node = function_node(exercise.solution)
    head = source.splitlines()[: node.body[0].lineno - 1]  # decorators and the def line(s)
    doc = f'    """{exercise.task}\n\n    Checked against tformer\'s {exercise.where}.\n    """'
    return "\n".join([*head, doc, "    raise NotImplementedError", ""])


def names_in(nodes: Iterable[ast.AST | None]) -> set[str]:
    """The names that ``nodes`` (and what they hold) read."""
    return {
        n.id
        for node in nodes
        if node is not None
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def signature_names(node: ast.FunctionDef) -> set[str]:
    """The names of a definition's decorators and annotations."""
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return names_in([*node.decorator_list, node.returns, *(a.annotation for a in args)])


def body_names(node: ast.FunctionDef) -> set[str]:
    """The names a definition reads from outside itself: all it reads, less what it binds."""
    bound = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    bound |= {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    return names_in([node]) - bound


def imported_names(module: ModuleType) -> dict[str, str]:
    """The import line of each name a module's top level imports, as it imports it."""
    lines = {}
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name
                lines[name] = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                as_ = f" as {a.asname}" if a.asname else ""
                lines[a.asname or a.name] = f"from {node.module} import {a.name}{as_}"
    return lines


def imports(wanted: dict[Callable[..., Any], set[str]]) -> str:
    """The import lines of the names each solution ``wanted`` reads from its module, imported
    as that module imports them (or from it, where it defines them); the exercises' own names
    are left out (the file defines them), and builtins."""
    lines = set()
    for fn, names in wanted.items():
        module = sys.modules[fn.__module__]
        imported = imported_names(module)
        for name in sorted(names - set(BY_NAME)):
            if name in imported:
                lines.add(imported[name])
            elif hasattr(module, name):
                lines.add(f"from {fn.__module__} import {name}")
    return "\n\n".join(
        import_block(lines, group) for group in range(3) if import_block(lines, group)
    )


def group_of(line: str) -> int:
    """isort's sections: the standard library (0), other packages (1), tformer (2)."""
    top = line.split()[1].split(".")[0]
    return 0 if top in sys.stdlib_module_names else 2 if top == "tformer_cli" else 1


def import_block(lines: set[str], group: int) -> str:
    """The import lines of one section, ``import`` ones first, names of a module together."""
    mine = [line for line in lines if group_of(line) == group]
    plain = sorted(line for line in mine if line.startswith("import "))
    grouped: dict[str, list[str]] = {}
    for line in sorted(set(mine) - set(plain)):
        module, _, name = line[len("from ") :].partition(" import ")
        grouped.setdefault(module, []).append(name)
    by_type = {m: sorted(names, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
               for m, names in grouped.items()}  # fmt: skip
    return "\n".join([*plain, *(wrapped(m, names) for m, names in by_type.items())])


def wrapped(module: str, names: list[str]) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= 100:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def exercises_text(folder: str) -> str:
    """``exercises.py``: every exercise's stub, in order."""
    wanted = {
        inspect.unwrap(e.solution): signature_names(function_node(e.solution)[1]) | set(e.helpers)
        for e in EXERCISES
    }
    stubs = "\n\n".join(stub(e) for e in EXERCISES)
    header = EXERCISES_DOC.format(folder=folder)
    return f"{header}\n\nfrom __future__ import annotations\n\n{imports(wanted)}\n\n\n{stubs}"


def solutions_text(folder: str) -> str:
    """``solutions.py``: tformer's own source of every solution, in order."""
    nodes = {inspect.unwrap(e.solution): function_node(e.solution) for e in EXERCISES}
    wanted = {fn: body_names(node) for fn, (_, node) in nodes.items()}
    sources = "\n\n".join(source for source, _ in nodes.values())
    header = SOLUTIONS_DOC.format(folder=folder)
    return f"{header}\n\nfrom __future__ import annotations\n\n{imports(wanted)}\n\n\n{sources}"


def write_new(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, which must not exist: a learner's work is never replaced."""
    if path.exists():
        raise TformerError(f"{path} exists and is kept as it is: remove it, or give another folder")
    atomic_write_text(path, text, durable=False)
    return path


def start(folder: str | Path) -> Path:
    """Write ``folder/exercises.py``, the stubs to fill in; returns its path."""
    return write_new(Path(folder) / "exercises.py", exercises_text(str(folder)))


def solutions(folder: str | Path) -> Path:
    """Write ``folder/solutions.py``, tformer's own functions; returns its path."""
    return write_new(Path(folder) / "solutions.py", solutions_text(str(folder)))
