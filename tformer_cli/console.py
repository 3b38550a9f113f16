"""Progress bars and logs go to stderr, so stdout carries results only."""

from __future__ import annotations

import io
import os
import signal
from typing import TextIO

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


class StopOnClosedPipe(io.TextIOBase):
    """A text stream whose reader may go away (`tformer train ... 2>&1 | head`): the first
    write that finds the pipe closed sends this process a SIGINT, so that training saves and
    stops as on Ctrl-C rather than dying with its work since the last save; the rest is dropped.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream, self.reader_gone = stream, False

    def _guard(self, action: str, *args: str) -> None:
        if self.reader_gone:
            return
        try:
            getattr(self.stream, action)(*args)
        except BrokenPipeError:
            self.reader_gone = True
            os.kill(os.getpid(), signal.SIGINT)

    def write(self, text: str) -> int:
        self._guard("write", text)
        return len(text)

    def flush(self) -> None:
        self._guard("flush")

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()
