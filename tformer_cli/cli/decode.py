"""`tformer translate`, `tformer inspect-attention` and `tformer distill`."""

from __future__ import annotations

import dataclasses
import io
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import typer
from rich.console import Console

from tformer_cli.cli.app import check_engine, destination, err, out, wrote
from tformer_cli.cli.options import command, shared
from tformer_cli.config import (
    AttentionOptions,
    DecodeConfig,
    DecodeOptions,
    DistillOptions,
    Range,
    setting,
)
from tformer_cli.engines import load_engine
from tformer_cli.errors import TformerError

if TYPE_CHECKING:
    from datasets import DatasetDict

    from tformer_cli.checkpoint import LoadedRun
    from tformer_cli.decode.distill import Teacher
    from tformer_cli.decode.translate import SourcesEngine
    from tformer_cli.learn.use import Use


# ---------------------------------------------------------------------------- translate
def min_len_note(cfg: DecodeConfig) -> str | None:
    """The note of a ``--min-len`` that the length limit cuts; None where none is cut."""
    cut = cfg.min_len_cut()
    if cut is None:
        return None
    limit = f"--max-len-a {cfg.max_len_a:g} x source tokens + --max-len-b {cfg.max_len_b}"
    which = "every source" if cut == math.inf else f"sources of up to {cut} tokens"
    return f"note: --min-len {cfg.min_len} is cut to the length limit ({limit}) for {which}"


@dataclass(frozen=True)
class Translate(DecodeOptions):
    """``tformer translate``: the search, what to read and write, and where it runs."""

    texts: list[str] | None = setting(None, "Sentences to translate.", argument=True)
    model: list[Path] | None = shared("models")
    file: Path | None = setting(
        None, "Translate each line of a UTF-8 file (- = stdin).", flags=("--file", "-f")
    )
    output: Path | None = shared(
        "output", "Write translations here (all at once, at the end), not stdout."
    )
    greedy: bool = setting(False, "Greedy search (same as -k 1).")
    scores: bool = setting(False, "Prefix each line with its score.")
    batch_size: int | None = setting(
        None, "Sentences per batch (default: by --max-tokens).", values=Range(1)
    )
    max_tokens: int = setting(4096, "Source tokens per batch.", values=Range(1))
    chunk_size: int = setting(
        2000,
        "Lines read, translated (sorted by length into batches) and written at a time:"
        " output flows before the input ends, and memory does not grow with it.",
        values=Range(1, 1_000_000),
    )
    no_cache: bool = setting(False, "Recompute every prefix each step (slow; teaching).")
    json_out: bool = shared("json_out", "One JSON object per input: hypotheses, scores, timing.")
    trace: Path | None = setting(
        None,
        "Write the step-through search of the first text as JSON here: each step's"
        " hypotheses, their best next tokens (kept, pruned or finished), cross-attention.",
    )
    device: str = shared("device")
    precision: str | None = shared("precision_int8")
    compile: str = shared("compile")
    engine: str = shared("engine")
    threads: int = shared("threads")
    use: Path | None = shared("use")
    quiet: bool = shared("quiet")

    def __post_init__(self) -> None:
        if self.greedy:
            object.__setattr__(self, "beam", 1)
        super().__post_init__()


@command(Translate)
def translate(v: Translate) -> None:
    """Translate sentences (beam search with a KV cache; results in input order).

    Reads the texts given, else --file, else piped stdin, as UTF-8 lines ending in a newline:
    one output line per input line. Translates --chunk-size lines at a time, each chunk sorted
    by length into batches, and writes each chunk's translations as soon as they are ready. On
    a terminal with nothing given it asks for sentences one by one.
    """
    if v.greedy and (v.sample or v.mbr):
        raise typer.BadParameter("--greedy searches; --sample and --mbr draw: choose one")
    cfg = v.search(0.0 if v.alpha is None else v.alpha)  # without --alpha: the run's, once loaded
    check_engine(v.engine, cfg, len(v.model or [None]), cache=not v.no_cache)
    if v.trace is not None and v.engine == "ctranslate2":
        raise typer.BadParameter(
            "CTranslate2 cannot trace a search: use --engine torch", param_hint="--engine"
        )
    inputs = read_inputs(v.texts, v.file, sys.stdin)
    use = learner(v.use, v.engine, v.quiet)
    if (note := min_len_note(cfg)) is not None and not v.quiet:
        err.print(note, markup=False, highlight=False)
    translator = open_translator(
        v.model, cfg, alpha=v.alpha, device=v.device, precision=v.precision,
        compile=v.compile if use is None else "off", engine=v.engine, use_cache=not v.no_cache,
        threads=v.threads,
    )  # fmt: skip
    from tformer_cli.learn.use import swapped

    with swapped(use):
        run_translator(translator, v, inputs)


def learner(path: Path | None, engine: str, quiet: bool) -> Use | None:
    """``--use``: the learner's file checked, its passing functions ready to swap in, and said
    so on stderr; None without it."""
    if path is None:
        return None
    if engine != "torch":
        raise typer.BadParameter(
            "your functions run in tformer's eager step: use --engine torch", param_hint="--use"
        )
    from tformer_cli.learn.use import ACTING, EAGER_NOTE, prepare

    use = prepare(path, ACTING)
    if not quiet:
        err.print(f"{EAGER_NOTE}\n{use.line()}", markup=False, highlight=False)
    return use


def run_translator(
    translator: Translator, v: Translate, inputs: tuple[Iterable[str], int | None] | None
) -> None:
    """The rest of ``translate``: the trace, then the prompt or the lines read."""
    if v.trace is not None:
        translator.trace(v.trace, v.texts or [])
        wrote(v.trace, v.quiet)
    # the format of the lines: json, nbest (INDEX, SCORE, TEXT), scores or plain
    style = "json" if v.json_out else "nbest" if v.nbest > 1 else "scores" if v.scores else "plain"
    if inputs is None:  # a terminal and nothing to read: ask
        err.print("Type a sentence and press Enter; Ctrl-D quits.")
        while True:
            try:
                line = input("> ")
            except EOFError:  # Ctrl-D: end the prompt's line
                err.print()
                return
            out.print(translator.line(line, style), markup=False)
    lines, total = inputs
    count = translator.stream(
        lines, total, err, style=style, output=v.output, sink=sys.stdout.buffer,
        max_tokens=v.max_tokens, batch_size=v.batch_size, chunk_size=v.chunk_size, quiet=v.quiet,
    )  # fmt: skip
    if not count and not v.quiet:
        err.print("note: no input sentences: nothing to translate", markup=False)
    if v.output is not None:
        wrote(v.output, v.quiet)


def read_inputs(
    texts: list[str] | None, file: Path | None, stdin: TextIO
) -> tuple[Iterable[str], int | None] | None:
    """The texts to translate (the arguments, a file's lines or piped ``stdin``'s) and their
    count if known; ``None``: ask on the terminal."""
    from tformer_cli.decode.streams import check_arguments, count_lines, file_lines, read_lines

    if texts and file is not None:
        raise TformerError("give sentences or --file, not both")
    if texts:
        return check_arguments(texts), len(texts)
    if file is not None and str(file) != "-":
        return file_lines(file), count_lines(file)
    if file is None and stdin.isatty():
        return None
    return read_lines(stdin.buffer, "stdin"), None


@dataclasses.dataclass(frozen=True)
class Translator:
    """Loaded runs (an ensemble past one), their search, and what decodes (``None``: tformer's
    search, with its KV cache unless not ``use_cache``)."""

    runs: list[LoadedRun]
    cfg: DecodeConfig
    engine: SourcesEngine | None = None
    use_cache: bool = True

    def trace(self, path: Path, texts: Sequence[str]) -> None:
        """``--trace``: the step-through search (``Run.trace``) of the first text, as JSON."""
        from tformer_cli.api.run import Run
        from tformer_cli.files import atomic_write_text

        cfg = self.cfg
        if not texts or cfg.sampling is not None or cfg.mbr:
            raise TformerError("--trace follows the search of a sentence given as an argument")
        traced = Run(self.runs, cfg.alpha).trace(texts[0], beam=cfg.beam, top=cfg.beam + 5)
        atomic_write_text(path, traced.to_json() + "\n")

    def line(self, text: str, style: str) -> str:
        """The output line of one text (the terminal prompt's)."""
        from tformer_cli.decode.streams import format_translations
        from tformer_cli.decode.translate import Batching, translate_texts

        batching = Batching(use_cache=self.use_cache)
        result = translate_texts(self.runs, [text], self.cfg, batching, engine=self.engine)
        return format_translations(result, style)[0]

    def stream(
        self, lines: Iterable[str], total: int | None, log: Console, *, style: str,
        output: Path | None, sink: BinaryIO, max_tokens: int, batch_size: int | None,
        chunk_size: int, quiet: bool,
    ) -> int:  # fmt: skip
        """Translate ``lines`` chunk by chunk into ``sink`` (or ``output``, whole at the end),
        with a progress bar on ``log`` past 100 lines; returns the count."""
        from tformer_cli.console import make_progress
        from tformer_cli.decode import streams
        from tformer_cli.decode.translate import Batching
        from tformer_cli.device import oom_hint

        few = total < 100 if total is not None else not log.is_terminal  # no bar: a short job
        with (
            make_progress("translate", log, disable=quiet or few) as progress,
            oom_hint(max_tokens),
        ):
            task = progress.add_task("translate", total=total, info="")
            chunks = streams.translate_chunks(
                self.runs, lines, self.cfg, Batching(max_tokens, batch_size, self.use_cache),
                chunk_size=chunk_size, on_batch=lambda n: progress.advance(task, n),
                engine=self.engine,
            )  # fmt: skip
            if output is not None:
                return streams.save_translations(output, chunks, style)
            return streams.write_translations(chunks, sink, style)


def open_translator(
    models: Sequence[Path] | None, cfg: DecodeConfig, *, alpha: float | None, device: str,
    precision: str | None, compile: str, engine: str, use_cache: bool, threads: int = 0,
) -> Translator:  # fmt: skip
    """The runs loaded as ``tformer.load`` loads them, with the search ``cfg`` and its length
    penalty ``alpha`` (default: the first run's ``beam_alpha``), decoded by ``engine``."""
    from tformer_cli.api.run import load
    from tformer_cli.report.eval_run import use_threads

    run = load(models or None, device=device, precision=precision, compile=compile, alpha=alpha)
    use_threads(threads)
    search = dataclasses.replace(cfg, alpha=run.alpha)
    return Translator(run.loaded, search, load_engine(engine, run.loaded[0]), use_cache)


# ---------------------------------------------------------------------------- inspect-attention
@dataclass(frozen=True, kw_only=True)
class InspectAttention(AttentionOptions):
    """``tformer inspect-attention``: the maps to show, where they go, where the run loads."""

    text: str = setting(MISSING, "The sentence to translate and inspect.", argument=True)
    model: Path | None = shared("model")
    save: Path | None = setting(None, "Write a picture: .svg, .html (self-contained) or .png.")
    json_out: bool = shared("json_out", "Print every weight with its tokens as JSON instead.")
    output: Path | None = shared("output")
    device: str = shared("device")
    precision: str | None = shared("precision")
    use: Path | None = shared("use")
    quiet: bool = shared("quiet", "No log lines.")


@command(InspectAttention, "inspect-attention")
def inspect_attention_command(v: InspectAttention) -> None:
    """Translate a sentence and show what every attention head looks at.

    Prints a heatmap per head (rows: target tokens, columns: source tokens for cross-attention)
    and a per-head table: attention entropy and, for runs trained on the toy corpus, how often
    the head's strongest source word is the gold-aligned one on the toy test split.
    """
    from tformer_cli.api.run import own_precision
    from tformer_cli.learn.use import swapped
    from tformer_cli.report.attention.view import AttentionRequest, inspect_attention

    asked = {f.name: getattr(v, f.name) for f in dataclasses.fields(AttentionOptions)}
    precision = v.precision or own_precision(v.model)
    use = learner(v.use, "torch", v.quiet)
    compile = "auto" if use is None else "off"
    request = AttentionRequest(**asked, device=v.device, precision=precision, compile=compile)

    log = Console(stderr=True, quiet=v.quiet, soft_wrap=True)
    if not v.json_out or v.save is not None:  # the maps drawn (with --json, to nowhere)
        with destination(None if v.json_out else v.output, v.quiet) as console, swapped(use):
            text = Console(file=io.StringIO()) if v.json_out else console
            inspect_attention(v.text, v.model, request, text, log, save=v.save)
    if v.json_out:  # every weight, as the library returns it
        from tformer_cli.api.run import load

        run = load(v.model, device=v.device, precision=precision, compile="off")
        run.use = use  # checked once, above
        chosen = {name: value for name, value in asked.items() if name not in ("layer", "head")}
        with destination(v.output, v.quiet) as console:
            console.print(run.attention(v.text, **chosen).to_json(), markup=False, end="")


# ---------------------------------------------------------------------------- distill
@dataclass(frozen=True, kw_only=True)
class Distill(DistillOptions):
    """``tformer distill``: what the teacher translates and how, and where it runs."""

    model: Path | None = shared(
        "model", "The teacher's run folder. Default: the newest run under runs/."
    )
    output: Path = setting(
        MISSING,
        "The corpus folder to write (made if missing; resumed where a stopped run left it).",
        flags=("--output", "-o"),
    )
    device: str = shared("device")
    precision: str | None = shared("precision_int8")
    compile: str = shared("compile")
    engine: str = shared("engine")
    threads: int = shared("threads")
    quiet: bool = shared("quiet")


@command(Distill)
def distill(v: Distill) -> None:
    """Translate a corpus's training split with a teacher: a corpus to train a student on.

    Sequence-level knowledge distillation (Kim & Rush 2016). Writes into -o DIR train.jsonl
    (the teacher's translations of the training split; --mix: the original pairs too),
    valid.jsonl and test.jsonl (the originals) and distill.json (the teacher, its weights'
    SHA-256, the search, engine and precision): `tformer train --data DIR` reads it. Translates
    --chunk-size pairs at a time, sorted by length into batches as translate does, and writes
    each chunk whole: run again after a stop, it resumes after the last chunk written.
    """
    from tformer_cli.api.run import own_precision
    from tformer_cli.decode.distill import Teacher, check_output, training_corpus
    from tformer_cli.decode.translate import Batching
    from tformer_cli.report.pick import choose_run

    check_output(v.output, v.force)
    cfg = v.search(0.0 if v.alpha is None else v.alpha)  # without --alpha: the teacher's
    check_engine(v.engine, cfg)
    run = choose_run(v.model)
    precision = v.precision or own_precision(run)
    translator = open_translator(
        [run], cfg, alpha=v.alpha, device=v.device, precision=precision, compile=v.compile,
        engine=v.engine, use_cache=True, threads=v.threads,
    )  # fmt: skip
    teacher = Teacher(
        translator.runs, translator.cfg, Batching(v.max_tokens), v.engine, precision,
        translator.engine,
    )  # fmt: skip
    with training_corpus(translator.runs[0].config.train, v.data, v.src, v.tgt) as (name, corpus):
        record = run_distill(teacher, corpus, name, v)
    if not v.quiet:
        kept = f"{record['distilled']} teacher pairs" + (
            f" and {record['original']} original ones" if v.mix else ""
        )
        err.print(f"{kept}, {record['empty']} empty translations left out", markup=False)
    wrote(v.output, v.quiet)


def run_distill(teacher: Teacher, corpus: DatasetDict, name: str, v: Distill) -> dict[str, Any]:
    """``distill_corpus`` with a progress bar on stderr; its record."""
    from tformer_cli.console import make_progress
    from tformer_cli.decode.distill import distill_corpus
    from tformer_cli.device import oom_hint

    total = len(corpus["train"]) if v.limit is None else min(v.limit, len(corpus["train"]))
    with make_progress("distill", err, disable=v.quiet) as progress, oom_hint(v.max_tokens):
        task = progress.add_task("distill", total=total, info="")
        return distill_corpus(
            teacher, corpus, v.output, data=name, chunk_size=v.chunk_size, limit=v.limit,
            mix=v.mix, force=v.force, on_batch=lambda n: progress.advance(task, n),
        )  # fmt: skip
