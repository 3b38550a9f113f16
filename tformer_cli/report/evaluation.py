"""Translation quality and the ``tformer eval`` report: sacrebleu BLEU/chrF of greedy and beam
outputs, teacher-forced cross-entropy, perplexity and accuracy, and the exposure-bias sections
(``exposure.py``; definitions in the design note EXPOSURE_BIAS.md).

``evaluate`` computes an ``EvalReport`` (frozen dataclasses, one per section; ``None`` where a
metric has no defined value) that ``dataclasses.asdict`` turns into the ``--json`` file and
``render_report`` into rich tables. ``evaluate_run`` also keeps each result, with both searches'
outputs, in ``RUN/evals/<key>.json`` (``StoredEval``), keyed by what the numbers depend on
(``EvalRequest``: the model file's bytes, the data, split, limit and settings), so that
`tformer runs` shows test BLEU and `tformer compare` reuses a current result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from datasets import concatenate_datasets
from rich.console import Console, Group, RenderableType
from rich.text import Text
from tokenizers import Tokenizer
from torch import nn

from tformer_cli import __version__
from tformer_cli.checkpoint import RunConfig, load_run, resolve_run, shared_tokenizer
from tformer_cli.config import DecodeConfig
from tformer_cli.console import make_progress
from tformer_cli.data.corpus import (
    CARVED,
    FILES,
    PARALLEL_FILES,
    SPLITS,
    absolute_data,
    load_corpus,
)
from tformer_cli.data.tokenizer import UNK_ID, decode, encode
from tformer_cli.decode.search import Models
from tformer_cli.decode.translate import Batching, describe, translate_sources
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
    ensemble: Ensemble | None = None  # with other runs: the ensemble's searches


@dataclass(frozen=True)
class Ensemble:
    """The searches of an ensemble (this run and ``others``: the mean of their next-token
    probabilities), on the same data and settings as the run's own."""

    runs: list[str]
    greedy: Search
    beam: Search | None


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
    method: str = "",
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
        method,
    )  # fmt: skip


Progress = Callable[[str, int], None]  # (stage, sentences done); n = 0 when a stage starts


def search_pass(
    models: Models,
    tokenizer: Tokenizer,
    data: EvalData,
    dc: DecodeConfig,
    cfg: EvalConfig,
    compile: str,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[Search, list[str]]:
    """One search over ``data`` (``dc``: greedy, beam, sampling or MBR), scored, and its texts."""
    begin = time.perf_counter()
    out = translate_sources(
        models, tokenizer, data.src, dataclasses.replace(dc, nbest=1), Batching(cfg.max_tokens),
        on_batch=on_batch, compile=compile,
    )  # fmt: skip
    tokens = [r.hypotheses[0].tokens for _, r in out]  # without </s>
    texts = [t[0] for t, _ in out]
    seconds = time.perf_counter() - begin
    return search_scores(dc.beam, tokens, texts, data.refs, seconds, describe(dc)), texts


def greedy_of(cfg: EvalConfig) -> DecodeConfig:
    """The greedy search that shares ``cfg.search``'s length limits."""
    return dataclasses.replace(cfg.search, beam=1, sampling=None, mbr=0)


def ensemble_scores(
    models: list[nn.Module], tokenizer: Tokenizer, data: EvalData, cfg: EvalConfig, compile: str
) -> Ensemble:
    """Greedy and (if any) the second search of an ensemble of ``models``."""
    greedy, _ = search_pass(models, tokenizer, data, greedy_of(cfg), cfg, compile)
    second = cfg.search != greedy_of(cfg)
    beam = search_pass(models, tokenizer, data, cfg.search, cfg, compile)[0] if second else None
    return Ensemble([], greedy, beam)


@dataclass(frozen=True)
class Outputs:
    """Each search's detokenized outputs, one per evaluated pair, in order."""

    greedy: list[str]
    beam: list[str] | None  # None when cfg.search.beam == 1


def evaluate(
    model: nn.Module,
    tokenizer: Tokenizer,
    data: EvalData,
    cfg: EvalConfig = EvalConfig(),
    source: EvalSource = EvalSource(),
    skipped: int = 0,
    on_progress: Progress | None = None,
    on_outputs: Callable[[Outputs], None] | None = None,
    compile: str = "auto",
) -> tuple[EvalReport, list[str]]:
    """Every metric of the report, and the hypotheses (beam if ``cfg.search.beam > 1``, else
    greedy); ``on_outputs`` receives both searches' outputs.

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

    start = time.perf_counter()
    greedy, greedy_text = search_pass(
        model, tokenizer, data, greedy_of(cfg), cfg, compile, stage("greedy")
    )
    beam, beam_text = None, None
    if cfg.search != greedy_of(cfg):  # beam, sampling or MBR besides greedy
        on_batch = stage(describe(cfg.search))
        beam, beam_text = search_pass(model, tokenizer, data, cfg.search, cfg, compile, on_batch)

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
    beam_s = None if beam is None else beam.seconds
    timing = Timing(end - start, greedy.seconds, beam_s, t_scoring - t_tf, end - t_scoring)
    if on_outputs is not None:
        on_outputs(Outputs(greedy_text, beam_text))
    return EvalReport(**sections, timing=timing), beam_text or greedy_text


def report_json(report: EvalReport) -> str:
    """The report as JSON: every number with the settings that produced it."""
    return json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- stored results
EVALS = "evals"  # RUN/evals/<key>.json: each `tformer eval` result, with its outputs
DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.qint8: "int8"}


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB pieces."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for piece in iter(lambda: f.read(1 << 20), b""):
                digest.update(piece)
    except OSError as e:
        raise TformerError(f"cannot read {path}: {e.strerror or e}") from None
    return digest.hexdigest()


@dataclass(frozen=True)
class EvalRequest:
    """What an evaluation's numbers depend on, so what its stored result is keyed by: the
    weights (SHA-256 of model.pt), the data (spec, languages, plain files, and the run's seed,
    which carves missing splits), split, limit, precision, device type and every ``EvalConfig``
    setting (search, prefix-noise levels and seed). Thread count and batch order do not change
    the numbers beyond float rounding, and are left out."""

    model_sha256: str
    data: str
    files: tuple[str | None, ...]  # the run's --src-file/--tgt-file/--valid-*-file, if it used them
    src_lang: str | None
    tgt_lang: str | None
    seed: int
    split: str
    limit: int | None
    precision: str  # fp32, bf16 (the autocast dtype asked for) or int8
    device: str  # cpu, cuda or mps
    config: EvalConfig

    @property
    def key(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def eval_request(
    run_dir: Path,
    config: RunConfig,
    *,
    data: str | None,
    src_lang: str | None,
    tgt_lang: str | None,
    split: str,
    limit: int | None,
    cfg: EvalConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    src_file: Path | None = None,
    tgt_file: Path | None = None,
) -> EvalRequest:
    """The request of evaluating ``run_dir`` as ``evaluate_run`` does (default data and
    languages: the run's own; ``src_file``/``tgt_file``: those pairs); hashes model.pt."""
    train = config.train
    if src_file is not None and tgt_file is not None:
        spec, files = FILES, tuple(str(Path(f).resolve()) for f in (src_file, tgt_file))
    elif data is None:
        spec, files = train.data, tuple(getattr(train, name) for name in PARALLEL_FILES)
    else:
        spec, files = absolute_data(data), ()
    return EvalRequest(
        file_sha256(run_dir / "model.pt"),
        spec,
        files if any(files) else (),
        src_lang or train.src_lang,
        tgt_lang or train.tgt_lang,
        train.seed,
        split,
        limit,
        "fp32" if dtype is None else DTYPE_KEYS.get(dtype, str(dtype)),
        device.type,
        cfg,
    )


@dataclass(frozen=True)
class StoredEval:
    """A kept evaluation, ``RUN/evals/<key>.json``: the request, the report as ``--json``
    writes it, and the outputs with their references (pairs longer than the model's positions
    left out), so that paired significance tests need no new decoding."""

    key: str
    request: dict[str, Any]  # EvalRequest as JSON
    created: str  # local time, ISO 8601
    report: dict[str, Any]
    greedy: list[str]
    beam: list[str] | None
    refs: list[str]

    @property
    def model_sha256(self) -> str:
        return str(self.request.get("model_sha256", ""))


def stored_eval_path(run_dir: Path, key: str) -> Path:
    return run_dir / EVALS / f"{key}.json"


def keep_eval(run_dir: Path, stored: StoredEval) -> Path:
    """Write ``stored`` to ``RUN/evals/<key>.json`` atomically (cheap to remake: not synced)."""
    path = stored_eval_path(run_dir, stored.key)
    text = json.dumps(dataclasses.asdict(stored), ensure_ascii=False) + "\n"
    atomic_write_text(path, text, durable=False)
    return path


def read_stored_eval(path: Path) -> StoredEval | None:
    """A stored evaluation, or ``None`` when the file is missing, unreadable or not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        stored = StoredEval(**raw)
        texts = [stored.greedy, stored.refs, *([stored.beam] if stored.beam is not None else [])]
        lists = all(isinstance(t, list) and len(t) == len(stored.refs) for t in texts)
        if not (lists and isinstance(stored.request, dict) and isinstance(stored.report, dict)):
            return None
        datetime.fromisoformat(stored.created)
        return stored
    except (OSError, ValueError, TypeError):  # missing, not UTF-8 or JSON, other fields
        return None


def stored_evals(run_dir: Path) -> list[StoredEval]:
    """Every readable stored evaluation of a run, newest first."""
    found = [read_stored_eval(p) for p in sorted((run_dir / EVALS).glob("*.json"))]
    kept = [s for s in found if s is not None]
    return sorted(kept, key=lambda s: datetime.fromisoformat(s.created).timestamp(), reverse=True)


def load_stored_eval(run_dir: Path, request: EvalRequest) -> StoredEval | None:
    """The stored result of exactly ``request`` (so of the current model.pt), if kept."""
    stored = read_stored_eval(stored_eval_path(run_dir, request.key))
    if stored is None or stored.key != request.key:
        return None
    return stored if stored.model_sha256 == request.model_sha256 else None


def evaluate_run(
    model_dir: Path | None,
    *,
    data: str | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_file: Path | None = None,
    tgt_file: Path | None = None,
    split: str = "test",
    limit: int | None = None,
    cfg: EvalConfig = EvalConfig(),
    device: str = "auto",
    precision: str | None = None,
    json_path: Path | None = None,
    hyp_path: Path | None = None,
    threads: int = 0,
    compile: str = "auto",
    ensemble_with: Sequence[Path] = (),
    console: Console | None = None,
    quiet: bool = False,
    store: bool = True,
    on_result: Callable[[StoredEval], None] | None = None,
) -> EvalReport:
    """``tformer eval``: load a run and a split (default: the run's own data, same seed, so the
    same carved splits; ``src_file``/``tgt_file``: every pair of two plain parallel files, in
    order), evaluate, and write ``json_path`` and ``hyp_path`` if given.
    ``threads``: torch CPU threads; 0: ``$TFORMER_THREADS`` if set, else ``free_cores()``;
    ``compile``: how the decode step runs (``DecodeStep``); ``ensemble_with``: other runs
    (sharing this one's tokenizer) whose ensemble with it is scored too, greedy and the second
    search (``EvalReport.ensemble``; such a report is not kept in the run folder).

    With ``store`` the result is also kept in ``RUN/evals/<key>.json`` (``StoredEval``; a run
    folder that cannot be written gets a note, not an error); ``on_result`` receives it."""
    if split not in (*SPLITS, "all"):
        raise TformerError(f"unknown split {split!r}: use train, valid, test or all")
    start, log = time.perf_counter(), console or Console(stderr=True)
    run_dir = resolve_run(model_dir)
    train = RunConfig.load(run_dir).train
    run = load_run(run_dir, device, precision or train.precision, compile)
    setup_threads()  # $TFORMER_THREADS if set; then --threads, else the idle cores
    if threads or not os.environ.get("TFORMER_THREADS"):
        torch.set_num_threads(threads or free_cores())
    src_lang, tgt_lang = src_lang or train.src_lang, tgt_lang or train.tgt_lang
    files: dict[str, str | Path | None] = {}
    if src_file is not None or tgt_file is not None:  # exactly these pairs, in their order
        if data is not None:
            raise TformerError("give --data or --src-file/--tgt-file, not both")
        data_spec, split, files = FILES, "all", {"src_file": src_file, "tgt_file": tgt_file}
    elif data is None:  # the run's own data, its parallel files included
        data_spec, files = train.data, {name: getattr(train, name) for name in PARALLEL_FILES}
    else:
        data_spec = data
    if split == "all":  # every pair the data holds, in its order: nothing carved out
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, carve=False, **files)
        pairs = concatenate_datasets([ds[name] for name in SPLITS if name in ds])
    else:  # the run's seed carves the same valid/test splits as in training
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, seed=train.seed, **files)
        pairs = ds[split]
        if data is not None and pairs.info.description == CARVED and not quiet:
            log.print(
                f"note: {data} has no {split} split: scoring the {len(pairs)} pairs carved from"
                " it with the run's seed; --split all scores every pair",
                markup=False,
            )
    pairs = pairs.select(range(min(limit, len(pairs)))) if limit is not None else pairs
    request = eval_request(
        run_dir, run.config, data=data, src_lang=src_lang, tgt_lang=tgt_lang, split=split,
        limit=limit, cfg=cfg, device=run.device, dtype=run.dtype, src_file=src_file,
        tgt_file=tgt_file,
    )  # fmt: skip
    src, tgt = encode(run.tokenizer, pairs["src"]), encode(run.tokenizer, pairs["tgt"])
    longest = run.config.model.max_positions - 1  # room for </s> (source) or <s> (target)
    keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) <= longest]
    refs = list(pairs["tgt"])
    eval_data = EvalData([src[i] for i in keep], [tgt[i] for i in keep], [refs[i] for i in keep])
    if src_file is not None:
        data_spec = f"{src_file} + {tgt_file}"  # what the report names
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
    outputs: list[Outputs] = []
    with make_progress("eval", log, disable=quiet) as bar:
        task = bar.add_task("eval", total=n * (3 if cfg.search.beam > 1 else 2), info="")
        with inference(run.device, run.dtype):
            report, hyps = evaluate(
                run.model, run.tokenizer, eval_data, cfg, source, len(src) - n,
                on_progress=lambda stage, k: bar.update(task, advance=k, info=stage),
                on_outputs=outputs.append, compile=run.compile,
            )  # fmt: skip
    timing = dataclasses.replace(report.timing, total=report.timing.total + load, load=load)
    report = dataclasses.replace(report, timing=timing)
    if ensemble_with:
        others = [load_run(m, device, precision or train.precision, compile) for m in ensemble_with]
        shared_tokenizer([run, *others])
        models = [run.model, *(o.model for o in others)]
        with inference(run.device, run.dtype):
            scores = ensemble_scores(models, run.tokenizer, eval_data, cfg, run.compile)
        names = [str(r.run_dir) for r in (run, *others)]
        report = dataclasses.replace(report, ensemble=dataclasses.replace(scores, runs=names))
        store = False
    stored = StoredEval(
        request.key, json.loads(json.dumps(dataclasses.asdict(request))),
        datetime.now().astimezone().isoformat(timespec="seconds"),
        json.loads(report_json(report)), outputs[0].greedy, outputs[0].beam, eval_data.refs,
    )  # fmt: skip
    if store:
        try:
            keep_eval(run_dir, stored)
        except TformerError as e:  # a read-only run folder: the report itself still stands
            if not quiet:
                log.print(f"note: the result was not kept in the run folder: {e}", markup=False)
    if on_result is not None:
        on_result(stored)
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
    second = r.beam.method if r.beam is not None else ""
    search = "greedy only" if r.beam is None else f"greedy and {second or f'beam {r.beam.beam}'}"
    if r.config.search.beam > 1 and r.config.search.sampling is None:
        search += f", alpha {r.config.search.alpha}"
    head = Text.assemble(
        ("tformer eval  ", "bold"),
        f"run {s.run} | data {s.data}:{s.split}{limit} | {s.device} {s.precision}{threads}"
        f" | {search}",
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
        tf,
        quality,
        gap,
        *render_accumulation(r.accumulation),
        render_prefix_noise(r.prefix_noise),
        render_length_decay(r.length_decay),
        footer,
        *([] if r.ensemble is None else [render_ensemble(r.ensemble)]),
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
