"""`tformer eval`, `runs`, `show` and `compare`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from tformer_cli.cli.app import check_engine, destination, err, out, positional, wrote
from tformer_cli.cli.decode import learner, min_len_note
from tformer_cli.cli.options import command, legacy_run, shared
from tformer_cli.config import NOT_EVALUATED, EvalOptions, OneOf, setting
from tformer_cli.config.fields import same_as

if TYPE_CHECKING:
    from tformer_cli.report.request import EvalRequest

X_AXIS = OneOf(("updates", "time"))  # of the curves (show, compare --save)


# ---------------------------------------------------------------------------- eval
@dataclass(frozen=True)
class Evaluate(EvalOptions):
    """``tformer eval``: the evaluation of each run, where it prints and where it runs."""

    model: list[Path] | None = shared("models")
    json_out: bool = shared("json_out")
    output: Path | None = shared("output")
    hypotheses: Path | None = setting(
        None,
        "Write the hypotheses here, one per line: beam if --beam > 1, else greedy."
        " (Formerly --hyp.)",
    )
    device: str = shared("device")
    precision: str | None = shared("precision_int8")
    compile: str = shared("compile")
    engine: str = shared("engine")
    threads: int = shared("threads")
    use: Path | None = shared("use")
    quiet: bool = shared("quiet")


@command(Evaluate, "eval", skip=NOT_EVALUATED)
def eval_command(v: Evaluate) -> None:
    """Score a run: BLEU and chrF (greedy and beam), teacher-forced loss, and exposure bias.

    The exposure-bias sections: the BLEU gap between teacher-forced argmax and greedy output,
    error accumulation when the model reads its own mistakes, accuracy under prefix noise, and
    quality decay with length. Metrics with no defined value print n/a. With several runs
    (-m A -m B), each run's report, then their ensemble's BLEU and chrF.
    """
    from tformer_cli.api.run import eval_request, run_alpha
    from tformer_cli.learn.use import swapped

    runs = v.model or [None]
    use = learner(v.use, v.engine, v.quiet)
    asked = eval_request(
        v, run_alpha(v.alpha, runs[0]), device=v.device, precision=v.precision,
        threads=v.threads, compile=v.compile if use is None else "off", engine=v.engine,
    )  # fmt: skip
    check_engine(v.engine, asked.config.search, len(runs))
    if (note := min_len_note(asked.config.search)) is not None and not v.quiet:
        err.print(note, markup=False, highlight=False)
    with destination(None if v.json_out else v.output, v.quiet) as console, swapped(use):
        report = evaluate_runs(
            runs, asked, console=None if v.json_out else console, log=err, keep=use is None,
            json_path=v.output if v.json_out else None, hyp_path=v.hypotheses, quiet=v.quiet,
        )  # fmt: skip
    if v.json_out and v.output is None:
        out.print(report, markup=False, end="")
    for written in (v.output if v.json_out else None, v.hypotheses):
        if written is not None:
            wrote(written, v.quiet)


def evaluate_runs(
    runs: Sequence[Path | None], asked: EvalRequest, *, console: Console | None, log: Console,
    keep: bool = True, json_path: Path | None = None, hyp_path: Path | None = None,
    quiet: bool = False,
) -> str:  # fmt: skip
    """``tformer eval`` of each run, each report printed on ``console`` (if any); the last also
    scores the ensemble and writes ``json_path`` and ``hyp_path``. The last report's JSON."""
    from tformer_cli.device import oom_hint
    from tformer_cli.report.eval_run import evaluate_run
    from tformer_cli.report.evaluation import render_report, report_json

    for i, run in enumerate(runs):  # each run's report; the last one ends with the ensemble's
        last = i == len(runs) - 1
        with oom_hint():
            evaluation = evaluate_run(
                run, asked, keep=keep, json_path=json_path if last else None,
                hyp_path=hyp_path if last else None, ensemble_with=runs[:-1] if last else (),
                console=log, quiet=quiet,
            )  # fmt: skip
        if console is not None:
            console.print(render_report(evaluation.report))
    return report_json(evaluation.report)


# ---------------------------------------------------------------------------- runs, show, compare
@dataclass(frozen=True)
class Runs:
    """``tformer runs``: the folder listed and where the list goes."""

    folder: Path | None = setting(None, "Folder holding the runs. Default: runs/.", argument=True)
    json_out: bool = shared("json_out", "Print every row as JSON instead of the table.")
    output: Path | None = shared("output")


@command(Runs, "runs")
def runs_command(v: Runs) -> None:
    """List the runs, newest first: data, model size, precision, updates, BLEU and state.

    The state is finished, interrupted (continue it with tformer train --resume RUN), running
    (a live training process holds the run's lock) or broken (with the reason). Test BLEU comes
    from tformer eval's stored result for the current model.pt, else from the end of training.
    """
    from tformer_cli.report.runs import show_runs

    with destination(v.output) as console:
        show_runs(v.folder, console, as_json=v.json_out)


@dataclass(frozen=True)
class Show:
    """``tformer show``: the run, and the picture of its curves."""

    legacy: Path | None = legacy_run()
    model: Path | None = shared("model")
    save: Path | None = setting(
        None, "Write the curves: .svg, .html (self-contained, with the settings) or .png."
    )
    x: str = setting(
        "updates", "x axis: updates, or time (minutes of training).", flags=("--x",), values=X_AXIS
    )
    quiet: bool = shared("quiet", "No log lines.")


@command(Show, "show")
def show_command(v: Show) -> None:
    """Show a run: its settings, then its training curves drawn in the terminal.

    From the run's log.jsonl: train loss, valid loss, perplexity and BLEU, learning rate,
    target tokens/s, and the teacher-forcing probability of scheduled sampling when used.
    """
    from tformer_cli.report.pick import choose_run
    from tformer_cli.report.show import show_run

    run = positional(v.legacy, v.model, "tformer show RUN", "tformer show -m RUN")
    log = Console(stderr=True, quiet=v.quiet, soft_wrap=True)
    show_run(choose_run(run), out, save=v.save, x=v.x, err=log)


@dataclass(frozen=True)
class Compare(EvalOptions):
    """``tformer compare``: the evaluation of two runs or more, their curves, where it runs."""

    legacy: list[Path] | None = legacy_run("Deprecated: use -m RUN -m RUN.")
    model: list[Path] | None = setting(
        None,
        "Two or more run folders (or names under runs/): -m A -m B; the first is the baseline.",
        flags=("--model", "-m"),
        metavar="RUN",
    )
    save: Path | None = setting(
        None, "Write the runs' curves overlaid: .svg, .html (with the tables) or .png."
    )
    x: str = same_as(Show, "x", "x axis of --save: updates, or time (minutes of training).")
    json_out: bool = shared("json_out", "Print every number and p-value as JSON.")
    output: Path | None = shared("output")
    device: str = shared("device")
    precision: str | None = shared(
        "precision", "fp32, bf16 or auto. Default: the precision each run was trained with."
    )
    threads: int = shared("threads")
    quiet: bool = shared("quiet")


@command(Compare, "compare", skip=NOT_EVALUATED)
def compare_command(v: Compare) -> None:
    """Compare runs on the same test data, with significance tests.

    BLEU and chrF (greedy and beam), teacher-forced metrics and the exposure-bias numbers side
    by side with their differences to the first run; for BLEU and chrF, sacrebleu's paired
    bootstrap resampling and paired approximate randomization give each difference a p-value.
    A run's stored tformer eval result is reused when it is current (same model.pt bytes, data
    and settings); otherwise the run is evaluated now and the result kept.
    """
    from tformer_cli.api.run import eval_request, run_alpha
    from tformer_cli.report.compare import compare_runs

    runs = positional(v.legacy, v.model, "tformer compare RUN RUN", "tformer compare -m RUN -m RUN")
    if not runs or len(runs) < 2:
        raise typer.BadParameter("compare needs two runs or more: -m A -m B", param_hint="--model")
    asked = eval_request(
        v, run_alpha(v.alpha, runs[0]), device=v.device, precision=v.precision,
        threads=v.threads,
    )  # fmt: skip
    with destination(v.output, v.quiet) as console:
        compare_runs(
            runs, console, asked, keep=True, save=v.save, x=v.x, as_json=v.json_out, err=err,
            quiet=v.quiet,
        )  # fmt: skip
