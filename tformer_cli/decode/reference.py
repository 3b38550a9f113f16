"""The searches' definitions, and the naive searches the fast ones must equal."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import PAD_ID


@dataclass(frozen=True)
class Hypothesis:
    """A translation: token ids (no ``<s>``/``</s>``), their summed log-probability ``logprob``
    (``</s>`` included when ``finished``), and the search's ``score`` (beam: length-normalised)."""

    tokens: list[int]
    logprob: float
    score: float
    finished: bool = True


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), |Y| with ``</s>``."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, cfg: DecodeConfig, max_positions: int) -> Tensor:
    """Per-sentence limit on generated tokens, ``</s>`` included: ``a * |src| + b``. Shape (B,)."""
    src_len = (src != PAD_ID).sum(dim=1)
    return (cfg.max_len_a * src_len + cfg.max_len_b).long().clamp(1, max_positions - 1)
