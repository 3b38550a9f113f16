"""The public Python API: what ``import tformer_cli as tformer`` offers (see docs/python.md),
which the package imports on first use of a name (PEP 562): ``import tformer_cli`` loads no
torch and no model."""

from __future__ import annotations

from tformer_cli.api import learn
from tformer_cli.api.display import Attention, Curves, Evaluated, Hyp, Score, TraceView, Translated
from tformer_cli.api.run import Run, load
from tformer_cli.api.training import compare, runs, train

__all__ = [
    "Attention",
    "Curves",
    "Evaluated",
    "Hyp",
    "Run",
    "Score",
    "TraceView",
    "Translated",
    "compare",
    "learn",
    "load",
    "runs",
    "train",
]
