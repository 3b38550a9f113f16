"""The decode step made fast, off the reading path: ``decode/step.py``'s eager step run another
way, with the same results (``choose``): compiled ahead of time on the CPU (``cpu``, ``aot``), a
CUDA graph per bucket on CUDA or ``torch.compile`` elsewhere (``graphs``, ``buckets``), and a
search of very few rows on one CPU thread (``search_threads``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from tformer_cli.compile import wanted
from tformer_cli.decode.fast.buckets import Eager, FastStep
from tformer_cli.decode.fast.cpu import CpuStep
from tformer_cli.decode.fast.graphs import CudaGraphs, TorchCompiled, uses_cuda_graphs

# Rows up to which a CPU search runs on one thread (benchmarks/bench_threads.py, docs/speed.md)
ONE_THREAD_ROWS = 2


def choose(eager: Eager, compile: str, on_notice: Callable[[str], None]) -> FastStep | None:
    """How ``compile`` runs the ``eager`` step on its model's device; None: eagerly."""
    device = next(eager.model.parameters()).device
    if uses_cuda_graphs(device, compile):
        return CudaGraphs(eager)
    if device.type == "cpu":
        return CpuStep(eager, compile, on_notice) if wanted(compile, auto=True) else None
    if device.type != "cuda" and wanted(compile, auto=False):
        return TorchCompiled(eager, on_notice)
    return None


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
