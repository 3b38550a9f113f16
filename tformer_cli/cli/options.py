"""Options that several commands share, declared once: the run, the search, sampling and MBR,
the data of an evaluation, the hardware."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from tformer_cli.config import (
    MAX_SEED,
    TrainConfig,
)

F = TypeVar("F", bound=Callable[..., Any])


def declared(**options: tuple[Any, Any]) -> list[inspect.Parameter]:
    """A command's options as signature parameters, ``name=(Annotated type, default)``, in the
    order of its help: for a command with more options than a readable ``def`` holds."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(name, keyword, annotation=kind, default=default)
        for name, (kind, default) in options.items()
    ]


def with_options(options: list[inspect.Parameter]) -> Callable[[F], F]:
    """Give ``def command(ctx, **values)`` the options ``options`` (Typer reads the signature)."""

    def attach(command: F) -> F:
        ctx = inspect.Parameter(
            "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
        )
        command.__signature__ = inspect.Signature([ctx, *options])  # type: ignore[attr-defined]
        return command

    return attach


# Upper bounds of options that size memory or seed a generator: past them, a one-line error
# rather than torch's overflow or allocation traceback.
MAX_BEAM, MAX_HYPOTHESES = 256, 1024

ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model", "-m", help="Run folder. Default: the newest run under runs/.", show_default=False
    ),
]
Device = Annotated[str, typer.Option(help="auto (CUDA > MPS > CPU), cpu, cuda or mps.")]
Precision = Annotated[
    str, typer.Option(help="fp32, bf16 (autocast) or auto (bf16 where the hardware is fast at it).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")]
Output = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Write what would print to this file instead."),
]
RunPrecision = Annotated[
    str | None,
    typer.Option(
        help="fp32, bf16 (autocast), auto (bf16 where the hardware is fast at it). Default:"
        " the precision the run was trained with."
    ),
]
# translate and eval
Models = Annotated[
    list[Path] | None,
    typer.Option(
        "--model",
        "-m",
        help="Run folder; several (-m A -m B) decode as an ensemble (mean of their next-token"
        " probabilities; one shared tokenizer). Default: the newest run under runs/.",
        show_default=False,
    ),
]
Sample = Annotated[
    bool, typer.Option("--sample", help="Draw each token from the model instead of searching.")
]
Temperature = Annotated[
    float, typer.Option(help="Sampling: p^(1/T), renormalised (< 1 sharper, > 1 flatter).")
]
TopK = Annotated[int | None, typer.Option(help="Sampling: keep the k most probable tokens.")]
TopP = Annotated[
    float | None, typer.Option(help="Sampling: keep the smallest set of mass >= p (nucleus).")
]
Epsilon = Annotated[
    float | None, typer.Option(help="Sampling: drop tokens of probability < epsilon.")
]
Mbr = Annotated[
    int,
    typer.Option(
        min=0,
        max=MAX_HYPOTHESES,
        help="Minimum Bayes risk: the candidate of highest expected utility among N samples"
        " (or the beam's N-best, --mbr-from beam). 0: off.",
    ),
]
MbrFrom = Annotated[str, typer.Option(help="Where MBR candidates come from: sample or beam.")]
MbrUtility = Annotated[str, typer.Option(help="MBR utility: chrf (sacrebleu's) or bleu.")]
MinLen = Annotated[int, typer.Option(min=0, help="No </s> before this many tokens.")]
Compile = Annotated[
    str,
    typer.Option(
        help="The decode step: auto (CUDA graphs on a GPU; on the CPU the compiled step, once"
        " decoding runs long), on (compile it now) or off (eager)."
    ),
]
DecodePrecision = Annotated[
    str | None,
    typer.Option(
        help="fp32, bf16, auto, or int8 (int8 weights, CPU only: faster). Default: the precision"
        " the run was trained with."
    ),
]
Engine = Annotated[
    str,
    typer.Option(
        help="What decodes: torch (tformer's search) or ctranslate2 (the run's CTranslate2"
        " export, made on first use in RUN/ctranslate2/; there --alpha divides by |Y|^alpha,"
        " not by GNMT's ((5+|Y|)/6)^alpha; no MBR, epsilon sampling or ensembles)."
    ),
]


# eval and compare
Split = Annotated[
    str, typer.Option(help="train, valid, test, or all: every pair of --data, in order.")
]
Limit = Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N sentence pairs.")]
EvalBeam = Annotated[
    int,
    typer.Option(
        "--beam", "-k", min=1, max=MAX_BEAM, help="Beam size besides greedy (1: greedy only)."
    ),
]
Alpha = Annotated[
    float | None,
    typer.Option(
        help="GNMT length penalty of beam search (score / lp(Y)^alpha). Default: the (first)"
        " run's --beam-alpha, 0.6 unless its training set another."
    ),
]
NoiseSeed = Annotated[
    int, typer.Option(min=0, max=MAX_SEED, help="Seed of the prefix-noise draws.")
]
Threads = Annotated[
    int,
    typer.Option(
        min=0, max=1024, help="CPU threads. 0: $TFORMER_THREADS, else the cores left idle."
    ),
]

T = TrainConfig()  # the defaults shown in --help
