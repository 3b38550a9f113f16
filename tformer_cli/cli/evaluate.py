"""`tformer eval`, `runs`, `show` and `compare`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

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
    positional,
    wrote,
)
from tformer_cli.cli.decode import min_len_note, run_alpha, search_config
from tformer_cli.cli.options import (
    Alpha,
    Compile,
    DecodePrecision,
    Device,
    Engine,
    Epsilon,
    EvalBeam,
    Limit,
    Mbr,
    MbrFrom,
    MbrUtility,
    MinLen,
    ModelDir,
    Models,
    NoiseSeed,
    Output,
    Parsed,
    Quiet,
    Sample,
    Split,
    Temperature,
    Threads,
    TopK,
    TopP,
    declared,
    one_of,
    with_options,
)
from tformer_cli.config import MAX_SEED, PRECISIONS, OneOf

X_AXIS = one_of("updates", "time")  # of the curves (show, compare --save)

# ---------------------------------------------------------------------------- eval
# Every option of tformer eval, in the order of its help.
EVAL = declared(
    model=(Models, None),
    data=(
        Annotated[
            str | None,
            typer.Option(help="Corpus (as for train). Default: the data the run was trained on."),
        ],
        None,
    ),
    src=(Annotated[str | None, typer.Option(help="Source language. Default: the run's.")], None),
    tgt=(Annotated[str | None, typer.Option(help="Target language. Default: the run's.")], None),
    src_file=(
        Annotated[
            Path | None,
            typer.Option(
                help="Plain source file (e.g. newstest2014.de): with --tgt-file, score every pair"
                " of the two files, in order, instead of --data."
            ),
        ],
        None,
    ),
    tgt_file=(
        Annotated[
            Path | None, typer.Option(help="Plain target file, line by line with --src-file.")
        ],
        None,
    ),
    split=(Split, "test"),
    limit=(Limit, None),
    beam=(EvalBeam, 5),
    alpha=(Alpha, None),
    json_out=(
        Annotated[
            bool,
            typer.Option("--json", help="Print every number, with its settings, as JSON instead."),
        ],
        False,
    ),
    output=(Output, None),
    hypotheses=(
        Annotated[
            Path | None,
            typer.Option(
                help="Write the hypotheses here, one per line: beam if --beam > 1, else greedy."
                " (Formerly --hyp.)"
            ),
        ],
        None,
    ),
    sample=(Sample, False),
    temperature=(Temperature, 1.0),
    top_k=(TopK, None),
    top_p=(TopP, None),
    epsilon=(Epsilon, None),
    mbr=(Mbr, 0),
    mbr_from=(MbrFrom, "sample"),
    mbr_utility=(MbrUtility, "chrf"),
    min_len=(MinLen, 0),
    seed=(
        Annotated[
            int,
            typer.Option(
                min=0, max=MAX_SEED, help="Seed of the prefix-noise draws and of the samples."
            ),
        ],
        1234,
    ),
    device=(Device, "auto"),
    precision=(DecodePrecision, None),
    compile=(Compile, "auto"),
    engine=(Engine, "torch"),
    threads=(Threads, 0),
    quiet=(Quiet, False),
)


@app.command("eval", cls=Command)
@friendly_errors
@with_options(EVAL)
def evaluate(ctx: typer.Context, **values: Any) -> None:
    """Score a run: BLEU and chrF (greedy and beam), teacher-forced loss, and exposure bias.

    The exposure-bias sections: the BLEU gap between teacher-forced argmax and greedy output,
    error accumulation when the model reads its own mistakes, accuracy under prefix noise, and
    quality decay with length. Metrics with no defined value print n/a. With several runs
    (-m A -m B), each run's report, then their ensemble's BLEU and chrF.
    """
    from tformer_cli.api.reports import evaluate_runs

    v = SimpleNamespace(**values)
    with from_options(ctx):  # checked before a run is read: its alpha comes after
        search = search_config(
            v.beam, 0.0 if v.alpha is None else v.alpha, v.sample,
            (v.temperature, v.top_k, v.top_p, v.epsilon), v.mbr, v.mbr_from, v.mbr_utility,
            min_len=v.min_len, seed=v.seed,
        )  # fmt: skip
    search = dataclasses.replace(search, alpha=run_alpha(v.alpha, v.model))
    check_engine(v.engine, search, len(v.model or [None]))
    if (note := min_len_note(search)) is not None and not v.quiet:
        err.print(note, markup=False, highlight=False)
    with destination(None if v.json_out else v.output, v.quiet) as console:
        report = evaluate_runs(
            v.model, search, seed=v.seed, console=None if v.json_out else console, log=err,
            json_path=v.output if v.json_out else None, hyp_path=v.hypotheses, quiet=v.quiet,
            data=v.data, src_lang=v.src, tgt_lang=v.tgt, src_file=v.src_file,
            tgt_file=v.tgt_file, split=v.split, limit=v.limit, device=v.device,
            precision=v.precision, threads=v.threads, compile=v.compile, engine=v.engine,
        )  # fmt: skip
    if v.json_out and v.output is None:
        out.print(report, markup=False, end="")
    for written in (v.output if v.json_out else None, v.hypotheses):
        if written is not None:
            wrote(written, v.quiet)


# ---------------------------------------------------------------------------- runs, show, compare
@app.command("runs", cls=Command)
@friendly_errors
def runs_command(
    folder: Annotated[
        Path | None,
        typer.Argument(help="Folder holding the runs. Default: runs/.", show_default=False),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print every row as JSON instead of the table.")
    ] = False,
    output: Output = None,
) -> None:
    """List the runs, newest first: data, model size, precision, updates, BLEU and state.

    The state is finished, interrupted (continue it with tformer train --resume RUN), running
    (a live training process holds the run's lock) or broken (with the reason). Test BLEU comes
    from tformer eval's stored result for the current model.pt, else from the end of training.
    """
    from tformer_cli.api.reports import show_runs

    with destination(output) as console:
        show_runs(folder, console, as_json=json_out)


@app.command("show", cls=Command)
@friendly_errors
def show_command(
    legacy: Annotated[
        Path | None, typer.Argument(help="Deprecated: use -m RUN.", hidden=True, metavar="RUN")
    ] = None,
    model: ModelDir = None,
    save: Annotated[
        Path | None,
        typer.Option(
            help="Write the curves: .svg, .html (self-contained, with the settings) or .png."
        ),
    ] = None,
    x: Annotated[
        str,
        typer.Option("--x", parser=X_AXIS, help="x axis: updates, or time (minutes of training)."),
    ] = "updates",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No log lines.")] = False,
) -> None:
    """Show a run: its settings, then its training curves drawn in the terminal.

    From the run's log.jsonl: train loss, valid loss, perplexity and BLEU, learning rate,
    target tokens/s, and the teacher-forcing probability of scheduled sampling when used.
    """
    from tformer_cli.api.reports import show_run

    run = positional(legacy, model, "tformer show RUN", "tformer show -m RUN")
    show_run(run, out, Console(stderr=True, quiet=quiet, soft_wrap=True), save=save, x=x)


@app.command("compare", cls=Command)
@friendly_errors
def compare_command(
    legacy: Annotated[
        list[Path] | None,
        typer.Argument(help="Deprecated: use -m RUN -m RUN.", hidden=True, metavar="RUN"),
    ] = None,
    model: Annotated[
        list[Path] | None,
        typer.Option(
            "--model",
            "-m",
            help="Two or more run folders (or names under runs/): -m A -m B; the first is the"
            " baseline.",
            show_default=False,
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="Corpus (as for train). Default: the data the runs were trained on."),
    ] = None,
    src: Annotated[str | None, typer.Option(help="Source language. Default: the runs'.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language. Default: the runs'.")] = None,
    split: Split = "test",
    limit: Limit = None,
    beam: EvalBeam = 5,
    alpha: Alpha = None,
    seed: NoiseSeed = 1234,
    save: Annotated[
        Path | None,
        typer.Option(
            help="Write the runs' curves overlaid: .svg, .html (with the tables) or .png."
        ),
    ] = None,
    x: Annotated[
        str,
        typer.Option(
            "--x", parser=X_AXIS, help="x axis of --save: updates, or time (minutes of training)."
        ),
    ] = "updates",
    json_out: Annotated[
        bool, typer.Option("--json", help="Print every number and p-value as JSON.")
    ] = False,
    output: Output = None,
    device: Device = "auto",
    precision: Annotated[
        str | None,
        typer.Option(
            parser=Parsed(OneOf(PRECISIONS)),
            help="fp32, bf16 or auto. Default: the precision each run was trained with.",
        ),
    ] = None,
    threads: Threads = 0,
    quiet: Quiet = False,
) -> None:
    """Compare runs on the same test data, with significance tests.

    BLEU and chrF (greedy and beam), teacher-forced metrics and the exposure-bias numbers side
    by side with their differences to the first run; for BLEU and chrF, sacrebleu's paired
    bootstrap resampling and paired approximate randomization give each difference a p-value.
    A run's stored tformer eval result is reused when it is current (same model.pt bytes, data
    and settings); otherwise the run is evaluated now and the result kept.
    """
    from tformer_cli.api.reports import compare_runs

    runs = positional(legacy, model, "tformer compare RUN RUN", "tformer compare -m RUN -m RUN")
    if not runs or len(runs) < 2:
        raise typer.BadParameter("compare needs two runs or more: -m A -m B", param_hint="--model")
    with destination(output, quiet) as console:
        compare_runs(
            runs, console, err, beam=beam, alpha=alpha, seed=seed, keep=True, save=save, x=x,
            as_json=json_out, quiet=quiet, data=data, src_lang=src, tgt_lang=tgt, split=split,
            limit=limit, device=device, precision=precision, threads=threads,
        )  # fmt: skip
