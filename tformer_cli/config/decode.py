"""How a translation is searched for or drawn: the decoding settings of translate, eval and
serve, and the values each may hold (``values`` in a field's metadata: the options that set
them declare the same)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tformer_cli.config.fields import OneOf, Range, check_values, values
from tformer_cli.errors import SettingError

MAX_SEED = 2**63 - 1  # a signed 64-bit integer, as torch.manual_seed takes it everywhere


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is drawn: ``p(y) ∝ p_model(y)^(1/temperature)``, then truncated to the
    ``top_k`` most probable tokens, to the nucleus of mass ``top_p``, and to the tokens of
    probability >= ``epsilon`` (each ``None``: no truncation). The top token always survives."""

    # past these, fp32 log-probabilities divided by T overflow (or T itself rounds to 0 or
    # inf), and the draw is greedy or uniform already
    temperature: float = field(default=1.0, metadata=values(Range(1e-4, 1e4)))
    top_k: int | None = field(default=None, metadata=values(Range(1)))
    top_p: float | None = field(default=None, metadata=values(Range(0, 1, low_open=True)))
    epsilon: float | None = field(default=None, metadata=values(Range(0, 1, high_open=True)))

    def __post_init__(self) -> None:
        check_values(self)


@dataclass(frozen=True)
class DecodeConfig:
    """How translations are searched for. Length limits: ``</s>`` may end a translation once it
    has ``min_len`` tokens; at most ``a * |src| + b`` tokens are generated, ``</s>`` included,
    with ``|src|`` the source tokens plus its ``</s>``."""

    beam: int = field(default=1, metadata=values(Range(1)))
    alpha: float = field(default=0.6, metadata=values(Range(0)))
    max_len_a: float = field(default=1.5, metadata=values(Range(0)))
    max_len_b: int = field(default=10, metadata=values(Range(0)))
    nbest: int = field(default=1, metadata=values(Range(1)))
    min_len: int = field(default=0, metadata=values(Range(0)))
    sampling: SamplingConfig | None = None  # draw each token instead (nbest: samples per input)
    seed: int = field(default=0, metadata=values(Range(0, MAX_SEED)))  # of the draws
    # > 0: minimum Bayes risk over this many candidates
    mbr: int = field(default=0, metadata=values(Range(0)))
    # where candidates come from: sample (``sampling``) or beam
    mbr_from: str = field(default="sample", metadata=values(OneOf(("sample", "beam"))))
    mbr_utility: str = field(default="chrf", metadata=values(OneOf(("chrf", "bleu"))))

    def __post_init__(self) -> None:
        check_values(self)
        if self.sampling is not None and self.beam > 1:
            raise SettingError("beam", self.beam, "must be 1 when sampling (a token drawn a step)")

    def nbest_in_beam(self) -> DecodeConfig:
        """This search if its n-best list is no longer than its beam, as translate, the API and
        the server ask (the search itself ranks the finished hypotheses of every step, more
        than a beam's); else a ``SettingError``. Draws aside: their n-best are samples."""
        if self.sampling is None and not self.mbr and self.nbest > self.beam:
            raise SettingError("nbest", self.nbest, f"needs {{beam}} >= {self.nbest}")
        return self

    def min_len_cut(self) -> float | None:
        """The longest source (tokens, ``</s>`` aside) whose length limit ``a * |src| + b`` is
        at most ``min_len``, so that its translation ends at the limit instead: ``min_len`` is
        cut to the limit there. ``None``: no source is that short; ``inf``: every one is."""
        a, b, shortest = self.max_len_a, self.max_len_b, 2  # one token and its </s>
        if int(a * shortest + b) > self.min_len:
            return None
        return math.inf if a == 0 else math.ceil((self.min_len + 1 - b) / a) - 2
