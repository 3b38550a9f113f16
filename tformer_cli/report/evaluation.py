"""Translation quality and the ``tformer eval`` report: sacrebleu BLEU/chrF of greedy and beam
outputs, teacher-forced cross-entropy, perplexity and accuracy, and the exposure-bias sections
(``exposure.py``; definitions in the design note EXPOSURE_BIAS.md).

``evaluate`` computes an ``EvalReport`` (frozen dataclasses, one per section; ``None`` where a
metric has no defined value) that ``dataclasses.asdict`` turns into the ``--json`` file and
``render_report`` into rich tables.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu
import torch
from datasets import concatenate_datasets
from rich.console import Console, Group
from rich.text import Text
from tokenizers import Tokenizer
from torch import nn

from tformer_cli import __version__
from tformer_cli.checkpoint import RunConfig, load_run, resolve_run
from tformer_cli.config import DecodeConfig
from tformer_cli.console import make_progress
from tformer_cli.data.corpus import CARVED, SPLITS, load_corpus
from tformer_cli.data.tokenizer import UNK_ID, decode, encode
from tformer_cli.decode.search import translate_ids
from tformer_cli.device import autocast, free_cores, inference, precision_name, setup_threads
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.model import Transformer
from tformer_cli.report.exposure import (
    Accumulation,
    LengthDecay,
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
    """sacrebleu BLEU (defaults) and its signature. ``force``: the toy corpus spaces its
    punctuation on purpose, so sacrebleu's "forgot to detokenize?" warning would be noise."""
    b = sacrebleu.BLEU(force=True)
    return b.corpus_score(list(hyps), [list(refs)]).score, str(b.get_signature())


@dataclass(frozen=True)
class TeacherForced:
    """Mean NLL of each gold token given the gold prefix, and the argmax accuracy."""

    xent: float
    accuracy: float
    tokens: int

    @property
    def ppl(self) -> float:
        return math.exp(min(self.xent, 100.0))


def teacher_forced(
    model: Transformer,
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    max_tokens: int = 4096,
    dtype: torch.dtype | None = None,
) -> TeacherForced:
    """tf_xent, tf_ppl and tf_acc over every target token, ``</s>`` included: the clean pass
    of ``tformer eval`` (so validation accuracy and the report's tf_acc agree)."""
    device = next(model.parameters()).device
    inputs, gold = gold_io(tgt)
    with autocast(device, dtype):
        clean = forced_pass(model, src, inputs, gold, max_tokens)
    right = sum(
        a == g for p, y in zip(clean.preds, gold, strict=True) for a, g in zip(p, y, strict=True)
    )
    n = max(clean.tokens, 1)
    return TeacherForced(clean.nll / n, right / n, clean.tokens)


# ---------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class EvalConfig:
    """How the report is computed: ``search`` for the beam pass (greedy shares its length
    limits; ``beam = 1`` runs greedy only); ``noise``, the prefix-noise levels besides ``q = 0``."""

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


@dataclass(frozen=True)
class TFMetrics:
    """Section 1, over every target token, ``</s>`` included."""

    xent: float | None
    ppl: float | None
    acc: float | None
    tokens: int


@dataclass(frozen=True)
class Search:
    """Section 2: one search's outputs scored by sacrebleu (detokenized text, as ``tformer
    translate`` prints it: ``<unk>`` pieces dropped). ``unk``: the ``<unk>`` tokens the search
    generated; ``unk_rate``: their share of its tokens (``</s>`` not counted)."""

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
    """Seconds per stage; ``total`` is the sum. ``load`` (the run, the data, tokenizing) is
    set by ``evaluate_run``; ``evaluate`` alone leaves it ``None``."""

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


@dataclass(frozen=True)
class EvalData:
    """Token ids without specials, and the raw reference text."""

    src: list[list[int]]
    tgt: list[list[int]]
    refs: list[str]


def search_scores(
    beam: int,
    tokens: Sequence[Sequence[int]],
    hyps: Sequence[str],
    refs: Sequence[str],
    seconds: float,
) -> Search:
    """Corpus BLEU and chrF of the texts ``hyps`` with their signatures, the share of outputs
    equal to the reference (whitespace-normalised), and the ``<unk>`` count of their ``tokens``."""
    c = sacrebleu.CHRF()
    bleu_score, bleu_sig = corpus_bleu(hyps, refs)
    chrf_score = c.corpus_score(list(hyps), [list(refs)]).score
    same = sum(h.split() == r.split() for h, r in zip(hyps, refs, strict=True))
    unk = sum(list(seq).count(UNK_ID) for seq in tokens)
    return Search(
        beam, bleu_score, bleu_sig, chrf_score, str(c.get_signature()),
        ratio(same, len(refs)), len(refs), unk, ratio(unk, sum(map(len, tokens))), seconds,
    )  # fmt: skip


Progress = Callable[[str, int], None]  # (stage, sentences done); n = 0 when a stage starts


def evaluate(
    model: nn.Module,
    tokenizer: Tokenizer,
    data: EvalData,
    cfg: EvalConfig = EvalConfig(),
    source: EvalSource = EvalSource(),
    skipped: int = 0,
    on_progress: Progress | None = None,
) -> tuple[EvalReport, list[str]]:
    """Every metric of the report, and the hypotheses (beam if ``cfg.search.beam > 1``, else
    greedy).

    Two searches, then four teacher-forced passes: clean (section 1, the TF-argmax sequences of
    section 3 and the predictions ``a_t`` of sections 4-6), self-injected (section 4), and one
    per prefix-noise level (section 5; ``q = 0`` is the clean pass). The caller sets the
    device, the precision (autocast) and inference mode.
    """
    if not data.src:
        raise TformerError("nothing to evaluate: the data holds no sentence pairs")

    def stage(name: str) -> Callable[[int], None] | None:
        if on_progress is None:
            return None
        on_progress(name, 0)
        return lambda n: on_progress(name, n)

    def search(beam: int) -> tuple[list[list[int]], list[str], float]:
        begin = time.perf_counter()
        out = translate_ids(
            model,
            data.src,
            dataclasses.replace(cfg.search, beam=beam, nbest=1),
            cfg.max_tokens,
            on_batch=stage("greedy" if beam == 1 else f"beam {beam}"),
        )
        tokens = [r.hypotheses[0].tokens for r in out]  # without </s>
        return tokens, decode(tokenizer, tokens), time.perf_counter() - begin

    start = time.perf_counter()
    greedy_ids, greedy_text, greedy_s = search(1)
    beam_ids, beam_text, beam_s = (
        search(cfg.search.beam) if cfg.search.beam > 1 else (None, None, None)
    )

    t_tf = time.perf_counter()
    done = stage("teacher forcing")
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
    if done is not None:
        done(len(data.src))

    t_scoring = time.perf_counter()
    tf_text = decode(tokenizer, tf_argmax_tokens(clean.preds))
    greedy = search_scores(1, greedy_ids, greedy_text, data.refs, greedy_s)
    beam = (
        None
        if beam_text is None
        else search_scores(cfg.search.beam, beam_ids, beam_text, data.refs, beam_s)
    )
    tf_bleu = corpus_bleu(tf_text, data.refs)[0]
    xent = ratio(clean.nll, clean.tokens)
    ppl = None if xent is None else math.exp(min(xent, 100.0))
    sections = dict(
        source=source,
        config=cfg,
        sizes=Sizes(len(data.src), sum(map(len, data.src)), clean.tokens, skipped),
        tf=TFMetrics(xent, ppl, levels[0].acc, clean.tokens),
        greedy=greedy,
        beam=beam,
        exposure_gap=ExposureGap(tf_bleu, greedy.bleu, tf_bleu - greedy.bleu),
        accumulation=accumulation(gold, clean.preds, injected.preds),
        prefix_noise=prefix_noise(cfg.seed, levels),
        length_decay=length_decay(list(map(len, data.tgt)), data.refs, greedy_text, tf_text),
    )
    end = time.perf_counter()
    timing = Timing(end - start, greedy_s, beam_s, t_scoring - t_tf, end - t_scoring)
    return EvalReport(**sections, timing=timing), beam_text or greedy_text


def report_json(report: EvalReport) -> str:
    """The report as JSON: every number with the settings that produced it."""
    return json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=False) + "\n"


def evaluate_run(
    model_dir: Path | None,
    *,
    data: str | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    split: str = "test",
    limit: int | None = None,
    cfg: EvalConfig = EvalConfig(),
    device: str = "auto",
    precision: str | None = None,
    json_path: Path | None = None,
    hyp_path: Path | None = None,
    threads: int = 0,
    console: Console | None = None,
    quiet: bool = False,
) -> EvalReport:
    """``tformer eval``: load a run and a split (default: the run's own data, same seed, so the
    same carved splits), evaluate, and write ``json_path`` and ``hyp_path`` if given.
    ``threads``: torch CPU threads; 0: ``$TFORMER_THREADS`` if set, else ``free_cores()``."""
    if split not in (*SPLITS, "all"):
        raise TformerError(f"unknown split {split!r}: use train, valid, test or all")
    start, log = time.perf_counter(), console or Console(stderr=True)
    run_dir = resolve_run(model_dir)
    train = RunConfig.load(run_dir).train
    run = load_run(run_dir, device, precision or train.precision)
    setup_threads()  # $TFORMER_THREADS if set; then --threads, else the idle cores
    if threads or not os.environ.get("TFORMER_THREADS"):
        torch.set_num_threads(threads or free_cores())
    data_spec, src_lang, tgt_lang = (
        data or train.data,
        src_lang or train.src_lang,
        tgt_lang or train.tgt_lang,
    )
    if split == "all":  # every pair the data holds, in its order: nothing carved out
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, carve=False)
        pairs = concatenate_datasets([ds[name] for name in SPLITS if name in ds])
    else:  # the run's seed carves the same valid/test splits as in training
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, seed=train.seed)
        pairs = ds[split]
        if data is not None and pairs.info.description == CARVED and not quiet:
            log.print(
                f"note: {data} has no {split} split: scoring the {len(pairs)} pairs carved from"
                " it with the run's seed; --split all scores every pair",
                markup=False,
            )
    pairs = pairs.select(range(min(limit, len(pairs)))) if limit is not None else pairs
    src, tgt = encode(run.tokenizer, pairs["src"]), encode(run.tokenizer, pairs["tgt"])
    longest = run.config.model.max_positions - 1  # room for </s> (source) or <s> (target)
    keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) <= longest]
    refs = list(pairs["tgt"])
    eval_data = EvalData([src[i] for i in keep], [tgt[i] for i in keep], [refs[i] for i in keep])
    source = EvalSource(
        str(run_dir), str(data_spec), split, src_lang, tgt_lang, limit, str(run.device),
        precision_name(run.device, run.dtype), torch.get_num_threads(),
    )  # fmt: skip
    n = len(keep)
    if src and not n:
        raise TformerError(
            f"nothing to evaluate: every pair ({len(src)}) is longer than the model's"
            f" {longest} tokens"
        )
    load = time.perf_counter() - start
    with make_progress("eval", log, disable=quiet) as bar:
        task = bar.add_task("eval", total=n * (3 if cfg.search.beam > 1 else 2), info="")
        with inference(run.device, run.dtype):
            report, hyps = evaluate(
                run.model, run.tokenizer, eval_data, cfg, source, len(src) - n,
                on_progress=lambda stage, k: bar.update(task, advance=k, info=stage),
            )  # fmt: skip
    timing = dataclasses.replace(report.timing, total=report.timing.total + load, load=load)
    report = dataclasses.replace(report, timing=timing)
    if json_path is not None:
        atomic_write_text(json_path, report_json(report))
    if hyp_path is not None:  # a line per pair, in order: a skipped pair's is empty
        lines = [""] * len(src)
        for i, h in zip(keep, hyps, strict=True):
            lines[i] = h
        atomic_write_text(hyp_path, "".join(f"{line}\n" for line in lines))
    return report


# ---------------------------------------------------------------------------- rendering
def counted(n: int, noun: str) -> str:
    """``1 pair``, ``2 pairs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render_report(r: EvalReport) -> Group:
    """The report as rich tables, in the order of EXPOSURE_BIAS.md (sections 1-6)."""
    s, g = r.source, r.exposure_gap
    limit = f" (first {s.limit})" if s.limit is not None else ""
    threads = f", {counted(s.threads, 'CPU thread')}" if s.device == "cpu" else ""
    beam, alpha = r.config.search.beam, r.config.search.alpha
    search = "greedy only" if beam == 1 else f"beam {beam}, alpha {alpha}"
    head = Text.assemble(
        ("tformer eval  ", "bold"),
        f"run {s.run} | data {s.data}:{s.split}{limit} | {s.device} {s.precision}{threads}"
        f" | {search}",
    )
    searches = [x for x in (r.greedy, r.beam) if x is not None]
    quality = table(
        "1-2. Free running (sacrebleu on detokenized text)",
        ["", *("greedy" if x.beam == 1 else f"beam {x.beam}" for x in searches)],
        [
            ["BLEU", *(fmt(x.bleu) for x in searches)],
            ["chrF", *(fmt(x.chrf) for x in searches)],
            ["exact match", *(pct(x.exact_match, ".1f") for x in searches)],
            ["<unk> generated", *(f"{x.unk} ({pct(x.unk_rate)})" for x in searches)],
        ],
        f"BLEU signature: {r.greedy.bleu_signature}\nchrF signature: {r.greedy.chrf_signature}"
        "\n<unk> tokens are dropped from the text before scoring, as `tformer translate` drops"
        " them",
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
        quality,
        tf,
        gap,
        *render_accumulation(r.accumulation),
        render_prefix_noise(r.prefix_noise),
        render_length_decay(r.length_decay),
        footer,
    )
