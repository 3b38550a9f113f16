"""`tformer translate` and `tformer inspect-attention`."""

from __future__ import annotations

import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from tformer_cli.cli.app import check_engine, destination, err, out, wrote
from tformer_cli.cli.options import command, shared
from tformer_cli.config import AttentionOptions, DecodeConfig, DecodeOptions, Range, option

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tformer_cli.api.decoding import Translator
    from tformer_cli.api.learn import Use


# ---------------------------------------------------------------------------- translate
def min_len_note(cfg: DecodeConfig) -> str | None:
    """The note of a ``--min-len`` that the length limit cuts (``DecodeConfig.min_len_cut``),
    naming the length used instead; None where none is cut."""
    cut = cfg.min_len_cut()
    if cut is None:
        return None
    limit = f"--max-len-a {cfg.max_len_a:g} x source tokens + --max-len-b {cfg.max_len_b}"
    which = "every source" if cut == math.inf else f"sources of up to {cut} tokens"
    return f"note: --min-len {cfg.min_len} is cut to the length limit ({limit}) for {which}"


def flag(help: str, *flags: str) -> Any:
    """A field the command line sets with a flag."""
    return field(default=False, metadata=option(help, flags=flags))


@dataclass(frozen=True)
class Translate(DecodeOptions):
    """``tformer translate``: the search (``DecodeOptions``), what to read and write, and where
    it runs; ``--greedy`` is ``-k 1``."""

    texts: list[str] | None = field(
        default=None, metadata=option("Sentences to translate.", argument=True)
    )
    model: list[Path] | None = shared("models")
    file: Path | None = field(
        default=None,
        metadata=option("Translate each line of a UTF-8 file (- = stdin).", flags=("--file", "-f")),
    )
    output: Path | None = shared(
        "output", "Write translations here (all at once, at the end), not stdout."
    )
    greedy: bool = flag("Greedy search (same as -k 1).")
    scores: bool = flag("Prefix each line with its score.")
    batch_size: int | None = field(
        default=None,
        metadata=option("Sentences per batch (default: by --max-tokens).", values=Range(1)),
    )
    max_tokens: int = field(
        default=4096, metadata=option("Source tokens per batch.", values=Range(1))
    )
    chunk_size: int = field(
        default=2000,
        metadata=option(
            "Lines read, translated (sorted by length into batches) and written at a time:"
            " output flows before the input ends, and memory does not grow with it.",
            values=Range(1, 1_000_000),
        ),
    )
    no_cache: bool = flag("Recompute every prefix each step (slow; teaching).")
    json_out: bool = shared("json_out", "One JSON object per input: hypotheses, scores, timing.")
    trace: Path | None = field(
        default=None,
        metadata=option(
            "Write the step-through search of the first text as JSON here: each step's"
            " hypotheses, their best next tokens (kept, pruned or finished), cross-attention."
        ),
    )
    device: str = shared("device")
    precision: str | None = shared("precision_int8")
    compile: str = shared("compile")
    engine: str = shared("engine")
    threads: int = shared("threads")
    use: Path | None = field(
        default=None,
        metadata=option(
            "Translate with your own functions: a tformer learn exercises file (or its"
            " folder); each exercise it passes replaces tformer's, on the eager step (--compile"
            " off)."
        ),
    )
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
    from tformer_cli.api.decoding import open_translator, read_inputs

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
    translator = open_translator(
        v.model, cfg, alpha=v.alpha, device=v.device, precision=v.precision,
        compile=v.compile if use is None else "off", use_cache=not v.no_cache, threads=v.threads,
    )  # fmt: skip
    if (note := min_len_note(cfg)) is not None and not v.quiet:
        err.print(note, markup=False, highlight=False)
    from tformer_cli.api.learn import swapped

    with swapped(use, [r.model for r in translator.runs]):
        run_translator(translator, v, inputs)


def learner(path: Path | None, engine: str, quiet: bool) -> Use | None:
    """``--use``: the learner's file checked, its passing functions ready to swap in (and said
    so on stderr); None without it."""
    if path is None:
        return None
    if engine != "torch":
        raise typer.BadParameter(
            "your functions run in tformer's eager step: use --engine torch", param_hint="--use"
        )
    from tformer_cli.api.learn import EAGER_NOTE, prepare

    use = prepare(path)
    if not quiet:
        err.print(EAGER_NOTE, markup=False, highlight=False)
        err.print(use.line(), markup=False, highlight=False)
    return use


def run_translator(
    translator: Translator, v: Translate, inputs: tuple[Iterable[str], int | None] | None
) -> None:
    """The rest of ``translate``: the trace, then the prompt or the lines read."""
    from tformer_cli.api.decoding import output_style

    if v.trace is not None:
        translator.trace(v.trace, v.texts or [])
        wrote(v.trace, v.quiet)
    translator = translator.with_engine(v.engine)
    style = output_style(v.json_out, v.nbest, v.scores)
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


# ---------------------------------------------------------------------------- inspect-attention
@dataclass(frozen=True, kw_only=True)
class InspectAttention(AttentionOptions):
    """``tformer inspect-attention``: the maps to show (``AttentionOptions``) of one sentence,
    where they go, and where the run is loaded."""

    text: str = field(metadata=option("The sentence to translate and inspect.", argument=True))
    model: Path | None = shared("model")
    save: Path | None = field(
        default=None,
        metadata=option("Write a picture: .svg, .html (self-contained) or .png."),
    )
    json_out: bool = shared("json_out", "Print every weight with its tokens as JSON instead.")
    output: Path | None = shared("output")
    device: str = shared("device")
    precision: str | None = shared("precision")
    quiet: bool = shared("quiet", "No log lines.")


@command(InspectAttention, "inspect-attention")
def inspect_attention(v: InspectAttention) -> None:
    """Translate a sentence and show what every attention head looks at.

    Prints a heatmap per head (rows: target tokens, columns: source tokens for cross-attention)
    and a per-head table: attention entropy and, for runs trained on the toy corpus, how often
    the head's strongest source word is the gold-aligned one on the toy test split.
    """
    from tformer_cli.api.decoding import inspect_attention as inspect

    def run_inspect(console: Console, log: Console, **files: Any) -> None:
        inspect(
            v.text,
            v.model,
            console,
            log,
            options=v,
            device=v.device,
            precision=v.precision,
            **files,
        )

    log = Console(stderr=True, quiet=v.quiet, soft_wrap=True)
    if not v.json_out:
        with destination(v.output, v.quiet) as console:
            run_inspect(console, log, save=v.save)
        return
    if v.output is not None:  # JSON to a file, the text to nowhere
        run_inspect(Console(file=io.StringIO()), log, save=v.save, json_path=v.output)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # JSON on stdout: the library writes files
        written = Path(folder) / "attention.json"
        quiet_log = Console(stderr=True, quiet=True)
        run_inspect(Console(file=io.StringIO()), quiet_log, save=v.save, json_path=written)
        if v.save is not None:
            wrote(v.save, v.quiet)
        out.print(written.read_text(encoding="utf-8"), markup=False, end="")
