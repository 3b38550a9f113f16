"""`tformer learn start`, `solutions` and `check`: build a Transformer from the paper's
equations, one function at a time, checked against tformer's own (docs/learn.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.cli.app import HELP, Command, Group, app, friendly_errors, out

learn_app = typer.Typer(
    help="Build a Transformer yourself: exercises from the paper's equations, each checked"
    " against tformer's own function.",
    no_args_is_help=True,
    context_settings=HELP,
    cls=Group,
)
app.add_typer(learn_app, name="learn")

Folder = Annotated[Path, typer.Argument(help="Folder to write into (made if missing).")]


@learn_app.command("start", cls=Command)
@friendly_errors
def start_command(folder: Folder) -> None:
    """Write FOLDER/exercises.py: a function to write for each piece of the Transformer, in the
    paper's order, each with its signature, shapes and equation. An existing file is kept."""
    from tformer_cli.api.learn import EXERCISES, start

    path = start(folder)
    out.print(f"wrote {path}: {len(EXERCISES)} exercises to write", markup=False)
    out.print(f"check them with: tformer learn check {folder}", markup=False)


@learn_app.command("solutions", cls=Command)
@friendly_errors
def solutions_command(folder: Folder) -> None:
    """Write FOLDER/solutions.py: tformer's own function for each exercise, copied from its
    source, for teachers and for after trying. An existing file is kept."""
    from tformer_cli.api.learn import solutions

    path = solutions(folder)
    out.print(f"wrote {path}: tformer learn check {path} passes every exercise", markup=False)


@learn_app.command("check", cls=Command)
@friendly_errors
def check_command(
    path: Annotated[Path, typer.Argument(help="exercises.py, solutions.py, or their folder.")],
    only: Annotated[
        str | None, typer.Option(help="Check this exercise alone (its function's name).")
    ] = None,
) -> None:
    """Run each function of PATH beside tformer's own, on random, edge-case and masked inputs,
    and print a row per exercise: passed, not written yet, or failed with its first mismatch
    and a hint. Exits 1 until every exercise checked passes."""
    from tformer_cli.api.learn import EXERCISES, check

    names = [e.name for e in EXERCISES]  # the catalogue loads torch: read here, not at import
    if only is not None and only not in names:
        raise typer.BadParameter(
            f"{only!r} is not one of {', '.join(names)}", param_hint="'--only'"
        )
    report = check(path, only)
    out.print(report)
    if not report.passed:
        raise typer.Exit(1)
