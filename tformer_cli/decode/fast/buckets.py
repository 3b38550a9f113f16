"""Static shapes for a step that runs as a graph (``Buckets``), and what every fast way of running
the decode step shares (``FastStep``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from tformer_cli.data.tokenizer import PAD_ID
from tformer_cli.model import DecoderCache, Transformer


class Eager(Protocol):
    """The eager step a fast step runs another way (``DecodeStep``)."""

    @property
    def model(self) -> Transformer: ...

    def __call__(
        self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None
    ) -> Tensor: ...


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Buckets:
    """How the step's shape axes are rounded up: exact (eager), or powers of two for rows and
    multiples for lengths where each shape is a graph."""

    rows: bool = False  # round rows (sentences) up to a power of two
    source: int = 1  # round the source length up to a multiple of this
    span: int = 1  # round the attended self-attention slots up to a multiple of this

    def sentences(self, n: int) -> int:
        return 1 << (n - 1).bit_length() if self.rows else n


EAGER = Buckets()
GRAPHS = Buckets(rows=True, source=16, span=32)


class FastStep(ABC):
    """A faster way to run the ``eager`` step, with its methods and results, over caches whose
    shapes are rounded up to ``buckets``."""

    buckets = EAGER

    def __init__(self, eager: Eager) -> None:
        self.eager = eager

    @property
    def model(self) -> Transformer:
        return self.eager.model

    @abstractmethod
    def __call__(
        self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None
    ) -> Tensor: ...

    def start(self, src: Tensor, beams: int, max_len: int) -> DecoderCache:
        """``DecodeStep.start`` with its shapes rounded up to the buckets (padding rows repeat
        the last sentence, so every row attends to something real)."""
        model, (B, S) = self.model, src.shape
        S_bucket = max(S, min(round_up(S, self.buckets.source), model.cfg.max_positions))
        padded = src.new_full((self.buckets.sentences(B), S_bucket), PAD_ID)
        padded[:B, :S] = src
        padded[B:, :S] = src[-1]
        memory, src_mask = model.encode(padded)  # (B', S', d), (B', 1, 1, S')
        return model.init_cache(memory, src_mask, round_up(max_len, self.buckets.span), beams)

    def select(self, cache: DecoderCache, rows: Tensor, sentences: Tensor) -> DecoderCache:
        """``DecodeStep.select``: new buffers, unless the step keeps its own (zeroed where spans
        are rounded up)."""
        return cache.select(rows, sentences, blank=self.buckets.span == 1)

    def greedy(
        self, tokens: Tensor, cache: DecoderCache, state: tuple[Tensor, ...]
    ) -> list[Tensor] | None:
        """``DecodeStep.greedy``: None, unless the step makes greedy's choice itself."""
        return None
