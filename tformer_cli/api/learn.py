"""``tformer.learn``: exercises that build a Transformer from the paper's equations, each checked
against the tformer function it writes again (docs/learn.md).

    tformer.learn.start("ex")                 # ex/exercises.py: a stub per exercise
    tformer.learn.check(attention)            # one function: a Result (a notebook shows it)
    tformer.learn.check("ex")                 # every exercise of a file or folder: a Report
    tformer.learn.solutions("ex")             # ex/solutions.py: tformer's own functions
    tformer.load("runs/toy", use="ex").translate("the dog sees the cat .")  # with yours
"""

from __future__ import annotations

from tformer_cli.learn import EXERCISES, MISTAKES, Report, Result, check, solutions, start
from tformer_cli.learn.use import ACTING, EAGER_NOTE, Use, prepare, swapped

__all__ = [
    "ACTING", "EAGER_NOTE", "EXERCISES", "MISTAKES", "Report", "Result", "Use", "check",
    "prepare", "solutions", "start", "swapped",
]  # fmt: skip
