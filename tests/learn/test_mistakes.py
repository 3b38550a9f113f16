"""Tests for tformer_cli.learn.mistakes: every named mistake, fed to the checker in a learner's
module that is otherwise right, fails exactly its own exercise, and is recognised by its hint."""

from __future__ import annotations

import pytest

from tformer_cli.learn.checker import check_function
from tformer_cli.learn.exercises import BY_NAME, EXERCISES
from tformer_cli.learn.mistakes import MISTAKES


def test_the_catalogue_names_at_least_twenty_mistakes_of_real_exercises():
    assert len(MISTAKES) >= 20
    assert len({m.name for m in MISTAKES}) == len(MISTAKES)
    assert len({m.hint for m in MISTAKES}) == len(MISTAKES)
    assert {m.exercise for m in MISTAKES} <= set(BY_NAME)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_each_mistake_fails_its_exercise_alone_with_its_hint(learner, mistake):
    """The mutant stands in the learner's module, where the other exercises' functions call it
    (the solution's multi-head attention calls the module's attention): they still pass, as the
    check runs them with tformer's own lower pieces."""
    learner[mistake.exercise] = mistake.fn
    results = {e.name: check_function(e, learner[e.name]) for e in EXERCISES}
    failed = [name for name, r in results.items() if not r.passed]
    assert failed == [mistake.exercise]
    result = results[mistake.exercise]
    assert (result.mistake, result.hint) == (mistake.title, mistake.hint), result
    assert result.case and result.inputs and result.problem
