"""Tests for tformer_cli.learn.stubs: the stubs are the solutions' own signatures, each name they
read is imported, the solutions are tformer's source, and a learner's file is never replaced."""

from __future__ import annotations

import inspect
import textwrap
import typing

import pytest

from tformer_cli.errors import TformerError
from tformer_cli.learn import solutions, start
from tformer_cli.learn.checker import load
from tformer_cli.learn.exercises import EXERCISES


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return load(start(tmp_path_factory.mktemp("stubs")))


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_each_stub_has_its_solution_s_signature_and_the_task_as_docstring(stubs, exercise):
    stub = stubs[exercise.name]
    assert inspect.signature(stub) == inspect.signature(exercise.solution)
    typing.get_type_hints(stub)  # every name of the signature is imported
    assert inspect.cleandoc(exercise.task) in inspect.getdoc(stub)
    assert exercise.where in inspect.getdoc(stub)
    assert all(name in stubs for name in exercise.helpers)
    with pytest.raises(NotImplementedError):
        stub(*exercise.cases[0].args())


def test_the_solutions_are_tformer_s_source(solutions_file):
    learner = load(solutions_file)
    for exercise in EXERCISES:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(exercise.solution)))
        assert source in solutions_file.read_text(encoding="utf-8")
        assert learner[exercise.name] is not exercise.solution  # a copy, run as the learner's


def test_a_file_already_there_is_kept(tmp_path):
    (tmp_path / "exercises.py").write_text("# my work\n", encoding="utf-8")
    with pytest.raises(TformerError, match="exists and is kept as it is"):
        start(tmp_path)
    assert (tmp_path / "exercises.py").read_text(encoding="utf-8") == "# my work\n"
    solutions(tmp_path)
    with pytest.raises(TformerError, match="exists"):
        solutions(tmp_path)
