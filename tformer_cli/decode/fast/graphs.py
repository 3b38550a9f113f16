"""The decode step as a graph: a CUDA graph per bucket (CUDA, ``auto`` and ``on``), the step's
kernel launches replayed as one; on other devices ``torch.compile`` if ``on``. Both run the
eager step over bucketed shapes (``GRAPHS``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tformer_cli.compile import Compiled, wanted
from tformer_cli.decode.fast.buckets import GRAPHS, Eager, FastStep
from tformer_cli.model import DecoderCache


def uses_cuda_graphs(device: torch.device, compile: str) -> bool:
    """CUDA graphs on CUDA unless ``--compile off``."""
    return device.type == "cuda" and wanted(compile, auto=True)


class CudaGraphs(FastStep):
    """The eager step captured once per bucket and cache, then replayed; each shape's buffers
    are kept across batches (``pool``), so a graph captured in one batch replays in the next."""

    buckets = GRAPHS

    def __init__(self, eager: Eager) -> None:
        super().__init__(eager)
        self.captured: dict[tuple, _Graph] = {}
        self.pool: dict[tuple, DecoderCache] = {}  # buffers that captured graphs read and write
        self.mempool = torch.cuda.graph_pool_handle()

    def __call__(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None) -> Tensor:
        key = (*cache.self_kv.shape, *cache.cross_kv.shape, cache.span, rows is not None)
        graph = self.captured.get(key)
        if graph is None or graph.cache is not cache:
            graph = self.captured[key] = _Graph(self.eager, tokens, cache, rows, self.mempool)
        return graph(tokens, rows)

    def start(self, src: Tensor, beams: int, max_len: int) -> DecoderCache:
        """The bucketed cache copied into the buffers kept for its shape, or kept as those."""
        cache = super().start(src, beams, max_len)
        kept = self.pool.setdefault(
            self.key(cache, cache.self_kv.size(2), cache.src_mask.size(0)), cache
        )
        if kept is not cache:
            kept.cross_kv.copy_(cache.cross_kv)
            kept.src_mask.copy_(cache.src_mask)
            kept.pos.zero_()
            kept.span = cache.span
        return kept

    def select(self, cache: DecoderCache, rows: Tensor, sentences: Tensor) -> DecoderCache:
        """The cache of ``rows`` and ``sentences``, in the buffers kept for that shape."""
        key = self.key(cache, rows.numel(), sentences.numel())
        kept = cache.select(rows, sentences, into=self.pool.get(key))
        return self.pool.setdefault(key, kept)

    def key(self, cache: DecoderCache, rows: int, sentences: int) -> tuple:
        return (rows, sentences, cache.self_kv.size(4), cache.cross_kv.size(4))  # R, B', T, S


class _Graph:
    """The eager step captured in a CUDA graph for one cache's buffers and span; its output
    (R, V) is valid until the next replay."""

    def __init__(
        self,
        fn: Eager,
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


class TorchCompiled(FastStep):
    """The eager step under ``torch.compile`` over bucketed shapes (other devices, ``on``)."""

    buckets = GRAPHS

    def __init__(self, eager: Eager, on_notice: Callable[[str], None]) -> None:
        super().__init__(eager)
        self.fn = Compiled(eager.__call__, "decode step", on_notice, dynamic=False)

    def __call__(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None) -> Tensor:
        return self.fn(tokens, cache, rows)
