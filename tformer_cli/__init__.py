"""tformer: a small, fast, readable Transformer toolkit for neural machine translation.

``import tformer_cli as tformer``, then ``tformer.load``, ``tformer.train``, ``tformer.runs``,
``tformer.compare`` (docs/python.md), ``tformer.learn`` (docs/learn.md). The API loads on first
use: importing the package imports neither torch nor anything else, and changes no process-wide
setting; ``tformer.setup()`` applies the ones the command line runs with.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tformer_cli.api import (
        Attention,
        Curves,
        Evaluated,
        Hyp,
        Run,
        Score,
        TraceView,
        Translated,
        compare,
        load,
        runs,
        train,
    )
    from tformer_cli.device import setup
    from tformer_cli.errors import TformerError

# each public name imported on first use, by the module that holds it
LAZY = {
    **dict.fromkeys(
        ("Attention", "Curves", "Evaluated", "Hyp", "Run", "Score", "TraceView", "Translated",
         "compare", "learn", "load", "runs", "train"),
        "tformer_cli.api",
    ),
    "setup": "tformer_cli.device",
    "TformerError": "tformer_cli.errors",
}  # fmt: skip

__all__ = [
    "Attention", "Curves", "Evaluated", "Hyp", "Run", "Score", "TformerError", "TraceView",
    "Translated", "__version__", "compare", "learn", "load", "runs", "setup", "train",
]  # fmt: skip


def __dir__() -> list[str]:
    """The public names, the lazy ones included (a notebook's tab completion)."""
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    """The public API's names, imported on first use (PEP 562)."""
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'tformer_cli' has no attribute {name!r}")
