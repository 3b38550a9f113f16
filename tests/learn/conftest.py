"""Shared by the tests of tformer learn: the solutions file, written and loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tformer_cli.learn import solutions
from tformer_cli.learn.checker import load


@pytest.fixture(scope="session")
def solutions_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return solutions(tmp_path_factory.mktemp("learn"))


@pytest.fixture(scope="session")
def no_scale_file(solutions_file: Path) -> Path:
    """The solutions with the no-scale mistake in ``attention`` (no 1/sqrt(d_k))."""
    mistaken = solutions_file.parent / "no_scale.py"
    source = solutions_file.read_text(encoding="utf-8")
    mistaken.write_text(source.replace("/ math.sqrt(q.size(-1))", ""), encoding="utf-8")
    return mistaken


@pytest.fixture
def learner(solutions_file: Path) -> dict[str, Any]:
    """A learner's module that has written every exercise as tformer does (a fresh copy of
    solutions.py, loaded), to break one piece of at a time."""
    torch.set_num_threads(1)
    return load(solutions_file)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained briefly on the toy corpus (the interop tests' recipe): what ``--use``
    translates with."""
    from tests.interop.conftest import train_toy_run

    torch.set_num_threads(1)
    return train_toy_run(tmp_path_factory.mktemp("toy") / "run", steps=60)
