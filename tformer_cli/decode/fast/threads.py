"""How many CPU threads a search runs on: one for a search of very few rows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Rows up to which a CPU search runs on one thread (benchmarks/bench_threads.py, docs/speed.md)
ONE_THREAD_ROWS = 2


@contextmanager
def search_threads(device: torch.device, rows: int) -> Iterator[None]:
    """torch's CPU threads for a search of ``rows`` rows: one up to ``ONE_THREAD_ROWS`` (the
    compiled step of one thread is its own artifact, ``aot.step_key``), else as they are."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or rows > ONE_THREAD_ROWS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
