"""The public Python API: what ``import tformer_cli as tformer`` offers (see docs/python.md)."""

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
