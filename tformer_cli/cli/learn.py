"""`tformer learn start`, `solutions` and `check`: build a Transformer from the paper's
equations, one function at a time, checked against tformer's own (docs/learn.md)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

import typer

from tformer_cli.cli.app import HELP, Group, app, out
from tformer_cli.cli.options import command
from tformer_cli.config import setting

learn_app = typer.Typer(
    help="Build a Transformer yourself: exercises from the paper's equations, each checked"
    " against tformer's own function.",
    no_args_is_help=True,
    context_settings=HELP,
    cls=Group,
)
app.add_typer(learn_app, name="learn")


@dataclass(frozen=True)
class Folder:
    """``tformer learn start`` and ``solutions``: the folder written."""

    folder: Path = setting(MISSING, "Folder to write into (made if missing).", argument=True)


@command(Folder, "start", group=learn_app)
def start_command(v: Folder) -> None:
    """Write FOLDER/exercises.py: a function to write for each piece of the Transformer, in the
    paper's order, each with its signature, shapes and equation. An existing file is kept."""
    from tformer_cli.learn import EXERCISES, start

    path = start(v.folder)
    out.print(f"wrote {path}: {len(EXERCISES)} exercises to write", markup=False)
    out.print(f"check them with: tformer learn check {v.folder}", markup=False)


@command(Folder, "solutions", group=learn_app)
def solutions_command(v: Folder) -> None:
    """Write FOLDER/solutions.py: tformer's own function for each exercise, copied from its
    source, for teachers and for after trying. An existing file is kept."""
    from tformer_cli.learn import solutions

    path = solutions(v.folder)
    out.print(f"wrote {path}: tformer learn check {path} passes every exercise", markup=False)


@dataclass(frozen=True, kw_only=True)
class Check:
    """``tformer learn check``: the file checked, all of it or one exercise."""

    path: Path = setting(MISSING, "exercises.py, solutions.py, or their folder.", argument=True)
    only: str | None = setting(
        None, "Check this exercise alone (its function's name).", metavar="NAME"
    )


@command(Check, "check", group=learn_app)
def check_command(v: Check) -> None:
    """Run each function of PATH beside tformer's own, on random, edge-case and masked inputs,
    and print a row per exercise: passed, not written yet, or failed with its first mismatch
    and a hint. Exits 1 until every exercise checked passes."""
    from tformer_cli.learn import EXERCISES, check

    names = [e.name for e in EXERCISES]  # the catalogue loads torch: read here, not at import
    if v.only is not None and v.only not in names:
        raise typer.BadParameter(
            f"{v.only!r} is not one of {', '.join(names)}", param_hint="'--only'"
        )
    report = check(v.path, v.only)
    out.print(report)
    if not report.passed:
        raise typer.Exit(1)
