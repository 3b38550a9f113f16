"""`tformer train` and `tformer average`."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, get_args

import typer

from tformer_cli.cli.app import (
    Command,
    app,
    err,
    friendly_errors,
    from_options,
    out,
    positional,
    wrote,
)
from tformer_cli.cli.options import (
    Parsed,
    Pattern,
    Quiet,
    declared,
    with_options,
)
from tformer_cli.config import TRAIN_OPTIONS, Range

# ---------------------------------------------------------------------------- train


# The options of tformer train of its own, besides those that set a config field (declared
# once, beside the field: config.TRAIN_OPTIONS).
OWN = {
    "preset": (
        Annotated[
            str | None,
            typer.Option(
                help="Recipe: toy, multi30k, multi30k-15min or a .toml file; options given here"
                " win."
            ),
        ],
        None,
    ),
    "name": (
        Annotated[str | None, typer.Option(help="Run name: runs/NAME. Default: data+time.")],
        None,
    ),
    "runs_dir": (Annotated[Path, typer.Option(help="Folder holding the runs.")], Path("runs")),
    "resume": (
        Annotated[
            Path | None, typer.Option(help="Continue the run in this folder from its last.pt.")
        ],
        None,
    ),
    "tensorboard": (
        Annotated[
            Path | None,
            typer.Option(
                help="Also write the log's numbers here for TensorBoard (needs tensorboard)."
            ),
        ],
        None,
    ),
    "nproc": (
        Annotated[
            int,
            typer.Option(
                min=1,
                help="Train with N processes (DDP under torchrun: one per GPU, or N sharing the"
                " CPU cores). Each update takes max(--accum, N) batches, one share per process.",
            ),
        ],
        1,
    ),
    "nnodes": (
        Annotated[
            str,
            typer.Option(
                parser=Parsed(Pattern(r"[1-9][0-9]*(:[1-9][0-9]*)?", "must be N or MIN:MAX")),
                help="Machines taking part, passed to torchrun (e.g. 2, or 1:4).",
            ),
        ],
        "1",
    ),
    "rdzv_endpoint": (
        Annotated[
            str | None,
            typer.Option(help="HOST:PORT where the machines meet (torchrun --rdzv-endpoint)."),
        ],
        None,
    ),
    "quiet": (Quiet, False),
}
# The order of train's help: the data, the run, the tokenizer, the model, optimisation,
# stopping, scheduled sampling, the hardware, the output.
HELP_ORDER = (
    "data", "src", "tgt", "src_file", "tgt_file", "valid_src_file", "valid_tgt_file", "preset",
    "name", "runs_dir", "resume", "vocab_size", "tokenizer", "tokenizer_sample", "tokenizer_file",
    "init_from", "d_model", "heads", "d_ff", "layers", "dropout", "positional", "norm", "tie",
    "max_tokens", "max_len", "lr", "warmup", "decay", "label_smoothing", "clip_norm", "accum",
    "max_steps", "epochs", "max_minutes", "valid_every", "valid_bleu_size", "save_every",
    "patience", "average", "beam_alpha", "scheduled_sampling", "ss_k", "ss_min", "ss_warmup",
    "ss_mix", "ss_tau", "seed", "device", "precision", "compile", "tensorboard", "nproc",
    "nnodes", "rdzv_endpoint", "quiet",
)  # fmt: skip


def train_option(name: str) -> tuple[Any, Any]:
    """A train option as ``declared`` takes it: the command's own, or the one its config fields'
    metadata declare (their type, default, help and values: Typer's bounds for a whole number,
    else ``Parsed``)."""
    if name in OWN:
        return OWN[name]
    declared_in = TRAIN_OPTIONS[name]
    values, number = declared_in.values, float in (declared_in.kind, *get_args(declared_in.kind))
    checks: dict[str, Any] = {}
    if isinstance(values, Range) and not number:
        checks = {"min": values.low, "max": values.high}
    elif values is not None:
        checks = {"parser": Parsed(values, float if number else str)}
    option = typer.Option(help=declared_in.help, **checks)
    return Annotated[declared_in.kind, option], declared_in.default


# Every option of tformer train, in the order of its help.
TRAIN = declared(**{name: train_option(name) for name in HELP_ORDER})


def given(ctx: typer.Context, values: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The options of ``names`` set on the command line, not left at their defaults."""
    sources = {o: ctx.get_parameter_source(o) for o in names}  # click's enum, or typer's
    known = [o for o, source in sources.items() if source is not None]
    return {o: values[o] for o in known if sources[o].name != "DEFAULT"}


@app.command(cls=Command)
@friendly_errors
@with_options(TRAIN)
def train(ctx: typer.Context, **values: Any) -> None:
    """Train a tokenizer and a Transformer, then report test BLEU (greedy, sacrebleu).

    Validates every --valid-every updates (loss, perplexity, greedy BLEU), keeps the best model
    by validation BLEU in model.pt and the full state in last.pt. Ctrl-C saves and exits (code 130).
    Defaults train the bundled toy corpus in a few minutes; --preset multi30k for real data.
    """
    from tformer_cli.api.training import (
        launch_processes,
        run_training,
        train_settings,
        training_log,
    )

    v = SimpleNamespace(**values)
    if v.nproc > 1 or v.nnodes != "1":  # the same command, once per process, under torchrun
        raise typer.Exit(launch_processes(v.nproc, v.nnodes, v.rdzv_endpoint, sys.argv[2:]))
    log = training_log(v.quiet)
    with from_options(ctx):
        model_cfg, train_cfg, run_dir = train_settings(
            given(ctx, values, [*TRAIN_OPTIONS, "preset", "name", "runs_dir"]), preset=v.preset,
            resume=v.resume, name=v.name, runs_dir=v.runs_dir, log=log,
        )  # fmt: skip
    trained = run_training(
        run_dir, model_cfg, train_cfg, resume=v.resume is not None, log=log,
        tensorboard=v.tensorboard, quiet=v.quiet,
    )  # fmt: skip
    result = trained.result
    if not trained.main:  # under torchrun rank 0 alone reports
        raise typer.Exit(trained.stopped if result.interrupted else 0)
    if result.test_bleu is not None:
        out.print(f"test BLEU (greedy, sacrebleu): {result.test_bleu:.2f}")
    out.print(f"run: {result.run_dir}", markup=False)
    if result.interrupted:  # exit 130 as an interrupted program does (so that `&&` stops here)
        hint = f"interrupted: continue with tformer train --resume {result.run_dir}"
        if not (result.run_dir / "model.pt").exists():
            hint += " (no model.pt yet: translate and eval use the newest run that has one)"
        err.print(hint, markup=False)
        raise typer.Exit(trained.stopped)


# ---------------------------------------------------------------------------- average
@app.command("average", cls=Command)
@friendly_errors
def average_checkpoints(
    legacy: Annotated[
        Path | None, typer.Argument(help="Deprecated: use -m RUN.", hidden=True, metavar="RUN")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            "-m",
            help="Run trained with --average N. Default: the newest run.",
            show_default=False,
        ),
    ] = None,
    last: Annotated[int, typer.Option(min=2, help="Average the N newest checkpoints.")] = 5,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the weights. Default: RUN/averaged.pt;"
            " RUN/model.pt makes the average the run's model.",
        ),
    ] = None,
) -> None:
    """Average the parameters of a run's newest validation checkpoints (element-wise, fp32)."""
    from tformer_cli.api.reports import average_checkpoints as average

    run = positional(legacy, model, "tformer average RUN", "tformer average -m RUN")
    paths, target = average(run, last, output)
    out.print(
        f"averaged {len(paths)} checkpoints ({paths[0].stem} to {paths[-1].stem})", markup=False
    )
    wrote(target)
