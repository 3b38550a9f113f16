"""`tformer train` and `tformer average`."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

import typer

from tformer_cli.cli.app import err, out, positional, wrote
from tformer_cli.cli.options import command, legacy_run, shared
from tformer_cli.config import TRAIN_OPTIONS, Pattern, Range, setting, shipped_recipes
from tformer_cli.config.fields import same_as
from tformer_cli.errors import TformerError

# ---------------------------------------------------------------------------- train


@dataclass(frozen=True)
class Own:
    """The options of tformer train of its own, besides those that set a config field
    (declared once, beside the field: ``config.TRAIN_OPTIONS``)."""

    preset: str | None = setting(
        None, f"Recipe: {', '.join(shipped_recipes())} or a .toml file; options given here win."
    )
    name: str | None = setting(None, "Run name: runs/NAME. Default: data+time.")
    runs_dir: Path = setting(Path("runs"), "Folder holding the runs.", metavar="DIR")
    resume: Path | None = setting(
        None, "Continue the run in this folder from its last.pt.", metavar="RUN"
    )
    tensorboard: Path | None = setting(
        None,
        "Also write the log's numbers here for TensorBoard (needs tensorboard).",
        metavar="DIR",
    )
    nproc: int = setting(
        1,
        "Train with N processes (DDP under torchrun: one per GPU, or N sharing the CPU"
        " cores). Each update takes max(--accum, N) batches, one share per process.",
        values=Range(1),
    )
    nnodes: str = setting(
        "1",
        "Machines taking part, passed to torchrun (e.g. 2, or 1:4).",
        values=Pattern(r"[1-9][0-9]*(:[1-9][0-9]*)?", "must be N or MIN:MAX"),
        metavar="N|MIN:MAX",
    )
    rdzv_endpoint: str | None = setting(
        None, "HOST:PORT where the machines meet (torchrun --rdzv-endpoint).", metavar="HOST:PORT"
    )
    use: Path | None = shared(
        "use",
        "Train with your own loss (label_smoothed_loss) and scheduled-sampling mix"
        " (mix_inputs): a tformer learn exercises file (or its folder); each it passes replaces"
        " tformer's, on the eager step (--compile off), in one process.",
    )
    quiet: bool = shared("quiet")


# The settings of tformer train: an option for each config field's (``config.TRAIN_OPTIONS``),
# then its own.
Train = dataclasses.make_dataclass(
    "Train",
    [
        *(
            (o.name, o.kind, setting(o.default, o.help, values=o.values, metavar=o.metavar))
            for o in TRAIN_OPTIONS.values()
        ),
        *(
            (f.name, get_type_hints(Own)[f.name], same_as(Own, f.name))
            for f in dataclasses.fields(Own)
        ),
    ],
    frozen=True,
)


@command(Train, "train", given=True)
def train_command(v: Any, given: frozenset[str]) -> None:
    """Train a tokenizer and a Transformer, then report test BLEU (greedy, sacrebleu).

    Validates every --valid-every updates (loss, perplexity, greedy BLEU), keeps the best model
    by validation BLEU in model.pt and the full state in last.pt. Ctrl-C saves and exits (code 130).
    Defaults train the bundled toy corpus in a few minutes; --preset multi30k for real data.
    """
    from tformer_cli.api.training import fit

    if v.use is not None and (v.nproc > 1 or v.nnodes != "1"):
        raise typer.BadParameter(
            "your functions run in this process: --nproc 1", param_hint="--use"
        )
    if v.nproc > 1 or v.nnodes != "1":  # the same command, once per process, under torchrun
        from tformer_cli.training.distributed import launch

        if os.environ.get("WORLD_SIZE"):
            raise TformerError("--nproc starts torchrun itself: not under torchrun")
        raise typer.Exit(launch(v.nproc, sys.argv[2:], v.nnodes, v.rdzv_endpoint))
    laid_over = given & {*TRAIN_OPTIONS, "preset", "name", "runs_dir"}  # over the recipe's
    trained = fit(
        {o: getattr(v, o) for o in laid_over}, preset=v.preset, resume=v.resume, name=v.name,
        runs_dir=v.runs_dir, use=v.use, quiet=v.quiet, tensorboard=v.tensorboard,
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
@dataclass(frozen=True)
class Average:
    """``tformer average``: the run, how many checkpoints, and where the mean goes."""

    legacy: Path | None = legacy_run()
    model: Path | None = shared("model", "Run trained with --average N. Default: the newest run.")
    last: int = setting(5, "Average the N newest checkpoints.", values=Range(2))
    output: Path | None = setting(
        None,
        "Where to write the weights. Default: RUN/averaged.pt; RUN/model.pt makes the"
        " average the run's model.",
        flags=("--output", "-o"),
    )


@command(Average, "average")
def average_checkpoints(v: Average) -> None:
    """Average the parameters of a run's newest validation checkpoints (element-wise, fp32)."""
    from tformer_cli.checkpoint import average_run
    from tformer_cli.report.pick import choose_run

    run = positional(v.legacy, v.model, "tformer average RUN", "tformer average -m RUN")
    paths, target = average_run(choose_run(run), v.last, v.output)
    out.print(
        f"averaged {len(paths)} checkpoints ({paths[0].stem} to {paths[-1].stem})", markup=False
    )
    wrote(target)
