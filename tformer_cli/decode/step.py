"""One decoding step over the KV cache, the one every search uses: log p(. | x, y_<t) for the next
token of every row, the decoder run on the newest token alone while the earlier tokens' keys and
values are read from the cache. Its shapes do not change as the output grows, so the same step
can also run compiled or as a graph (``make_step``, ``decode/fast/``); ``--compile off`` runs it
as written here.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from tformer_cli.decode import fast
from tformer_cli.decode.fast.buckets import EAGER, FastStep
from tformer_cli.decode.reference import next_logprobs
from tformer_cli.model import DecoderCache, Transformer

_STEPS: weakref.WeakKeyDictionary[Transformer, dict[str, Step]] = weakref.WeakKeyDictionary()


class DecodeStep:
    """The next-token log-probabilities of every row of a cache, eagerly: ``step(tokens, cache,
    rows)``; ``start`` makes the cache and ``select`` shrinks it."""

    buckets = EAGER  # every shape exact

    def __init__(self, model: Transformer) -> None:
        self.model_ref = weakref.ref(model)  # kept by _STEPS under the model: no cycle to it

    @property
    def model(self) -> Transformer:
        model = self.model_ref()
        assert model is not None, "the model of a decode step is gone"
        return model

    @classmethod
    def of(cls, model: Transformer, compile: str = "auto") -> Step:
        """The step kept for this model and mode (``make_step``), so that graphs and buffers
        made for one batch serve the next."""
        steps = _STEPS.setdefault(model, {})
        if compile not in steps:
            steps[compile] = make_step(model, compile)
        return steps[compile]

    def __call__(self, tokens: Tensor, cache: DecoderCache, rows: Tensor | None = None) -> Tensor:
        """tokens (R,) at slot ``cache.pos`` -> ``next_logprobs`` (R, V), after reordering the
        cache's rows by ``rows`` (R,) if given (beam search)."""
        if rows is not None:
            cache.reorder(rows)
        return next_logprobs(self.model.decode(tokens[:, None], None, None, cache)[:, -1])

    def start(self, src: Tensor, beams: int, max_len: int) -> DecoderCache:
        """Encode src (B, S): an empty cache for ``beams`` rows per sentence, ``max_len`` slots."""
        memory, src_mask = self.model.encode(src)  # (B, S, d), (B, 1, 1, S)
        cache = self.model.init_cache(memory, src_mask, max_len, beams)
        if beams > 1:  # beam search reorders the rows by gathering into a second buffer
            cache.spare = torch.empty_like(cache.self_kv)  # exact spans: no slot read unwritten
        return cache

    def select(self, cache: DecoderCache, rows: Tensor, sentences: Tensor) -> DecoderCache:
        """The cache of ``rows`` (into B) and ``sentences`` (into B'), fewer than it holds."""
        return cache.select(rows, sentences, blank=True)

    def greedy(
        self, tokens: Tensor, cache: DecoderCache, state: tuple[Tensor, ...]
    ) -> list[Tensor] | None:
        """None: the search makes greedy's choice (the compiled CPU step makes it itself)."""
        return None


Step = DecodeStep | FastStep


def make_step(
    model: Transformer, compile: str = "auto", on_notice: Callable[[str], None] | None = None
) -> Step:
    """A new step of ``model`` for ``compile`` (``auto``, ``on`` or ``off``): the faster way
    ``fast.choose`` picks, or the eager ``DecodeStep``; ``on_notice`` hears the notices."""
    eager = DecodeStep(model)
    notice = on_notice or (lambda line: print(line, file=sys.stderr))
    return fast.choose(eager, compile, notice) or eager
