"""Progress bars and logs go to stderr, so stdout carries results only."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def make_progress(label: str, console: Console, disable: bool = False) -> Progress:
    """A bar with count, elapsed time, ETA and a free-text ``info`` field for live numbers."""
    return Progress(
        TextColumn(f"[bold blue]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=disable,
    )
