"""`tformer translate` and `tformer inspect-attention`."""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tformer_cli.cli.app import (
    Command,
    app,
    check_engine,
    destination,
    err,
    friendly_errors,
    from_options,
    out,
    wrote,
)
from tformer_cli.cli.options import (
    MAX_BEAM,
    MAX_HYPOTHESES,
    MAX_LENGTH,
    Compile,
    DecodePrecision,
    Device,
    Engine,
    Epsilon,
    Mbr,
    MbrFrom,
    MbrUtility,
    MinLen,
    ModelDir,
    Models,
    Output,
    Parsed,
    Pattern,
    Quiet,
    RunPrecision,
    Sample,
    Temperature,
    Threads,
    TopK,
    TopP,
    Use,
    declared,
    one_of,
    parsed,
    with_options,
)
from tformer_cli.config import (
    MAX_SEED,
    DecodeConfig,
    SamplingConfig,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tformer_cli.api.decoding import Translator
    from tformer_cli.api.learn import Use

SAMPLING = ("--temperature", "--top-k", "--top-p", "--epsilon")  # the settings of --sample


# ---------------------------------------------------------------------------- translate
def search_config(
    beam: int,
    alpha: float,
    sample: bool,
    sampling: tuple[float, int | None, float | None, float | None],
    mbr: int,
    mbr_from: str,
    mbr_utility: str,
    **rest: Any,
) -> DecodeConfig:
    """The search of translate and eval: beam (``beam`` 1: greedy), ``--sample`` (the
    ``sampling`` settings: temperature, top-k, top-p, epsilon) or ``--mbr`` over samples or
    the beam's n-best; ``rest``: the other ``DecodeConfig`` fields. A sampling setting given
    where nothing is sampled is a usage error, not ignored."""
    draws = sample or (mbr > 0 and mbr_from == "sample")
    unset = (1.0, None, None, None)
    given = [name for name, v, u in zip(SAMPLING, sampling, unset, strict=True) if v != u]
    if not draws and given:
        raise typer.BadParameter(
            "needs --sample or --mbr (from samples)", param_hint=f"'{given[0]}'"
        )
    return DecodeConfig(
        beam=1 if draws else beam, alpha=alpha, mbr=mbr, mbr_from=mbr_from,
        sampling=SamplingConfig(*sampling) if draws else None, mbr_utility=mbr_utility, **rest,
    ).nbest_in_beam()  # fmt: skip


def min_len_note(cfg: DecodeConfig) -> str | None:
    """The note of a ``--min-len`` that the length limit cuts (``DecodeConfig.min_len_cut``),
    naming the length used instead; None where none is cut."""
    cut = cfg.min_len_cut()
    if cut is None:
        return None
    limit = f"--max-len-a {cfg.max_len_a:g} x source tokens + --max-len-b {cfg.max_len_b}"
    which = "every source" if cut == math.inf else f"sources of up to {cut} tokens"
    return f"note: --min-len {cfg.min_len} is cut to the length limit ({limit}) for {which}"


def run_alpha(alpha: float | None, models: Sequence[Path] | None) -> float:
    """``--alpha`` if given, else the first run's (the newest run's by default): the API's rule."""
    from tformer_cli.api.run import length_penalty

    return length_penalty(alpha, models[0] if models else None)


# Every option of tformer translate, in the order of its help.
TRANSLATE = declared(
    texts=(Annotated[list[str] | None, typer.Argument(help="Sentences to translate.")], None),
    model=(Models, None),
    file=(
        Annotated[
            Path | None,
            typer.Option("--file", "-f", help="Translate each line of a UTF-8 file (- = stdin)."),
        ],
        None,
    ),
    output=(
        Annotated[
            Path | None,
            typer.Option(
                "--output",
                "-o",
                help="Write translations here (all at once, at the end), not stdout.",
            ),
        ],
        None,
    ),
    beam=(Annotated[int, typer.Option("--beam", "-k", min=1, max=MAX_BEAM, help="Beam size.")], 5),
    greedy=(Annotated[bool, typer.Option("--greedy", help="Greedy search (same as -k 1).")], False),
    alpha=(
        Annotated[
            float | None,
            typer.Option(
                parser=parsed(DecodeConfig, "alpha"),
                help="GNMT length penalty: score = log p(Y|X) / ((5+|Y|)/6)^alpha (--engine"
                " ctranslate2: / |Y|^alpha). Default: the (first) run's --beam-alpha, 0.6 unless"
                " its training set another.",
            ),
        ],
        None,
    ),
    nbest=(
        Annotated[
            int,
            typer.Option(
                min=1,
                max=MAX_HYPOTHESES,
                help="Hypotheses per input (<= beam; with --sample, samples per input): lines"
                " INDEX<TAB>SCORE<TAB>TEXT.",
            ),
        ],
        1,
    ),
    sample=(Sample, False),
    temperature=(Temperature, 1.0),
    top_k=(TopK, None),
    top_p=(TopP, None),
    epsilon=(Epsilon, None),
    seed=(
        Annotated[
            int, typer.Option(min=0, max=MAX_SEED, help="Seed of the samples (--sample, --mbr).")
        ],
        0,
    ),
    mbr=(Mbr, 0),
    mbr_from=(MbrFrom, "sample"),
    mbr_utility=(MbrUtility, "chrf"),
    min_len=(MinLen, 0),
    scores=(
        Annotated[bool, typer.Option("--scores", help="Prefix each line with its score.")],
        False,
    ),
    batch_size=(
        Annotated[
            int | None, typer.Option(min=1, help="Sentences per batch (default: by --max-tokens).")
        ],
        None,
    ),
    max_tokens=(Annotated[int, typer.Option(min=1, help="Source tokens per batch.")], 4096),
    chunk_size=(
        Annotated[
            int,
            typer.Option(
                min=1,
                max=1_000_000,
                help="Lines read, translated (sorted by length into batches) and written at a time:"
                " output flows before the input ends, and memory does not grow with it.",
            ),
        ],
        2000,
    ),
    max_len_a=(
        Annotated[
            float,
            typer.Option(
                parser=parsed(DecodeConfig, "max_len_a"),
                help="Output length limit a*|src|+b tokens: a.",
                show_default=True,
            ),
        ],
        1.5,
    ),
    max_len_b=(
        Annotated[int, typer.Option(min=0, max=MAX_LENGTH, help="Output length limit: b.")],
        10,
    ),
    no_cache=(
        Annotated[
            bool,
            typer.Option("--no-cache", help="Recompute every prefix each step (slow; teaching)."),
        ],
        False,
    ),
    json_out=(
        Annotated[
            bool,
            typer.Option("--json", help="One JSON object per input: hypotheses, scores, timing."),
        ],
        False,
    ),
    trace=(
        Annotated[
            Path | None,
            typer.Option(
                help="Write the step-through search of the first text as JSON here: each step's"
                " hypotheses, their best next tokens (kept, pruned or finished), cross-attention."
            ),
        ],
        None,
    ),
    device=(Device, "auto"),
    precision=(DecodePrecision, None),
    compile=(Compile, "auto"),
    engine=(Engine, "torch"),
    threads=(Threads, 0),
    use=(Use, None),
    quiet=(Quiet, False),
)


@app.command(cls=Command)
@friendly_errors
@with_options(TRANSLATE)
def translate(ctx: typer.Context, **values: Any) -> None:
    """Translate sentences (beam search with a KV cache; results in input order).

    Reads the texts given, else --file, else piped stdin, as UTF-8 lines ending in a newline:
    one output line per input line. Translates --chunk-size lines at a time, each chunk sorted
    by length into batches, and writes each chunk's translations as soon as they are ready. On
    a terminal with nothing given it asks for sentences one by one.
    """
    from tformer_cli.api.decoding import open_translator, read_inputs

    v = SimpleNamespace(**values)
    if v.greedy and (v.sample or v.mbr):
        raise typer.BadParameter("--greedy searches; --sample and --mbr draw: choose one")
    with from_options(ctx):  # without --alpha: 0 until the run's is read, once it is loaded
        cfg = search_config(
            1 if v.greedy else v.beam, 0.0 if v.alpha is None else v.alpha, v.sample,
            (v.temperature, v.top_k, v.top_p, v.epsilon), v.mbr, v.mbr_from, v.mbr_utility,
            max_len_a=v.max_len_a, max_len_b=v.max_len_b, nbest=v.nbest, min_len=v.min_len,
            seed=v.seed,
        )  # fmt: skip
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
    translator: Translator, v: SimpleNamespace, inputs: tuple[Iterable[str], int | None] | None
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
def numbered(*words: str) -> Parsed:
    """The parser of ``--layer``/``--head``: a number from 1 or one of ``words`` (a number past
    the model's layers or heads is for the run to say)."""
    either = f"must be a number from 1, {' or '.join(words)}"
    return Parsed(Pattern(rf"[1-9][0-9]*|{'|'.join(words)}", either))


@app.command("inspect-attention", cls=Command)
@friendly_errors
def inspect_attention(
    text: Annotated[str, typer.Argument(help="The sentence to translate and inspect.")],
    model: ModelDir = None,
    beam: Annotated[
        int,
        typer.Option(
            "--beam", "-k", min=1, max=MAX_BEAM, help="Beam size (1 = greedy); the best is shown."
        ),
    ] = 1,
    kind: Annotated[
        str,
        typer.Option(
            parser=one_of("cross", "encoder", "decoder"),
            help="cross (target -> source), encoder or decoder self-attention.",
        ),
    ] = "cross",
    layer: Annotated[
        str,
        typer.Option(parser=numbered("last", "all"), help="Layer number (from 1), last or all."),
    ] = "last",
    head: Annotated[
        str, typer.Option(parser=numbered("mean", "all"), help="Head number (from 1), mean or all.")
    ] = "all",
    save: Annotated[
        Path | None, typer.Option(help="Write a picture: .svg, .html (self-contained) or .png.")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print every weight with its tokens as JSON instead.")
    ] = False,
    output: Output = None,
    align: Annotated[
        bool, typer.Option(help="Score cross-attention heads against the toy gold alignments.")
    ] = True,
    align_sentences: Annotated[
        int, typer.Option(min=1, help="Toy test sentences for the alignment accuracy.")
    ] = 200,
    device: Device = "auto",
    precision: RunPrecision = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No log lines.")] = False,
) -> None:
    """Translate a sentence and show what every attention head looks at.

    Prints a heatmap per head (rows: target tokens, columns: source tokens for cross-attention)
    and a per-head table: attention entropy and, for runs trained on the toy corpus, how often
    the head's strongest source word is the gold-aligned one on the toy test split.
    """
    from tformer_cli.api.decoding import inspect_attention as inspect

    def run_inspect(
        text: str, model: Path | None, console: Console, log: Console, **files: Any
    ) -> None:
        inspect(
            text, model, console, log, kind=kind, layer=layer, head=head, beam=beam,
            align=align, align_sentences=align_sentences, device=device, precision=precision,
            **files,
        )  # fmt: skip

    log = Console(stderr=True, quiet=quiet, soft_wrap=True)
    if not json_out:
        with destination(output, quiet) as console:
            run_inspect(text, model, console, log, save=save)
        return
    if output is not None:  # JSON to a file, the text to nowhere
        run_inspect(text, model, Console(file=io.StringIO()), log, save=save, json_path=output)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # JSON on stdout: the library writes files
        written = Path(folder) / "attention.json"
        quiet_log = Console(stderr=True, quiet=True)
        run_inspect(
            text, model, Console(file=io.StringIO()), quiet_log, save=save, json_path=written
        )
        if save is not None:
            wrote(save, quiet)
        out.print(written.read_text(encoding="utf-8"), markup=False, end="")
