"""The exercises of ``tformer learn``, in the order they build a Transformer and translate with
it; each is named after tformer's function it writes again."""

from __future__ import annotations

from tformer_cli.learn.cases import Exercise
from tformer_cli.learn.model_exercises import (
    ATTENTION,
    CAUSAL_MASK,
    EMBED,
    FEED_FORWARD,
    LAYER_NORM,
    LOSS,
    MULTI_HEAD,
    OUTPUT,
    PADDING_MASK,
    POSITIONS,
    RESIDUAL,
)  # fmt: skip
from tformer_cli.learn.search_exercises import (
    BEAM,
    EXCESS_ERROR,
    GREEDY,
    LENGTH_PENALTY,
    MIX,
    WRITE_CACHE,
)  # fmt: skip

EXERCISES: tuple[Exercise, ...] = (
    POSITIONS, ATTENTION, CAUSAL_MASK, PADDING_MASK, MULTI_HEAD, LAYER_NORM, RESIDUAL,
    FEED_FORWARD, EMBED, OUTPUT, LOSS, WRITE_CACHE, GREEDY, LENGTH_PENALTY, BEAM, EXCESS_ERROR,
    MIX,
)  # fmt: skip
BY_NAME = {e.name: e for e in EXERCISES}
