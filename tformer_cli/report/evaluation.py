"""`tformer eval`'s report: sacrebleu BLEU/chrF of greedy and beam outputs, teacher-forced
cross-entropy, perplexity and accuracy, and the exposure-bias sections (``exposure.py``,
docs/exposure_bias.md). ``evaluate_split`` computes an ``EvalReport`` (``None``: no defined
value), ``to_dict`` makes it ``--json``, ``render_report`` rich tables."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sacrebleu
import torch
from rich.console import Group, RenderableType
from rich.text import Text
from tokenizers import Tokenizer
from torch import nn

from tformer_cli import __version__
from tformer_cli.config import DecodeConfig
from tformer_cli.data.split import Split
from tformer_cli.data.tokenizer import UNK_ID, decode
from tformer_cli.decode.search import Models
from tformer_cli.decode.translate import Batching, SourcesEngine, describe, translate_sources
from tformer_cli.device import autocast
from tformer_cli.errors import TformerError
from tformer_cli.model import Transformer
from tformer_cli.report.exposure import (
    Accumulation,
    ForcedPass,
    LengthDecay,
    NoiseLevel,
    PrefixNoise,
    accumulation,
    fmt,
    forced_pass,
    gold_io,
    length_decay,
    noise_level,
    noisy_inputs,
    pct,
    prefix_noise,
    ratio,
    render_accumulation,
    render_length_decay,
    render_prefix_noise,
    self_injected_inputs,
    table,
    tf_argmax_tokens,
)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenization, cased) of detokenized text."""
    return corpus_bleu(hypotheses, references)[0]


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> tuple[float, str]:
    """sacrebleu BLEU (defaults) and its signature; ``force``: the toy corpus spaces its
    punctuation on purpose, so the "forgot to detokenize?" warning would be noise."""
    b = sacrebleu.BLEU(force=True)
    return b.corpus_score(list(hyps), [list(refs)]).score, str(b.get_signature())


def teacher_forced(
    model: Transformer,
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    max_tokens: int = 4096,
    dtype: torch.dtype | None = None,
) -> TFMetrics:
    """tf_xent, tf_ppl and tf_acc: the clean pass of ``tformer eval``, which validation shares."""
    inputs, gold = gold_io(tgt)
    with autocast(next(model.parameters()).device, dtype):
        return tf_metrics(forced_pass(model, src, inputs, gold, max_tokens), gold)


def tf_metrics(clean: ForcedPass, gold: Sequence[Sequence[int]]) -> TFMetrics:
    """Section 1 from the clean pass: its mean NLL of the gold tokens and argmax accuracy."""
    pairs = zip(clean.preds, gold, strict=True)
    right = sum(a == g for p, y in pairs for a, g in zip(p, y, strict=True))
    n = max(clean.tokens, 1)
    return TFMetrics(clean.nll / n, math.exp(min(clean.nll / n, 100.0)), right / n, clean.tokens)


# ---------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class EvalConfig:
    """How the report is computed: ``search``, the second search (``beam = 1``: greedy only,
    whose length limits it shares); ``noise``, the prefix-noise levels besides ``q = 0``."""

    search: DecodeConfig = field(default_factory=lambda: DecodeConfig(beam=5))
    seed: int = 1234
    noise: tuple[float, ...] = (0.1, 0.25)
    max_tokens: int = 4096


@dataclass(frozen=True)
class EvalSource:
    """What was evaluated: the run, the data and where it ran."""

    run: str | None = None
    data: str | None = None
    split: str | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    limit: int | None = None
    device: str | None = None
    precision: str | None = None  # in effect: fp32, tf32 or bf16 autocast (precision_name)
    threads: int | None = None  # torch CPU threads
    version: str = __version__
    engine: str = "torch"  # what ran the searches; the teacher-forced passes run on torch


@dataclass(frozen=True)
class TFMetrics:
    """Section 1, over every target token, ``</s>`` included."""

    xent: float
    ppl: float
    acc: float
    tokens: int


@dataclass(frozen=True)
class Search:
    """Section 2: one search's outputs scored by sacrebleu on detokenized text (``<unk>`` pieces
    dropped, as ``tformer translate`` prints it); ``unk``: the ``<unk>`` tokens generated,
    ``unk_rate`` their share (``</s>`` not counted)."""

    beam: int
    bleu: float
    bleu_signature: str
    chrf: float
    chrf_signature: str
    exact_match: float | None
    sentences: int
    unk: int
    unk_rate: float | None
    seconds: float = field(compare=False)
    method: str = ""  # what the search was (``describe``): greedy, beam 5, sampling, MBR...


@dataclass(frozen=True)
class ExposureGap:
    """Section 3: ``bleu_gap = tf_bleu - greedy_bleu`` (BLEU points)."""

    tf_bleu: float
    greedy_bleu: float
    bleu_gap: float


@dataclass(frozen=True)
class Sizes:
    """Sample sizes; pairs too long for the model's positions are skipped, and counted."""

    sentences: int
    source_tokens: int
    target_tokens: int  # with </s>: the positions of the TF metrics
    skipped_too_long: int


@dataclass(frozen=True)
class Timing:
    """Seconds per stage, ``total`` their sum; ``load`` (``evaluate_run``): the run and the data."""

    total: float
    greedy: float
    beam: float | None
    teacher_forced: float  # the clean, self-injected and prefix-noise passes
    scoring: float
    load: float | None = None


@dataclass(frozen=True)
class EvalReport:
    """Everything ``tformer eval`` prints, section by section; ``None``: no defined value."""

    source: EvalSource
    config: EvalConfig
    sizes: Sizes
    tf: TFMetrics
    greedy: Search
    beam: Search | None  # None when --beam 1 (then greedy is the only search)
    exposure_gap: ExposureGap
    accumulation: Accumulation
    prefix_noise: PrefixNoise
    length_decay: LengthDecay
    timing: Timing = field(compare=False)
    ensemble: Ensemble | None = None  # with other runs: the ensemble's searches

    def to_dict(self) -> dict[str, Any]:
        """Every section as plain dicts, lists, strings and numbers, as ``--json`` writes them."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


@dataclass(frozen=True)
class Ensemble:
    """The searches of an ensemble (the mean of its runs' next-token probabilities)."""

    runs: list[str]
    greedy: Search
    beam: Search | None


Progress = Callable[[str, int], None]  # (stage, sentences done); n = 0 when a stage starts
SearchTexts = tuple[Search, list[str]]  # a search's scores and its texts


def search_pass(
    models: Models,
    tokenizer: Tokenizer,
    data: Split,
    dc: DecodeConfig,
    cfg: EvalConfig,
    compile: str,
    on_batch: Callable[[int], None] | None = None,
    engine: SourcesEngine | None = None,
) -> SearchTexts:
    """One search over ``data`` (``dc``: greedy, beam, sampling or MBR) and its texts: corpus
    BLEU and chrF, the outputs equal to their reference (whitespace-normalised), the ``<unk>``
    generated. ``tokenizer``: the target side's; ``engine``: what searches (default: ``models``)."""
    begin = time.perf_counter()
    translate = engine or functools.partial(translate_sources, models, compile=compile)
    out = translate(
        tokenizer, data.src, dataclasses.replace(dc, nbest=1), Batching(cfg.max_tokens),
        on_batch=on_batch, first=1,
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    tokens = [r.hypotheses[0].tokens for _, r in out]  # without </s>
    texts, refs = [t[0] for t, _ in out], data.refs
    chrf = sacrebleu.CHRF()
    bleu_score, bleu_sig = corpus_bleu(texts, refs)
    same = sum(h.split() == r.split() for h, r in zip(texts, refs, strict=True))
    unk = sum(list(seq).count(UNK_ID) for seq in tokens)
    search = Search(
        dc.beam, bleu_score, bleu_sig, chrf.corpus_score(texts, [list(refs)]).score,
        str(chrf.get_signature()), ratio(same, len(refs)), len(refs), unk,
        ratio(unk, sum(map(len, tokens))), seconds, describe(dc),
    )  # fmt: skip
    return search, texts


def run_searches(
    models: Models,
    tokenizer: Tokenizer,
    data: Split,
    cfg: EvalConfig,
    compile: str,
    stage: Callable[[str], Callable[[int], None] | None] = lambda name: None,
    engine: SourcesEngine | None = None,
) -> tuple[SearchTexts, SearchTexts | None]:
    """Greedy, then ``cfg.search`` if it is another; ``stage`` names each and gives its callback."""
    greedy = dataclasses.replace(cfg.search, beam=1, sampling=None, mbr=0)  # same length limits
    first = search_pass(models, tokenizer, data, greedy, cfg, compile, stage("greedy"), engine)
    if cfg.search == greedy:
        return first, None
    on_batch = stage(describe(cfg.search))
    return first, search_pass(models, tokenizer, data, cfg.search, cfg, compile, on_batch, engine)


@dataclass(frozen=True)
class Outputs:
    """Each search's detokenized outputs, one per evaluated pair, in order."""

    greedy: list[str]
    beam: list[str] | None  # None when cfg.search.beam == 1

    @property
    def hypotheses(self) -> list[str]:
        """The report's hypotheses: the second search's, else greedy's."""
        return self.beam or self.greedy


def teacher_forced_passes(
    model: nn.Module, data: Split, cfg: EvalConfig
) -> tuple[list[list[int]], ForcedPass, ForcedPass, list[NoiseLevel]]:
    """The gold targets and the report's teacher-forced passes: clean, self-injected (the clean
    pass's predictions as input), and the prefix-noise levels (``q = 0`` is the clean pass)."""
    inputs, gold = gold_io(data.tgt)
    clean = forced_pass(model, data.src, inputs, gold, cfg.max_tokens)
    injected = forced_pass(
        model, data.src, self_injected_inputs(clean.preds), gold, cfg.max_tokens, score=False
    )
    levels = [noise_level(0.0, gold, clean.preds, clean.preds, [[False] * len(g) for g in gold])]
    for q in cfg.noise:
        noisy, replaced = noisy_inputs(inputs, q, model.cfg.vocab_size, cfg.seed)
        preds = forced_pass(model, data.src, noisy, gold, cfg.max_tokens, score=False).preds
        levels.append(noise_level(q, gold, clean.preds, preds, replaced))
    return gold, clean, injected, levels


def evaluate_split(
    model: nn.Module,
    tokenizer: Tokenizer,
    data: Split,
    cfg: EvalConfig = EvalConfig(),
    source: EvalSource = EvalSource(),
    skipped: int = 0,
    on_progress: Progress | None = None,
    compile: str = "auto",
    engine: SourcesEngine | None = None,
) -> tuple[EvalReport, Outputs]:
    """Every metric of the report, and both searches' outputs. ``tokenizer``: the target
    side's; ``engine``: what runs the searches (default: ``model``); the teacher-forced passes
    always run ``model``. The caller sets the device, the precision and inference mode."""
    if not data.src:
        raise TformerError("nothing to evaluate: the data holds no sentence pairs")

    def stage(name: str) -> Callable[[int], None] | None:
        if on_progress is None:
            return None
        on_progress(name, 0)
        return lambda n: on_progress(name, n)

    start = time.perf_counter()
    searches = run_searches(model, tokenizer, data, cfg, compile, stage, engine)
    (greedy, greedy_text), (beam, beam_text) = searches[0], searches[1] or (None, None)

    t_tf = time.perf_counter()
    done = stage("teacher forcing")
    gold, clean, injected, levels = teacher_forced_passes(model, data, cfg)
    if done is not None:
        done(len(data.src))

    t_scoring = time.perf_counter()
    tf_text = decode(tokenizer, tf_argmax_tokens(clean.preds))
    tf_bleu = corpus_bleu(tf_text, data.refs)[0]
    sections = dict(
        source=source,
        config=cfg,
        sizes=Sizes(len(data.src), sum(map(len, data.src)), clean.tokens, skipped),
        tf=tf_metrics(clean, gold),
        greedy=greedy,
        beam=beam,
        exposure_gap=ExposureGap(tf_bleu, greedy.bleu, tf_bleu - greedy.bleu),
        accumulation=accumulation(gold, clean.preds, injected.preds),
        prefix_noise=prefix_noise(cfg.seed, levels),
        length_decay=length_decay(list(map(len, data.tgt)), data.refs, greedy_text, tf_text),
    )
    end = time.perf_counter()
    beam_s = None if beam is None else beam.seconds
    timing = Timing(end - start, greedy.seconds, beam_s, t_scoring - t_tf, end - t_scoring)
    return EvalReport(**sections, timing=timing), Outputs(greedy_text, beam_text)


def report_json(report: EvalReport) -> str:
    """The report as ``--json`` writes it."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- rendering
def counted(n: int, noun: str) -> str:
    """``1 pair``, ``2 pairs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render_report(r: EvalReport) -> Group:
    """The report as rich tables, in the order of docs/exposure_bias.md."""
    s, g = r.source, r.exposure_gap
    limit = f" (first {s.limit})" if s.limit is not None else ""
    threads = f", {counted(s.threads, 'CPU thread')}" if s.device == "cpu" else ""
    second = r.beam.method if r.beam is not None else ""
    search = "greedy only" if r.beam is None else f"greedy and {second or f'beam {r.beam.beam}'}"
    if r.config.search.beam > 1 and r.config.search.sampling is None:
        search += f", alpha {r.config.search.alpha}"
    engine = f" | engine {s.engine}" if s.engine != "torch" else ""
    head = Text.assemble(
        ("tformer eval  ", "bold"),
        f"run {s.run} | data {s.data}:{s.split}{limit} | {s.device} {s.precision}{threads}"
        f" | {search}{engine}",
    )
    searches = [x for x in (r.greedy, r.beam) if x is not None]
    quality = table(
        "2. Free running (sacrebleu on detokenized text)",
        ["", *(x.method or ("greedy" if x.beam == 1 else f"beam {x.beam}") for x in searches)],
        [
            ["BLEU", *(fmt(x.bleu) for x in searches)],
            ["chrF", *(fmt(x.chrf) for x in searches)],
            ["exact match", *(pct(x.exact_match, ".1f") for x in searches)],
            ["<unk> generated", *(f"{x.unk} ({pct(x.unk_rate)})" for x in searches)],
        ],
        f"BLEU signature: {r.greedy.bleu_signature}\nchrF signature: {r.greedy.chrf_signature}"
        "\n<unk> tokens are dropped from the text before scoring, as `tformer translate` drops"
        " them" + engine_note(s.engine),
    )
    tf = table(
        "1. Teacher forcing (gold prefix)",
        ["tf_xent", "tf_ppl", "tf_acc", "target tokens (with </s>)"],
        [[fmt(r.tf.xent, ".4f"), fmt(r.tf.ppl), pct(r.tf.acc), str(r.tf.tokens)]],
        labels=False,
    )
    gap = table(
        "3. Exposure gap in BLEU",
        ["tf_bleu", "greedy BLEU", "bleu_gap"],
        [[fmt(g.tf_bleu), fmt(g.greedy_bleu), fmt(g.bleu_gap, "+.2f")]],
        "tf_bleu: BLEU of the teacher-forced argmax tokens (one per reference position, </s>"
        " removed); bleu_gap = tf_bleu - greedy BLEU",
        labels=False,
    )
    z, t = r.sizes, r.timing
    beam_time = f" beam {t.beam:.1f} s," if t.beam is not None else ""
    footer = Text(
        f"sample: {counted(z.sentences, 'sentence')}, {z.source_tokens} source tokens,"
        f" {z.target_tokens} target tokens (with </s>); {counted(z.skipped_too_long, 'pair')}"
        f" skipped (longer than the model's positions)\ntime: {t.total:.1f} s"
        f" (load {fmt(t.load, '.1f')} s, greedy {t.greedy:.1f} s,{beam_time}"
        f" teacher-forced passes {t.teacher_forced:.1f} s, scoring {t.scoring:.1f} s)"
    )
    return Group(
        head,
        tf,
        quality,
        gap,
        *render_accumulation(r.accumulation),
        render_prefix_noise(r.prefix_noise),
        render_length_decay(r.length_decay),
        footer,
        *([] if r.ensemble is None else [render_ensemble(r.ensemble)]),
    )


def engine_note(engine: str) -> str:
    """Where the report's numbers come from when another engine ran the searches."""
    if engine == "torch":
        return ""
    return (
        f"\nsearches run on {engine} (its beam divides by |Y|^alpha, not GNMT's"
        " ((5+|Y|)/6)^alpha); the teacher-forced and exposure-bias sections (1, 3-6) run on"
        " torch"
    )


def render_ensemble(e: Ensemble) -> RenderableType:
    """The ensemble's BLEU and chrF beside the searches' names."""
    searches = [x for x in (e.greedy, e.beam) if x is not None]
    return table(
        f"Ensemble of {len(e.runs)} runs (mean of next-token probabilities)",
        ["", *(x.method for x in searches)],
        [["BLEU", *(fmt(x.bleu) for x in searches)], ["chrF", *(fmt(x.chrf) for x in searches)]],
        "runs: " + ", ".join(e.runs),
    )
