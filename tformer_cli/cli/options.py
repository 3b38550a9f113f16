"""Options that several commands share, declared once: the run, the search, sampling and MBR,
the data of an evaluation, the hardware; and the parser of an option whose values are a range
or a set (``Parsed``): a value outside them is a usage error naming the option (exit 2)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_type_hints

import typer

from tformer_cli.config import (
    DEVICES,
    MAX_SEED,
    MODES,
    PRECISIONS,
    DecodeConfig,
    OneOf,
    SamplingConfig,
    TrainConfig,
    Values,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Pattern:
    """The values of a text option of a fixed form: ``pattern`` (a regular expression), which
    ``rule`` says in words."""

    pattern: str
    rule: str

    def refuses(self, value: str) -> str | None:
        return None if re.fullmatch(self.pattern, value) else self.rule


class Parsed:
    """The parser of an option whose values are ``allowed``: a ``Range`` of ``kind`` numbers
    (finite), a ``OneOf`` or a ``Pattern`` of texts. Anything else (``abc`` for a number,
    ``nan``, a value out of range) raises the ``ValueError`` that Typer turns into its usage
    error naming the option (exit 2)."""

    def __init__(self, allowed: Values | Pattern, kind: type = str) -> None:
        self.allowed, self.kind = allowed, kind
        self.__name__ = {int: "integer", float: "float"}.get(kind, "text")  # click's type name

    def __call__(self, text: Any) -> Any:
        value = text if isinstance(text, self.kind) else self.kind(text)
        rule = self.allowed.refuses(value)
        if rule is not None:
            raise ValueError(f"{value!r} {rule}")
        return value


def parsed(config: type, name: str) -> Parsed:
    """The parser of the option that sets ``config``'s field ``name``: the values the field
    declares, of the field's type."""
    field = {f.name: f for f in dataclasses.fields(config)}[name]
    hint = get_type_hints(config)[name]
    return Parsed(field.metadata["values"], float if float in (hint, *get_args(hint)) else str)


def one_of(*choices: str) -> Parsed:
    """The parser of an option that takes one of ``choices``."""
    return Parsed(OneOf(choices))


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
MAX_BEAM, MAX_HYPOTHESES, MAX_LENGTH = 256, 1024, 100_000
ENGINES = ("torch", "ctranslate2")  # what decodes: tformer's search, or the run's CTranslate2

ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model", "-m", help="Run folder. Default: the newest run under runs/.", show_default=False
    ),
]
Device = Annotated[
    str,
    typer.Option(parser=Parsed(OneOf(DEVICES)), help="auto (CUDA > MPS > CPU), cpu, cuda or mps."),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")]
Output = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Write what would print to this file instead."),
]
RunPrecision = Annotated[
    str | None,
    typer.Option(
        parser=Parsed(OneOf(PRECISIONS)),
        help="fp32, bf16 (autocast), auto (bf16 where the hardware is fast at it). Default:"
        " the precision the run was trained with.",
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
    float,
    typer.Option(
        parser=parsed(SamplingConfig, "temperature"),
        help="Sampling: p^(1/T), renormalised (< 1 sharper, > 1 flatter).",
    ),
]
TopK = Annotated[int | None, typer.Option(min=1, help="Sampling: keep the k most probable tokens.")]
TopP = Annotated[
    float | None,
    typer.Option(
        parser=parsed(SamplingConfig, "top_p"),
        help="Sampling: keep the smallest set of mass >= p (nucleus).",
    ),
]
Epsilon = Annotated[
    float | None,
    typer.Option(
        parser=parsed(SamplingConfig, "epsilon"),
        help="Sampling: drop tokens of probability < epsilon.",
    ),
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
MbrFrom = Annotated[
    str,
    typer.Option(
        parser=parsed(DecodeConfig, "mbr_from"),
        help="Where MBR candidates come from: sample or beam.",
    ),
]
MbrUtility = Annotated[
    str,
    typer.Option(
        parser=parsed(DecodeConfig, "mbr_utility"), help="MBR utility: chrf (sacrebleu's) or bleu."
    ),
]
MinLen = Annotated[
    int,
    typer.Option(
        min=0, max=MAX_LENGTH, help="No </s> before this many tokens (at most the length limit)."
    ),
]
Compile = Annotated[
    str,
    typer.Option(
        parser=Parsed(OneOf(MODES)),
        help="The decode step: auto (CUDA graphs on a GPU; on the CPU the compiled step, once"
        " decoding runs long), on (compile it now) or off (eager).",
    ),
]
Use = Annotated[
    Path | None,
    typer.Option(
        help="Translate with your own functions: a tformer learn exercises file (or its folder);"
        " each exercise it passes replaces tformer's, on the eager step (--compile off).",
    ),
]
DecodePrecision = Annotated[
    str | None,
    typer.Option(
        parser=Parsed(OneOf((*PRECISIONS, "int8"))),
        help="fp32, bf16, auto, or int8 (int8 weights, CPU only: faster). Default: the precision"
        " the run was trained with.",
    ),
]
Engine = Annotated[
    str,
    typer.Option(
        parser=Parsed(OneOf(ENGINES)),
        help="What decodes: torch (tformer's search) or ctranslate2 (the run's CTranslate2"
        " export, made on first use in RUN/ctranslate2/; there --alpha divides by |Y|^alpha,"
        " not by GNMT's ((5+|Y|)/6)^alpha; no MBR, epsilon sampling or ensembles).",
    ),
]


# eval and compare
Split = Annotated[
    str,
    typer.Option(
        parser=Parsed(OneOf(("train", "valid", "test", "all"))),
        help="train, valid, test, or all: every pair of --data, in order.",
    ),
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
        parser=parsed(DecodeConfig, "alpha"),
        help="GNMT length penalty of beam search (score / lp(Y)^alpha). Default: the (first)"
        " run's --beam-alpha, 0.6 unless its training set another.",
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
