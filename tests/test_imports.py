"""The package's imports point one way, down the order data flows:

    cli/serve -> api/engines -> learn -> training -> report -> interop -> decode -> checkpoint
        -> (model | data) -> config/device/files
        -> errors/console/__init__

Every import counts: at the top of a module, inside a function, and under ``TYPE_CHECKING``
(a lazy or type-only import is still a dependency). Read with ``ast``, nothing is imported.
The command line (``cli``) imports the jobs it runs where a command runs them: at the top of
its modules, only the package, ``api``, ``config``, ``engines``, ``errors`` and itself, so that
parsing (``tformer -h``, a usage error) loads no torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, checkout_first_env

PACKAGE = "tformer_cli"

# Layers from the top (0) down; a module may import its own layer or any layer below it.
LAYERS: list[tuple[str, ...]] = [
    ("cli", "__main__", "serve"),
    ("api", "engines"),
    ("learn",),  # the exercises check functions of every layer below
    ("training",),
    ("report",),
    ("interop",),  # the CTranslate2 engine returns decode's translations
    ("decode",),
    ("checkpoint",),
    ("model", "data"),  # siblings that know nothing of each other
    ("config", "device", "files", "compile"),
    ("errors", "console", "__init__"),
]


def module_name(path: Path, root: Path) -> str:
    """``tformer_cli/report/attention/view.py`` -> ``tformer_cli.report.attention.view``;
    a package's ``__init__.py`` is the package itself."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the folder holding ``tformer_cli/``)."""
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def imported_modules(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that the file imports anywhere in its body, resolved: relative
    imports against ``name``, and ``from pkg import mod`` to the module when it is one."""
    found = set()
    for target in imported_names(path, name, modules):
        while target and target not in modules:  # `import a.b.c` where c is an attribute
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def imported_names(path: Path, name: str, modules: dict[str, Path], top: bool = False) -> list[str]:
    """Every module of the package that the file names in an import (``top``: at its top
    level, run when it is imported), as written (relative ones resolved); ``from tformer_cli
    import device`` names the module ``tformer_cli.device``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body if top else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            found += subs or [base]
    return [f for f in found if f == PACKAGE or f.startswith(PACKAGE + ".")]


# The package itself re-exports the public API, imported on first use of a name (PEP 562
# ``__getattr__``): importing ``tformer_cli`` imports nothing, so these edges make no cycle at
# run time. They are checked apart (``test_the_package_re_exports_only_the_public_api``).
FACE = PACKAGE
FACE_TARGETS = {f"{PACKAGE}.api", f"{PACKAGE}.device", f"{PACKAGE}.errors"}


def import_graph(root: Path, with_face: bool = False) -> dict[str, set[str]]:
    modules = package_modules(root)
    graph = {name: imported_modules(path, name, modules) for name, path in modules.items()}
    if not with_face and FACE in graph:
        graph[FACE] = set()
    return graph


def layer_of(module: str) -> int:
    """The layer index of a module: its first component below the package."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} belongs to no layer: add its folder to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up the order, or across between ``model`` and ``data``."""
    bad = []
    for importer, targets in graph.items():
        for target in sorted(targets):
            a, b = layer_of(importer), layer_of(target)
            top_a, top_b = importer.split(".")[1:2], target.split(".")[1:2]
            if b < a or (a == b and LAYERS[a] == ("model", "data") and top_a != top_b):
                bad.append(f"{importer} -> {target}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_that_imports_it_back():
    assert cycles(import_graph(REPO)) == []


def test_every_import_points_down_the_data_flow():
    assert upward_imports(import_graph(REPO)) == []


def test_the_package_re_exports_only_the_public_api():
    assert import_graph(REPO, with_face=True)[FACE] <= FACE_TARGETS


def test_importing_the_package_imports_no_torch_and_sets_nothing():
    code = (
        "import os, sys; before = dict(os.environ); import tformer_cli as t; "
        "assert 'torch' not in sys.modules and dict(os.environ) == before; "
        "assert callable(t.load) and 'torch' in sys.modules; print('ok')"
    )
    env = checkout_first_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("engine", [["--engine=ctranslate2"], ["--engine", "ctranslate2"]])
def test_the_command_line_imports_ctranslate2_before_torch_when_asked(engine, tmp_path):
    """Imported after torch has run, CTranslate2's searches ran up to 2.5x slower: the entry
    point imports it first when the command names it (the CLI's modules load no torch)."""
    pytest.importorskip("ctranslate2")
    argv = ["tformer", "translate", *engine, "-m", str(tmp_path), "a dog"]  # a folder, no run
    code = (
        "import sys; from tformer_cli.cli import main; "
        f"assert 'torch' not in sys.modules; sys.argv = {argv!r}\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "names = list(sys.modules); print(names.index('ctranslate2') < names.index('torch'))"
    )
    env = checkout_first_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stdout + out.stderr[-2000:]


# What the command line's modules may import at their top: the package (its lazy public names),
# the API, the settings objects and errors, and itself.
FACE_ALLOWED = ("api", "config", "engines", "errors", "cli")


def face_violations(root: Path) -> list[str]:
    """``module imports target`` for each top-level import of the command line outside what it
    may load when parsing."""
    modules = package_modules(root)
    bad = []
    for name, path in modules.items():
        if not name.startswith(f"{PACKAGE}.cli"):
            continue
        for target in imported_names(path, name, modules, top=True):
            top = target.split(".")[1] if target.count(".") else ""
            if target != PACKAGE and top not in FACE_ALLOWED:
                bad.append(f"{name} imports {target}")
    return bad


def test_the_command_line_imports_its_jobs_where_it_runs_them():
    assert face_violations(REPO) == []


def test_every_module_belongs_to_a_layer():
    for module in import_graph(REPO):
        layer_of(module)


# ---------------------------------------------------------------------------- the checker itself
def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def fake_package(tmp_path: Path):
    def make(files: dict[str, str]) -> dict[str, set[str]]:
        base = {"__init__.py": "", "report/__init__.py": "", "decode/__init__.py": ""}
        return import_graph(write_package(tmp_path, {**base, **files}))

    return make


def test_a_lazy_import_inside_a_function_counts(fake_package):
    graph = fake_package(
        {
            "decode/search.py": "def f():\n    from tformer_cli.report import view\n",
            "report/view.py": "",
        }
    )
    assert graph["tformer_cli.decode.search"] == {"tformer_cli.report.view"}
    assert upward_imports(graph) == ["tformer_cli.decode.search -> tformer_cli.report.view"]


def test_a_type_checking_import_closes_a_circle(fake_package):
    graph = fake_package(
        {
            "report/a.py": "from tformer_cli.report.b import B\n",
            "report/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from tformer_cli.report.a import A\n"
            ),
        }
    )
    assert cycles(graph) == [["tformer_cli.report.a", "tformer_cli.report.b"]]


def test_relative_and_from_package_imports_resolve_to_modules(fake_package):
    graph = fake_package(
        {
            "report/a.py": "from . import b\nfrom ..decode import search\n"
            "import tformer_cli.files\n",
            "report/b.py": "",
            "decode/search.py": "",
            "files.py": "",
        }
    )
    assert graph["tformer_cli.report.a"] == {
        "tformer_cli.report.b",
        "tformer_cli.decode.search",
        "tformer_cli.files",
    }


def test_model_and_data_may_not_import_each_other(fake_package):
    graph = fake_package(
        {
            "model/__init__.py": "",
            "model/layers.py": "from tformer_cli.data.tokenizer import PAD_ID\n",
            "data/__init__.py": "",
            "data/tokenizer.py": "",
        }
    )
    assert upward_imports(graph) == ["tformer_cli.model.layers -> tformer_cli.data.tokenizer"]


def test_a_command_line_module_importing_a_job_at_its_top_is_named(tmp_path: Path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "api/__init__.py": "",
            "decode/__init__.py": "",
            "decode/streams.py": "",
            "device.py": "",
            "cli/__init__.py": "from tformer_cli import __version__\nfrom ..api import R\n",
            "cli/a.py": (
                "from tformer_cli.decode.streams import x\n"
                "def f():\n    from tformer_cli import device\n    from ..serve import s\n"
            ),
            "serve.py": "from tformer_cli.device import setup\n",
        },
    )
    assert face_violations(root) == ["tformer_cli.cli.a imports tformer_cli.decode.streams"]
