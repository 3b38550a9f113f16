"""The decode step on the CPU with ``--compile auto`` or ``on``: when to run it compiled ahead of
time (``aot``), and which build (for few rows up to ``FEW_ROWS``, for many above).

``on`` builds it at once; ``auto`` runs eagerly, loads a kept one after ``LOAD_AFTER`` seconds of
eager decoding or for a batch of ``LOAD_WORK`` row-steps, and builds it once eager decoding has
taken as long as a build (a short job never pays more than twice its eager time). It computes in
fp32 or under bf16 autocast as the eager step would; with no C++ compiler, or int8 weights, the
step stays eager.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from tformer_cli.decode.fast import aot
from tformer_cli.decode.fast.buckets import Eager, FastStep
from tformer_cli.model import DecoderCache

# Seconds of eager decoding after which ``auto`` builds the step, unless the last build of this
# shape took another time here (``aot.build_seconds``)
BUILD_AFTER = 60.0
# Seconds of eager decoding after which ``auto`` loads a kept step (loading imports Inductor)
LOAD_AFTER = 3.0
# Row-steps (rows x the most tokens each may output) of a batch that load a kept step at once
LOAD_WORK = 20_000
# Rows of a batch up to which the build for few rows runs, above which the one for many
# (benchmarks/bench_step_builds.py, docs/speed.md)
FEW_ROWS = 8
# A compiled step's beams, threads (its kernels' own count), build (many rows) and autocast dtype
Key = tuple[int, int, bool, torch.dtype | None]


class CpuStep(FastStep):
    """The eager step, or for each batch the compiled step of its beams and build once one is
    kept or worth building (``cpu_step``); ``mode``: ``auto`` or ``on``."""

    def __init__(self, eager: Eager, mode: str, on_notice: Callable[[str], None]) -> None:
        super().__init__(eager)
        self.mode, self.on_notice = mode, on_notice
        self.aot: dict[Key, aot.AotStep | None] = {}  # the compiled CPU step; None: eager
        self.compiled_now: aot.AotStep | None = None  # the one the current cache runs on
        self.eager_seconds = 0.0  # decoding time of the eager CPU step, for ``auto``
        self.artifacts: dict[Key, Path] = {}  # where each compiled step is kept

    def __call__(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None) -> Tensor:
        if self.compiled_now is not None:
            if rows is not None:
                cache.reorder(rows)
            return self.compiled_now(tokens, cache)
        start = time.perf_counter()
        out = self.eager(tokens, cache, rows)
        self.eager_seconds += time.perf_counter() - start
        return out

    def start(self, src: Tensor, beams: int, max_len: int) -> DecoderCache:
        """The eager step's cache, and the compiled step this batch runs on, if any."""
        cache = super().start(src, beams, max_len)
        rows = cache.self_kv.size(2)  # sentences x beams
        big = rows * max_len >= LOAD_WORK  # worth loading a kept step now
        self.compiled_now = self.cpu_step(beams, rows > FEW_ROWS, big)
        if beams > 1:  # eager or compiled, beam search reorders the rows by swapping buffers
            cache.spare = torch.empty_like(cache.self_kv)  # exact spans: no slot read unwritten
        return cache

    def greedy(
        self, tokens: Tensor, cache: DecoderCache, state: tuple[Tensor, ...]
    ) -> list[Tensor] | None:
        """``AotStep.greedy`` where the step is compiled for one beam; else None."""
        if self.compiled_now is None or not self.compiled_now.fuses_greedy:
            return None
        return self.compiled_now.greedy(tokens, cache, state)

    def cpu_step(self, beams: int, many: bool = False, big: bool = False) -> aot.AotStep | None:
        """The compiled step for ``beams`` and build: kept (``auto``: for a ``big`` batch, or
        after ``LOAD_AFTER``), or built now (``on``, or ``auto`` after a build's time); None:
        eagerly."""
        key = (beams, torch.get_num_threads(), many, aot.autocast_dtype())
        if key in self.aot:
            return self.aot[key]
        if self.mode == "auto" and self.eager_seconds < LOAD_AFTER and not big:
            return None  # too short a job so far to load even a kept step
        if not aot.supported(self.model):
            if self.mode == "on":
                self.on_notice("the compiled CPU step takes fp32 weights: running it eagerly")
            self.aot[key] = None
            return None
        after = aot.build_seconds(self.model, beams, many) or BUILD_AFTER
        build = self.mode == "on" or self.eager_seconds >= after
        if build and aot.cxx_compiler() is None:
            self.on_notice("no C++ compiler found (g++ or $CXX): the decode step runs eagerly")
            self.aot[key] = None
            return None
        try:
            path = self.artifacts.setdefault(key, aot.artifact(self.model, beams, many))
            step, seconds = aot.load_step(path, self.model, self.eager, beams, build, many)
        except Exception as e:  # export or Inductor errors: the eager step still works
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.on_notice(f"compiling the decode step failed ({reason[:160]}); running it eagerly")
            self.aot[key] = None
            return None
        if seconds:
            rows = "many" if many else "few"
            line = f"compiled the decode step (beams {beams}, {rows} rows) in {seconds:.1f} s"
            self.on_notice(line)
        if step is not None:  # else: not kept yet and not worth building yet
            self.aot[key] = step
        return step
