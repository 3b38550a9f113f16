"""How a translation is searched for or drawn: the search itself (``DecodeConfig``,
``SamplingConfig``) and the settings a user gives translate, eval, serve and the Python API
(``DecodeOptions``, ``TraceOptions``), each declared once on its field: its help, spellings and
values, which every face reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from tformer_cli.config.fields import Checked, OneOf, Range, setting, values, values_of
from tformer_cli.errors import SettingError

ENGINES = ("torch", "ctranslate2")  # what decodes (--engine): tformer's search, or CTranslate2
MAX_SEED = 2**63 - 1  # a signed 64-bit integer, as torch.manual_seed takes it everywhere
# Upper bounds of settings that size memory: past them, a one-line error rather than torch's
# overflow or allocation traceback.
MAX_BEAM, MAX_HYPOTHESES, MAX_LENGTH = 256, 1024, 100_000
SAMPLING = ("temperature", "top_k", "top_p", "epsilon")  # the settings of a draw


@dataclass(frozen=True)
class SamplingConfig(Checked):
    """How the next token is drawn: ``p(y) ∝ p_model(y)^(1/temperature)``, then truncated to the
    ``top_k`` most probable tokens, to the nucleus of mass ``top_p``, and to the tokens of
    probability >= ``epsilon`` (each ``None``: no truncation). The top token always survives."""

    # past these, fp32 log-probabilities divided by T overflow (or T itself rounds to 0 or
    # inf), and the draw is greedy or uniform already
    temperature: float = field(default=1.0, metadata=values(Range(1e-4, 1e4)))
    top_k: int | None = field(default=None, metadata=values(Range(1)))
    top_p: float | None = field(default=None, metadata=values(Range(0, 1, low_open=True)))
    epsilon: float | None = field(default=None, metadata=values(Range(0, 1, high_open=True)))


@dataclass(frozen=True)
class DecodeConfig(Checked):
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
        super().__post_init__()
        if self.sampling is not None and self.beam > 1:
            raise SettingError("beam", self.beam, "must be 1 when sampling (a token drawn a step)")

    def min_len_cut(self) -> float | None:
        """The longest source (tokens, ``</s>`` aside) whose length limit ``a * |src| + b`` is
        at most ``min_len``, so that its translation ends at the limit instead: ``min_len`` is
        cut to the limit there. ``None``: no source is that short; ``inf``: every one is."""
        a, b, shortest = self.max_len_a, self.max_len_b, 2  # one token and its </s>
        if int(a * shortest + b) > self.min_len:
            return None
        return math.inf if a == 0 else math.ceil((self.min_len + 1 - b) / a) - 2


@dataclass(frozen=True)
class DecodeOptions(Checked):
    """The decoding settings a user gives (``tformer translate``, ``Run.translate``, the
    server's ``/translate``): a beam search, or draws (``sample``), or minimum Bayes risk over
    ``mbr`` candidates; ``alpha`` ``None``: the run's own ``beam_alpha``. A sampling setting
    where nothing is drawn is refused, not ignored; so is an n-best list longer than the beam
    (the search itself ranks more than a beam's)."""

    beam: int = setting(
        5, "Beam size (1: greedy).", flags=("--beam", "-k"), values=Range(1, MAX_BEAM)
    )
    alpha: float | None = setting(
        None,
        "GNMT length penalty: score = log p(Y|X) / ((5+|Y|)/6)^alpha (--engine ctranslate2:"
        " / |Y|^alpha). Default: the (first) run's --beam-alpha, 0.6 unless its training set"
        " another.",
        values=values_of(DecodeConfig, "alpha"),
    )
    nbest: int = setting(
        1,
        "Hypotheses per input (<= beam; with --sample, samples per input): lines"
        " INDEX<TAB>SCORE<TAB>TEXT.",
        values=Range(1, MAX_HYPOTHESES),
    )
    sample: bool = setting(False, "Draw each token from the model instead of searching.")
    temperature: float = setting(
        1.0,
        "Sampling: p^(1/T), renormalised (< 1 sharper, > 1 flatter).",
        values=values_of(SamplingConfig, "temperature"),
    )
    top_k: int | None = setting(
        None,
        "Sampling: keep the k most probable tokens.",
        values=values_of(SamplingConfig, "top_k"),
    )
    top_p: float | None = setting(
        None,
        "Sampling: keep the smallest set of mass >= p (nucleus).",
        values=values_of(SamplingConfig, "top_p"),
    )
    epsilon: float | None = setting(
        None,
        "Sampling: drop tokens of probability < epsilon.",
        values=values_of(SamplingConfig, "epsilon"),
    )
    seed: int = setting(
        0, "Seed of the samples (--sample, --mbr).", values=values_of(DecodeConfig, "seed")
    )
    mbr: int = setting(
        0,
        "Minimum Bayes risk: the candidate of highest expected utility among N samples (or"
        " the beam's N-best, --mbr-from beam). 0: off.",
        values=Range(0, MAX_HYPOTHESES),
    )
    mbr_from: str = setting(
        "sample",
        "Where MBR candidates come from: sample or beam.",
        values=values_of(DecodeConfig, "mbr_from"),
    )
    mbr_utility: str = setting(
        "chrf",
        "MBR utility: chrf (sacrebleu's) or bleu.",
        values=values_of(DecodeConfig, "mbr_utility"),
    )
    min_len: int = setting(
        0,
        "No </s> before this many tokens (at most the length limit).",
        values=Range(0, MAX_LENGTH),
    )
    max_len_a: float = setting(
        1.5, "Output length limit a*|src|+b tokens: a.", values=values_of(DecodeConfig, "max_len_a")
    )
    max_len_b: int = setting(10, "Output length limit: b.", values=Range(0, MAX_LENGTH))

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.draws:
            unset = {f.name: f.default for f in fields(self) if f.name in SAMPLING}
            for name in SAMPLING:
                if (value := getattr(self, name)) != unset[name]:
                    raise SettingError(name, value, "needs {sample} or {mbr} (from samples)")
        if not self.sample and not self.mbr and self.nbest > self.beam:
            raise SettingError("nbest", self.nbest, f"needs {{beam}} >= {self.nbest}")

    @property
    def draws(self) -> bool:
        """Whether tokens are drawn: ``sample``, or MBR over samples."""
        return self.sample or (self.mbr > 0 and self.mbr_from == "sample")

    def search(self, alpha: float) -> DecodeConfig:
        """The search these settings ask for, with the length penalty ``alpha`` (``self.alpha``
        or the run's own)."""
        sampling = SamplingConfig(self.temperature, self.top_k, self.top_p, self.epsilon)
        return DecodeConfig(
            beam=1 if self.draws else self.beam, alpha=alpha, max_len_a=self.max_len_a,
            max_len_b=self.max_len_b, nbest=self.nbest, min_len=self.min_len,
            sampling=sampling if self.draws else None, seed=self.seed, mbr=self.mbr,
            mbr_from=self.mbr_from, mbr_utility=self.mbr_utility,
        )  # fmt: skip


@dataclass(frozen=True)
class TraceOptions(Checked):
    """The step-through search of one text (``Run.trace``, the server's ``/trace``): a beam of
    ``beam``, the ``top`` next tokens of each hypothesis, the length penalty ``alpha`` (``None``:
    the run's own)."""

    beam: int = setting(5, "Beam size.", values=Range(1, MAX_BEAM))
    top: int = setting(5, "Next tokens shown per hypothesis.", values=Range(1))
    alpha: float | None = setting(
        None, "GNMT length penalty.", values=values_of(DecodeConfig, "alpha")
    )

    def search(self, alpha: float) -> DecodeConfig:
        """The traced beam search, its n-best the whole beam."""
        return DecodeConfig(beam=self.beam, alpha=alpha, nbest=self.beam)
