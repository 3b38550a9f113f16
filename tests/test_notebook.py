"""notebooks/tour.ipynb runs on a real Jupyter kernel, its runs in a temporary folder, and each
tagged cell still shows what its text says (``metadata.expect``: patterns its output must
match). ``python -m tests.test_notebook NOTEBOOK`` re-executes a notebook in place
(``make notebook``)."""

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
