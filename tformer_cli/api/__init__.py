"""The public Python API: what ``import tformer_cli as tformer`` offers (see docs/python.md)."""

import sys
import types
from typing import Any

from tformer_cli.api.display import (
    Attention,
    Curves,
    Evaluation,
    Hyp,
    Score,
    TraceView,
    Translation,
)
from tformer_cli.api.run import Run, load
from tformer_cli.api.training import compare, runs, train


class _CallableTrain(types.ModuleType):
    """The ``tformer_cli.train`` subpackage, callable as ``train()``: once imported, a
    subpackage's module is the package's attribute of that name, so ``tformer.train(...)``
    reaches the module; calling it trains."""

    def __call__(self, *args: Any, **kwargs: Any) -> Run:
        return train(*args, **kwargs)


sys.modules["tformer_cli.train"].__class__ = _CallableTrain

__all__ = [
    "Attention",
    "Curves",
    "Evaluation",
    "Hyp",
    "Run",
    "Score",
    "TraceView",
    "Translation",
    "compare",
    "load",
    "runs",
    "train",
]
