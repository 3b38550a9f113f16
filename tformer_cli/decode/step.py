"""One static-shape decoding step, the only one the searches use: log p(. | x, y_<t) for the next
token of every row, from the KV cache.

Its shapes do not change as the output grows: the step index is the cache's ``pos`` tensor, the
self-attention buffer is attended over a ``span`` of slots with a mask of the filled ones, and
beam search reorders the buffer in place. Rows, source length and span are rounded up to a few
buckets (``Buckets``) where each shape costs a graph. The same eager function then runs in one
of three ways (``--compile``):

- eager (``off``; and on the CPU, ``auto`` until the compiled step is built);
- on the CPU, compiled ahead of time (``aot``: a shared library per model, beams, threads and
  build, every length a dynamic dimension, kept on disk), the build for few rows up to
  ``FEW_ROWS`` rows a batch and the build for many above: ``on`` builds it at once, ``auto``
  loads a kept one after ``LOAD_AFTER`` seconds of eager decoding or for a batch of at least
  ``LOAD_WORK`` row-steps, or builds it once eager decoding has taken as long as a build (so a
  short job never pays more than twice its eager time, a long one gains). With no C++ compiler,
  or int8 or bf16 weights, the step stays eager;
- a CUDA graph per bucket (CUDA, ``auto``): the step's ~100 kernel launches replayed as one,
  which is what bounds a small model on a GPU. Capturing takes milliseconds, not Inductor's
  tens of seconds, so even one sentence pays for it (other devices: ``torch.compile`` if ``on``).
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tformer_cli.compile import Compiled, wanted
from tformer_cli.data.tokenizer import BOS_ID, PAD_ID
from tformer_cli.decode import aot
from tformer_cli.model import DecoderCache, Transformer

# Seconds of eager decoding after which ``auto`` builds the compiled CPU step: the time the last
# build of a step of this shape took here (``aot.build_seconds``), else this guess of a build's
# time; so that a job pays at most about twice what the better choice would have cost.
BUILD_AFTER = 60.0
# Seconds of eager decoding after which ``auto`` looks for a kept compiled step: loading one
# imports Inductor first, seconds that a short job would not win back.
LOAD_AFTER = 3.0
# Row-steps (rows x the most tokens each may output) of one batch from which ``auto`` loads a
# kept compiled step at once: a batch that large takes eager decoding longer than the import.
LOAD_WORK = 20_000
# Rows (sentences x beams) of a batch up to which the compiled CPU step is the build for few rows
# (Inductor's own matrix kernels), above which the build for many (MKL's, explicit attention):
# where one beat the other (benchmarks/bench_step_builds.py, docs/speed.md).
FEW_ROWS = 8
# Rows up to which a CPU search runs on one thread: at one or two rows the compiled step ran
# faster on one thread than on two and the eager step as fast; at five (beam 5) and at eight,
# two threads won (benchmarks/bench_threads.py, docs/speed.md).
ONE_THREAD_ROWS = 2


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def next_logprobs(logits: Tensor) -> Tensor:
    """log p(. | x, y_<t) (R, V), fp32, from the logits (R, V) of the last position. ``<pad>``
    and ``<s>`` are never generated; the other log-probabilities stay the model's own (no
    renormalisation), so scores equal a teacher-forced pass's."""
    logp = logits.float().log_softmax(dim=-1)  # (R, V)
    logp[:, PAD_ID] = float("-inf")
    logp[:, BOS_ID] = float("-inf")
    return logp


@dataclass(frozen=True)
class Buckets:
    """How the step's shape axes are rounded up. Exact sizes (1) where shapes cost nothing to
    change (eager); powers of two for rows, multiples for lengths where each shape is a graph."""

    rows: bool = False  # round rows (sentences) up to a power of two
    source: int = 1  # round the source length up to a multiple of this
    span: int = 1  # round the attended self-attention slots up to a multiple of this

    def sentences(self, n: int) -> int:
        return 1 << (n - 1).bit_length() if self.rows else n


EAGER = Buckets()
GRAPHS = Buckets(rows=True, source=16, span=32)
_STEPS: weakref.WeakKeyDictionary[Transformer, dict[str, DecodeStep]] = weakref.WeakKeyDictionary()


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


def uses_cuda_graphs(device: torch.device, compile: str) -> bool:
    """CUDA graphs on CUDA unless ``--compile off``; on other devices ``torch.compile`` decides
    (``on``), or nothing (``auto``, ``off``)."""
    return device.type == "cuda" and wanted(compile, auto=True)


class DecodeStep:
    """The next-token log-probabilities of every row of a cache, eager, compiled or replayed
    from a CUDA graph: ``step(tokens, cache, rows)``.

    ``compile``: ``auto`` (CUDA graphs on CUDA; on the CPU the compiled step once kept or
    worth building), ``on`` or ``off``. ``on_notice`` hears the one-line notices (compile time,
    a fallback to eager; stderr by default).
    """

    def __init__(
        self,
        model: Transformer,
        compile: str = "auto",
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.model_ref = weakref.ref(model)  # kept by _STEPS under the model: no cycle to it
        device = next(model.parameters()).device
        self.graphs = uses_cuda_graphs(device, compile)
        self.on_notice = on_notice or (lambda line: print(line, file=sys.stderr))
        self.cpu_mode = compile if device.type == "cpu" and wanted(compile, auto=True) else None
        # by beams, threads (its kernels' own count) and build: the compiled CPU step, None: eager
        self.aot: dict[tuple[int, int, bool], aot.AotStep | None] = {}
        self.compiled_now: aot.AotStep | None = None  # the one the current cache runs on
        self.eager_seconds = 0.0  # decoding time of the eager CPU step, for ``auto``
        self.timing = False  # whether the current batch's eager steps count for ``auto``
        self.artifacts: dict[tuple[int, int, bool], Path] = {}  # where each compiled step is kept
        compiled = device.type not in ("cpu", "cuda") and wanted(compile, auto=False)
        self.fn = (
            Compiled(self.eager, "decode step", self.on_notice, dynamic=False)
            if compiled
            else self.eager
        )
        self.buckets = GRAPHS if self.graphs or compiled else EAGER
        self.captured: dict[tuple, _Graph] = {}
        self.pool: dict[tuple, DecoderCache] = {}  # buffers that captured graphs read and write
        self.mempool = torch.cuda.graph_pool_handle() if self.graphs else None

    @property
    def model(self) -> Transformer:
        model = self.model_ref()
        assert model is not None, "the model of a decode step is gone"
        return model

    @classmethod
    def of(cls, model: Transformer, compile: str = "auto") -> DecodeStep:
        """The step kept for this model and mode, so that graphs and buffers made for one batch
        (or one call: a server's requests, a file's chunks) serve the next."""
        steps = _STEPS.setdefault(model, {})
        if compile not in steps:
            steps[compile] = cls(model, compile)
        return steps[compile]

    def eager(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None) -> Tensor:
        """tokens (R,) at slot ``cache.pos`` -> ``next_logprobs`` (R, V), after reordering the
        cache's rows by ``rows`` (R,) if given."""
        if rows is not None:
            cache.reorder(rows)
        return next_logprobs(self.model.decode(tokens[:, None], None, None, cache)[:, -1])

    def __call__(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None) -> Tensor:
        if self.compiled_now is not None:
            if rows is not None:
                cache.reorder(rows)
            return self.compiled_now(tokens, cache)
        if self.timing:
            start = time.perf_counter()
            out = self.fn(tokens, cache, rows)
            self.eager_seconds += time.perf_counter() - start
            return out
        if not self.graphs:
            return self.fn(tokens, cache, rows)
        key = (*cache.self_kv.shape, *cache.cross_kv.shape, cache.span, rows is not None)
        graph = self.captured.get(key)
        if graph is None or graph.cache is not cache:
            graph = self.captured[key] = _Graph(self.eager, tokens, cache, rows, self.mempool)
        return graph(tokens, rows)

    def greedy(
        self, tokens: Tensor, cache: DecoderCache, state: tuple[Tensor, ...]
    ) -> list[Tensor] | None:
        """The compiled CPU step with greedy decoding's choice made inside it (``aot.AotStep``):
        log-probs, then ``greedy.advance``'s token, logprob, steps and alive; None where the
        step is not compiled for one beam, and the search makes the choice."""
        if self.compiled_now is None or not self.compiled_now.fuses_greedy:
            return None
        return self.compiled_now.greedy(tokens, cache, state)

    def start(self, src: Tensor, beams: int, max_len: int) -> DecoderCache:
        """Encode src (B, S) and return an empty cache for ``beams`` rows per sentence and
        ``max_len`` tokens, its sentences, source length and slots rounded up to the buckets
        (padding rows repeat the last sentence, so every row attends to something real)."""
        B, S = src.shape
        S_bucket = max(S, min(round_up(S, self.buckets.source), self.model.cfg.max_positions))
        padded = src.new_full((self.buckets.sentences(B), S_bucket), PAD_ID)
        padded[:B, :S] = src
        padded[B:, :S] = src[-1]
        memory, src_mask = self.model.encode(padded)  # (B', S', d), (B', 1, 1, S')
        cache = self.model.init_cache(memory, src_mask, round_up(max_len, self.buckets.span), beams)
        if self.graphs:
            return self.pooled(cache)
        many = padded.size(0) * beams > FEW_ROWS  # rows: the build for few or for many
        big = padded.size(0) * beams * max_len >= LOAD_WORK  # worth loading a kept step now
        self.compiled_now = self.cpu_step(beams, many, big) if self.cpu_mode else None
        self.timing = self.cpu_mode == "auto"  # eager time that a build would save
        if beams > 1 and self.fn == self.eager:  # eager or CPU-compiled beams: reorder by swapping
            cache.spare = torch.zeros_like(cache.self_kv)  # finite: masked slots
        return cache

    def cpu_step(self, beams: int, many: bool = False, big: bool = False) -> aot.AotStep | None:
        """The compiled CPU step for ``beams`` rows per sentence, the build for few rows or
        ``many``: kept in memory or on disk (``auto``: for a ``big`` batch, or once eager
        decoding took ``LOAD_AFTER``), or built now (``on``, or ``auto`` once eager decoding
        took a build's time); None to run eagerly."""
        key = (beams, torch.get_num_threads(), many)
        if key in self.aot:
            return self.aot[key]
        if self.cpu_mode == "auto" and self.eager_seconds < LOAD_AFTER and not big:
            return None  # too short a job so far to load even a kept step
        if not aot.supported(self.model):
            if self.cpu_mode == "on":
                self.on_notice("the compiled CPU step takes fp32 weights: running it eagerly")
            self.aot[key] = None
            return None
        after = aot.build_seconds(self.model, beams, many) or BUILD_AFTER
        build = self.cpu_mode == "on" or self.eager_seconds >= after
        if build and aot.cxx_compiler() is None:
            self.on_notice("no C++ compiler found (g++ or $CXX): the decode step runs eagerly")
            self.aot[key] = None
            return None
        try:
            path = self.artifacts.setdefault(key, aot.artifact(self.model, beams, many))
            step, seconds = aot.load(path, self.model, self.eager, beams, build, many)
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

    def select(self, cache: DecoderCache, rows: Tensor, sentences: Tensor) -> DecoderCache:
        """The cache of ``rows`` (into B) and ``sentences`` (into B'), fewer than it holds:
        new buffers when eager, else the ones kept for that shape."""
        if not self.graphs:
            kept = cache.select(rows, sentences)
            kept.spare = None if cache.spare is None else torch.zeros_like(kept.self_kv)
            return kept
        key = self.key(cache, rows.numel(), sentences.numel())
        kept = cache.select(rows, sentences, into=self.pool.get(key))
        return self.pool.setdefault(key, kept)

    def key(self, cache: DecoderCache, rows: int, sentences: int) -> tuple:
        return (rows, sentences, cache.self_kv.size(4), cache.cross_kv.size(4))  # R, B', T, S

    def pooled(self, cache: DecoderCache) -> DecoderCache:
        """``cache`` copied into the buffers kept for its shape (so graphs captured on them in
        an earlier batch replay as they are), or kept as those buffers if none are yet."""
        key = self.key(cache, cache.self_kv.size(2), cache.src_mask.size(0))
        kept = self.pool.get(key)
        if kept is None:
            self.pool[key] = cache
            return cache
        kept.cross_kv.copy_(cache.cross_kv)
        kept.src_mask.copy_(cache.src_mask)
        kept.pos.zero_()
        kept.span = cache.span
        return kept


class _Graph:
    """The eager step captured in a CUDA graph for one cache's buffers and span: ``tokens`` and
    ``rows`` are copied into static inputs, the graph replays, and its static output (R, V)
    is returned (valid until the next replay)."""

    def __init__(
        self,
        fn: Callable[[Tensor, DecoderCache, Tensor | None], Tensor],
        tokens: Tensor,
        cache: DecoderCache,
        rows: Tensor | None,
        mempool: tuple,
    ) -> None:
        self.cache = cache
        self.tokens = tokens.clone()
        self.rows = None if rows is None else rows.clone()
        scratch = DecoderCache(
            cache.self_kv.clone(), cache.cross_kv, cache.src_mask, cache.pos.clone(), cache.span
        )
        # bf16 autocast casts the weights inside the graph: a cast kept in autocast's cache
        # would be freed with the context, under a graph that still reads it
        bf16 = torch.is_autocast_enabled("cuda")
        no_cast_cache = torch.autocast("cuda", torch.get_autocast_dtype("cuda"), bf16, False)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), no_cast_cache:  # warm-up (lazy initialisation), on a copy
            fn(self.tokens, scratch, self.rows)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool), no_cast_cache:  # recorded, not run
            self.out = fn(self.tokens, cache, self.rows)

    def __call__(self, tokens: Tensor, rows: Tensor | None) -> Tensor:
        self.tokens.copy_(tokens)
        if rows is not None:
            self.rows.copy_(rows)
        self.graph.replay()
        return self.out
