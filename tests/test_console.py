"""Tests for tformer_cli.console: a closed pipe on the log stops training as Ctrl-C does."""

from __future__ import annotations

import io

from tformer_cli.console import StopOnClosedPipe
from tformer_cli.training.state import stop_on_interrupt


class ClosedPipe(io.StringIO):
    """A reader that has gone away (`... | head`): every write and flush fails."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise BrokenPipeError

    def flush(self) -> None:
        raise BrokenPipeError


def test_a_closed_pipe_stops_training_as_ctrl_c_and_later_output_is_dropped():
    pipe = ClosedPipe()
    stream = StopOnClosedPipe(pipe)
    with stop_on_interrupt() as interrupted:
        assert not interrupted[0]
        assert stream.write("step 100: valid ...\n") == len("step 100: valid ...\n")
        assert interrupted[0]  # the loop finishes its update, saves last.pt and stops
        stream.write("stopped: interrupted\n")
        stream.flush()
    assert pipe.writes == 1


def test_an_open_stream_gets_every_write():
    sink = io.StringIO()
    stream = StopOnClosedPipe(sink)
    stream.write("a")
    stream.write("b\n")
    stream.flush()
    assert sink.getvalue() == "ab\n" and not stream.reader_gone
