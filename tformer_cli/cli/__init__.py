"""The `tformer` command line (``app``): each command lives in the module of its group, which
registers it on import. The work happens elsewhere."""

from __future__ import annotations

import contextlib
import inspect
import sys

import typer

from tformer_cli.cli import decode, evaluate, learn, tools, train
from tformer_cli.cli.app import PROCESS, app, err, out, tokenizer_app

__all__ = [
    "app", "decode", "err", "evaluate", "learn", "main", "out", "tools", "train",
]  # fmt: skip


def reflow_help(*apps: typer.Typer) -> None:
    """Join each help paragraph's lines, so the terminal wraps them (Typer keeps a docstring's
    line breaks, which made ragged lines in an 80-column terminal)."""
    for typer_app in apps:
        for info in typer_app.registered_commands:
            doc = inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n"))


reflow_help(app, tokenizer_app, learn.learn_app)


def main() -> None:
    """Console-script entry point: the app, as the ``tformer`` process (``PROCESS``: each
    command applies the process-wide settings, ``device.setup``, once its runs are checked).

    Where the command names CTranslate2 (``--engine ctranslate2``), it is imported before torch:
    imported after torch has run, its searches ran slower (docs/interop.md)."""
    if any(arg.endswith("ctranslate2") for arg in sys.argv[1:]):  # also --engine=ctranslate2
        with contextlib.suppress(ImportError):
            import ctranslate2  # noqa: F401
    app(prog_name="tformer", obj=PROCESS)
