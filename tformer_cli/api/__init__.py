"""The public Python API: what ``import tformer_cli as tformer`` offers (see docs/python.md).

The names load on first use (PEP 562): importing the package loads no torch and no model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tformer_cli.api.display import (
        Attention,
        Curves,
        Evaluated,
        Hyp,
        Score,
        TraceView,
        Translated,
    )
    from tformer_cli.api.run import Run, load
    from tformer_cli.api.training import compare, runs, train

# each public name -> the module that defines it
HOMES = {
    **dict.fromkeys(
        ("Attention", "Curves", "Evaluated", "Hyp", "Score", "TraceView", "Translated"),
        "display",
    ),
    **dict.fromkeys(("Run", "load"), "run"),
    **dict.fromkeys(("compare", "runs", "train"), "training"),
}

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


def __getattr__(name: str) -> Any:
    """The public API's names, imported on first use (PEP 562); ``learn`` is a module of them."""
    if name in HOMES:
        return getattr(importlib.import_module(f"tformer_cli.api.{HOMES[name]}"), name)
    if name == "learn":
        return importlib.import_module("tformer_cli.api.learn")
    raise AttributeError(f"module 'tformer_cli.api' has no attribute {name!r}")
