"""Learn by building: exercises that write tformer's own functions again from the paper's
equations, in its order, each checked against the function it mirrors (docs/learn.md).

``start(folder)`` writes the stubs, ``solutions(folder)`` tformer's answers, ``check(fn,
"attention")`` or ``check(path)`` runs the checks and returns a ``Result`` or a ``Report``.
"""

from tformer_cli.learn.cases import Exercise
from tformer_cli.learn.checker import Report, Result, check
from tformer_cli.learn.exercises import EXERCISES
from tformer_cli.learn.mistakes import MISTAKES, Mistake
from tformer_cli.learn.stubs import solutions, start

__all__ = [
    "EXERCISES", "MISTAKES", "Exercise", "Mistake", "Report", "Result", "check", "solutions",
    "start",
]  # fmt: skip
