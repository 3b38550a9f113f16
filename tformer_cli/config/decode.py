"""How a translation is searched for or drawn: the decoding settings of translate, eval and
serve."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tformer_cli.errors import TformerError


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is drawn: ``p(y) ∝ p_model(y)^(1/temperature)``, then truncated to the
    ``top_k`` most probable tokens, to the nucleus of mass ``top_p``, and to the tokens of
    probability >= ``epsilon`` (each ``None``: no truncation). The top token always survives."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    epsilon: float | None = None

    def __post_init__(self) -> None:
        # past these, fp32 log-probabilities divided by T overflow (or T itself rounds to 0 or
        # inf), and the draw is greedy or uniform already
        if not 1e-4 <= self.temperature <= 1e4:
            raise TformerError(f"temperature must be in [1e-4, 1e4], not {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise TformerError(f"top-k must be at least 1, not {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise TformerError(f"top-p must be in (0, 1], not {self.top_p}")
        if self.epsilon is not None and not 0 <= self.epsilon < 1:
            raise TformerError(f"epsilon must be in [0, 1), not {self.epsilon}")


@dataclass(frozen=True)
class DecodeConfig:
    """How translations are searched for. Length limits: ``</s>`` may end a translation once it
    has ``min_len`` tokens; at most ``a * |src| + b`` tokens are generated, ``</s>`` included,
    with ``|src|`` the source tokens plus its ``</s>``."""

    beam: int = 1
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    nbest: int = 1
    min_len: int = 0
    sampling: SamplingConfig | None = None  # draw each token instead (nbest: samples per input)
    seed: int = 0  # of the draws
    mbr: int = 0  # > 0: minimum Bayes risk over this many candidates
    mbr_from: str = "sample"  # where candidates come from: sample (``sampling``) or beam
    mbr_utility: str = "chrf"  # or bleu

    def __post_init__(self) -> None:
        if self.sampling is not None and self.beam > 1:
            raise TformerError("sampling draws one token at a time: give it no --beam")
        if self.mbr < 0:
            raise TformerError("--mbr must be 0 (off) or a number of candidates")
        if self.mbr_from not in ("sample", "beam"):
            raise TformerError(f"unknown --mbr-from {self.mbr_from!r}: use sample or beam")
        if self.mbr_utility not in ("chrf", "bleu"):
            raise TformerError(f"unknown --mbr-utility {self.mbr_utility!r}: use chrf or bleu")
        for name in ("alpha", "max_len_a"):
            if not math.isfinite(getattr(self, name)):
                raise TformerError(f"{name} must be a finite number, not {getattr(self, name)}")
        if self.beam < 1 or self.nbest < 1:
            raise TformerError("beam and nbest must be at least 1")
        for name in ("alpha", "max_len_a", "max_len_b", "min_len"):
            if getattr(self, name) < 0:
                option = "--" + name.replace("_", "-")
                raise TformerError(f"{option} must not be negative, not {getattr(self, name)}")
