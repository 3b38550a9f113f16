"""The decode step made fast, off the reading path: ``decode/step.py``'s eager step run another
way, with the same results, where ``--compile`` asks for it and it pays (``choose``):

- on the CPU (``auto``, ``on``), compiled ahead of time (``cpu``: when, and which build;
  ``aot``: the build, a shared library kept on disk);
- on CUDA (``auto``, ``on``), a CUDA graph per bucket (``graphs``); on other devices,
  ``torch.compile`` (``on``);
- over shapes rounded up to a few buckets where each shape costs a graph (``buckets``);
- and a search of very few rows on one CPU thread (``threads``).
"""

from __future__ import annotations

from collections.abc import Callable

from tformer_cli.compile import wanted
from tformer_cli.decode.fast.buckets import Eager, FastStep
from tformer_cli.decode.fast.cpu import CpuStep
from tformer_cli.decode.fast.graphs import CudaGraphs, TorchCompiled, uses_cuda_graphs


def choose(eager: Eager, compile: str, on_notice: Callable[[str], None]) -> FastStep | None:
    """How ``compile`` (``auto``, ``on`` or ``off``) runs the ``eager`` step on its model's
    device: CUDA graphs on CUDA (``auto``, ``on``), the compiled step's policy on the CPU
    (``auto``, ``on``), ``torch.compile`` elsewhere (``on``); None: eagerly."""
    device = next(eager.model.parameters()).device
    if uses_cuda_graphs(device, compile):
        return CudaGraphs(eager)
    if device.type == "cpu":
        return CpuStep(eager, compile, on_notice) if wanted(compile, auto=True) else None
    if device.type != "cuda" and wanted(compile, auto=False):
        return TorchCompiled(eager, on_notice)
    return None
