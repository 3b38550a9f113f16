"""notebooks/tour.ipynb runs on a real Jupyter kernel, its runs in a temporary folder, and each
tagged cell still shows what its text says (``metadata.expect``: patterns its output must
match). notebooks/build.ipynb, committed with its exercises blank, runs blank (every check
says "not written yet") and with tformer's solutions written in (every check passes, and the
run translates with them as with its own functions). ``python -m tests.test_notebook NOTEBOOK``
re-executes a notebook in place (``make notebook``)."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, checkout_first_env

nbformat = pytest.importorskip("nbformat") if __name__ != "__main__" else __import__("nbformat")

TOUR = REPO / "notebooks" / "tour.ipynb"
BUILD = REPO / "notebooks" / "build.ipynb"


def execute(nb: Any, folder: Path, timeout: int = 1800) -> Any:
    """Run every cell of ``nb`` in order on a fresh python3 kernel started in ``folder`` (where
    its ``runs/`` go), this checkout first on its path; returns ``nb``."""
    from nbclient import NotebookClient

    env = checkout_first_env()
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.km = client.create_kernel_manager()
    client.start_new_kernel(env=env)
    client.start_new_kernel_client()
    try:
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    finally:
        client._cleanup_kernel()
    return nb


def shown(cell: Any) -> str:
    """Everything a code cell's outputs show: streams, plain text and HTML."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts += [data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(parts)


def unmet(nb: Any) -> list[str]:
    """``cell N: PATTERN`` for each expected pattern a tagged cell's output no longer shows."""
    return [
        f"cell {i}: {pattern}"
        for i, cell in enumerate(nb.cells)
        for pattern in cell.get("metadata", {}).get("expect", [])
        if not re.search(pattern, shown(cell), re.M)
    ]


def test_unmet_names_a_pattern_the_output_does_not_show():
    cell = nbformat.v4.new_code_cell("1")
    cell.metadata["expect"] = ["^2$", "1"]
    cell.outputs = [
        nbformat.v4.new_output("execute_result", {"text/plain": "1"}, execution_count=1)
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert unmet(nb) == ["cell 0: ^2$"]


def test_the_committed_tour_has_its_outputs_and_checks():
    nb = nbformat.read(TOUR, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if c.metadata.get("expect")]
    assert len(tagged) >= 8 and all(c.outputs for c in tagged), "make notebook: commit outputs"
    assert unmet(nb) == []


@pytest.mark.slow
def test_the_tour_runs_and_shows_what_it_says(tmp_path, monkeypatch):
    pytest.importorskip("nbclient")
    monkeypatch.setenv("TFORMER_THREADS", "1")  # the kernel's tformer.setup(): one thread
    nb = execute(nbformat.read(TOUR, as_version=4), tmp_path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    assert unmet(nb) == []
    assert len(list((tmp_path / "runs").glob("toy-*/model.pt"))) == 1


# ---------------------------------------------------------------------------- build.ipynb
def solved(nb: Any) -> Any:
    """``nb`` with each exercise's cell holding tformer's solution and the imports it reads."""
    from tformer_cli.learn.exercises import BY_NAME
    from tformer_cli.learn.stubs import body_names, function_node, imports

    for cell in nb.cells:
        if (name := cell.metadata.get("exercise")) is not None:
            fn = BY_NAME[name].solution
            source, node = function_node(fn)
            cell.source = f"{imports({fn: body_names(node)})}\n\n\n{source}"
    return nb


def checks(nb: Any) -> dict[str, str]:
    """What each exercise's check cell shows, by exercise."""
    return {c.metadata["check"]: shown(c) for c in nb.cells if "check" in c.metadata}


def translated(nb: Any) -> str:
    return next(shown(c) for c in nb.cells if c.metadata.get("translate"))


def test_the_build_notebook_is_committed_blank_with_a_check_per_exercise():
    from tformer_cli.learn.exercises import EXERCISES

    nb = nbformat.read(BUILD, as_version=4)
    written = [c for c in nb.cells if "exercise" in c.metadata]
    assert [c.metadata["exercise"] for c in written] == [e.name for e in EXERCISES]
    assert list(checks(nb)) == [e.name for e in EXERCISES]
    assert all(c.source.endswith("raise NotImplementedError") for c in written)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.fixture(scope="module")
def build_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.interop.conftest import train_toy_run

    return train_toy_run(tmp_path_factory.mktemp("build") / "run", steps=60)


def test_the_build_notebook_runs_blank_and_with_the_solutions(build_run, tmp_path, monkeypatch):
    pytest.importorskip("nbclient")
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.setenv("TFORMER_BUILD_RUN", str(build_run))
    runs = []
    for nb in (nbformat.read(BUILD, as_version=4), solved(nbformat.read(BUILD, as_version=4))):
        execute(nb, tmp_path, timeout=120)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert errors == []
        runs.append(nb)
    blank, filled = runs
    assert all("not written yet" in shown for shown in checks(blank).values()), checks(blank)
    assert all("passed" in shown for shown in checks(filled).values()), checks(filled)
    assert "using none of your functions" in translated(blank)
    assert "using your sinusoidal_positions, attention" in translated(filled)
    # the same translations, computed by the learner's functions and by tformer's
    assert translated(filled).splitlines()[1:] == translated(blank).splitlines()[1:]
    assert "'" in translated(blank).splitlines()[-1]  # a list of translations, shown


def main(path: str) -> None:
    """Re-execute the notebook at ``path`` in place, its runs in a temporary folder."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as folder:
        execute(nb, Path(folder))
    if problems := unmet(nb):
        sys.exit("the outputs no longer show: " + "; ".join(problems))
    nbformat.write(nb, path)


if __name__ == "__main__":
    main(sys.argv[1])
