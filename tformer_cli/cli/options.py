"""How a command is declared: a settings dataclass whose fields are its options (``command``),
each generated from its field's metadata (``parameter``), and the options several share."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from tformer_cli.cli.app import Command, app, friendly_errors, from_options
from tformer_cli.config import DEVICES, MODES, PRECISIONS, OneOf, Range, Values, setting
from tformer_cli.config.decode import ENGINES
from tformer_cli.config.fields import kind_of

S = TypeVar("S")


class Parsed:
    """The parser of an option whose values are ``allowed``: anything else raises the
    ``ValueError`` that Typer turns into its usage error naming the option (exit 2)."""

    def __init__(self, allowed: Values, kind: type = str) -> None:
        self.allowed, self.kind = allowed, kind
        self.__name__ = {int: "integer", float: "float"}.get(kind, "text")  # click's type name

    def __call__(self, text: Any) -> Any:
        value = text if isinstance(text, self.kind) else self.kind(text)
        rule = self.allowed.refuses(value)
        if rule is not None:
            raise ValueError(f"{value!r} {rule}")
        return value


def parameter(name: str, hint: Any, default: Any, meta: Mapping[str, Any]) -> inspect.Parameter:
    """The option (or argument) ``name`` of a command, as its settings field declares it
    (``config.option``), its values checked by Typer's bounds or by ``Parsed``."""
    values, kind = meta.get("values"), kind_of(hint)
    checks: dict[str, Any] = {}
    if isinstance(values, Range) and kind is int:
        checks = {"min": values.low, "max": values.high}
    elif values is not None:
        checks = {"parser": Parsed(values, float if kind is float else str)}
    if default is dataclasses.MISSING:  # a required argument
        default = inspect.Parameter.empty
    if meta.get("argument"):
        hidden, metavar = meta.get("hidden", False), meta.get("metavar") or None
        info = typer.Argument(help=meta["help"], hidden=hidden, metavar=metavar)
    else:
        on = kind is bool and default is True  # --x/--no-x
        flags = meta.get("flags") or (() if on else (f"--{name.replace('_', '-')}",))
        metavar = meta.get("metavar") or None  # else the plain one of help.metavar
        info = typer.Option(
            *flags, help=meta["help"], show_default=default is not None, metavar=metavar, **checks
        )
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(name, keyword, annotation=Annotated[hint, info], default=default)


def parameters(settings: type, skip: Collection[str] = ()) -> list[inspect.Parameter]:
    """The options of every field of ``settings`` that a face sets (``option`` metadata)."""
    hints = get_type_hints(settings)
    return [
        parameter(f.name, hints[f.name], f.default, f.metadata)
        for f in dataclasses.fields(settings)
        if "help" in f.metadata and f.name not in skip
    ]


def command(
    settings: type[S], name: str | None = None, *, group: typer.Typer = app,
    skip: Collection[str] = (), given: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # fmt: skip
    """Register ``def body(options: settings)`` as the command ``name``, its options the fields
    of ``settings`` (``skip`` aside); ``given``: ``body(options, names)`` is also told which
    options the command line set. A rule the settings break, as they are made or while the
    body runs, is the usage error of the option that set it (``from_options``)."""

    def register(body: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(body)
        def invoked(ctx: typer.Context, **values: Any) -> Any:
            with from_options(ctx):
                chosen = settings(**values)
                return body(chosen, set_here(ctx, values)) if given else body(chosen)

        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        options = [context.replace(annotation=typer.Context), *parameters(settings, skip)]
        invoked.__signature__ = inspect.Signature(options)  # type: ignore[attr-defined]
        group.command(name, cls=Command)(friendly_errors(invoked))
        return body

    return register


def set_here(ctx: typer.Context, values: Mapping[str, Any]) -> frozenset[str]:
    """The options of ``values`` that the command line set, not left at their defaults."""
    sources = {o: ctx.get_parameter_source(o) for o in values}  # click's enum, or typer's
    return frozenset(o for o, source in sources.items() if source and source.name != "DEFAULT")


# The options that several commands share, by name.
SHARED: dict[str, Any] = {
    "model": setting(
        None,
        "Run folder. Default: the newest run under runs/.",
        flags=("--model", "-m"),
        metavar="RUN",
    ),
    "models": setting(
        None,
        "Run folder; several (-m A -m B) decode as an ensemble (mean of their next-token"
        " probabilities; one shared tokenizer). Default: the newest run under runs/.",
        flags=("--model", "-m"),
        metavar="RUN",
    ),
    "device": setting("auto", "auto (CUDA > MPS > CPU), cpu, cuda or mps.", values=OneOf(DEVICES)),
    "precision": setting(
        None,
        "fp32, bf16 (autocast), auto (bf16 where the hardware is fast at it). Default: the"
        " precision the run was trained with.",
        values=OneOf(PRECISIONS),
    ),
    "precision_int8": setting(
        None,
        "fp32, bf16, auto, or int8 (int8 weights, CPU only: faster). Default: the precision"
        " the run was trained with.",
        values=OneOf((*PRECISIONS, "int8")),
    ),
    "compile": setting(
        "auto",
        "The decode step: auto (CUDA graphs on a GPU; on the CPU the compiled step, once"
        " decoding runs long), on (compile it now) or off (eager).",
        values=OneOf(MODES),
    ),
    "engine": setting(
        "torch",
        "What decodes: torch (tformer's search) or ctranslate2 (the run's CTranslate2 export,"
        " made on first use in RUN/ctranslate2/; there --alpha divides by |Y|^alpha, not by"
        " GNMT's ((5+|Y|)/6)^alpha; no MBR, epsilon sampling or ensembles).",
        values=OneOf(ENGINES),
    ),
    "threads": setting(
        0, "CPU threads. 0: $TFORMER_THREADS, else the cores left idle.", values=Range(0, 1024)
    ),
    "output": setting(
        None, "Write what would print to this file instead.", flags=("--output", "-o")
    ),
    "json_out": setting(
        False, "Print every number, with its settings, as JSON instead.", flags=("--json",)
    ),
    "quiet": setting(False, "No progress bar or log lines.", flags=("--quiet", "-q")),
    "use": setting(
        None,
        "Your own functions: a tformer learn exercises file (or its folder); each exercise"
        " it passes replaces tformer's, on the eager step (--compile off).",
    ),
}


def legacy_run(help: str = "Deprecated: use -m RUN.", metavar: str = "RUN") -> Any:
    """The field of the hidden argument of an old spelling, kept for a release."""
    return setting(None, help, argument=True, hidden=True, metavar=metavar)


def shared(name: str, help: str = "") -> Any:
    """The field of the shared option ``name``, its help replaced by ``help`` if given."""
    declared = SHARED[name]
    meta = {**declared.metadata, "help": help or declared.metadata["help"]}
    return dataclasses.field(default=declared.default, metadata=meta)
