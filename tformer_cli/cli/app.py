"""The `tformer` application: its groups, how every command parses and fails (one-line errors,
exit codes), the old spellings kept for a release, and where results print."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tformer_cli import __version__
from tformer_cli.cli.help import examples, in_order, lay_out
from tformer_cli.config import option_of
from tformer_cli.engines import engine_refusal
from tformer_cli.errors import SettingError, TformerError

if TYPE_CHECKING:
    from tformer_cli.config import DecodeConfig

F = TypeVar("F", bound=Callable[..., Any])
HELP = {"help_option_names": ["-h", "--help"]}


class Group(typer.core.TyperGroup):
    """A group of commands: its options laid out as theirs are, its commands in ``help.ORDER``."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)
        lay_out("", params)
        return params

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return in_order(super().list_commands(ctx))


app = typer.Typer(
    name="tformer",
    help="Train, run and study a from-scratch Transformer for machine translation.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings=HELP,
    cls=Group,
)
tokenizer_app = typer.Typer(
    help="Try subword tokenizers on a corpus before training (tformer train makes its own).",
    no_args_is_help=True,
    context_settings=HELP,
    cls=Group,
)
app.add_typer(tokenizer_app, name="tokenizer")


err = Console(stderr=True, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def friendly_errors(fn: F) -> F:
    """Print a ``TformerError`` as one line on stderr, exit 1 (traceback with TFORMER_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TformerError as e:
            if os.environ.get("TFORMER_DEBUG"):
                raise
            err.print(f"[bold red]Error:[/] {escape(str(e))}", highlight=False)
            raise typer.Exit(1) from None
        except BrokenPipeError:  # our reader left (`tformer translate ... | head`): stop quietly
            with contextlib.suppress(OSError, ValueError):  # and no second error at exit's flush
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None  # 128 + SIGPIPE, as a shell reports `cat | head`
        except OSError as e:  # a file we were told to read or write: name it, no traceback
            if os.environ.get("TFORMER_DEBUG"):
                raise
            where = f" ({e.filename})" if e.filename else ""
            message = escape(f"{e.strerror or e}{where}")
            err.print(f"[bold red]Error:[/] {message}", highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


# Old spellings that keep working for one release, each with a one-line notice on stderr.
RENAMED = {"tokenizer train": {"--kind": "--tokenizer"}, "eval": {"--hyp": "--hypotheses"}}


def deprecated(old: str, new: str) -> None:
    """The one-line notice of an old spelling that still works, for one release."""
    err.print(f"note: {old} is deprecated (it goes in the next release): use {new}", markup=False)


class Command(typer.core.TyperCommand):
    """Every command's parsing: the old spellings of ``RENAMED`` rewritten (with a notice), and
    ``--json FILE`` (``--json`` is a flag now) stopped with a usage error pointing to ``-o``."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        renamed = RENAMED.get(" ".join(ctx.command_path.split()[1:]), {})
        for i, arg in enumerate(args[:end]):
            name, eq, value = arg.partition("=")
            if name in renamed:
                deprecated(name, renamed[name])
                args[i] = renamed[name] + eq + value
            following = args[i + 1] if i + 1 < end else ""
            if arg == "--json" and following.lower().endswith(".json"):
                err.print(
                    f"Error: --json is a flag (JSON on stdout): write it to a file with --json -o"
                    f" {following}",
                    markup=False,
                )
                raise typer.Exit(2)
        return super().parse_args(ctx, args)

    def get_params(self, ctx: typer.Context) -> list[Any]:
        """The options, laid out for an 80-column help page (``cli.help``), with examples."""
        params = super().get_params(ctx)
        command = " ".join(ctx.command_path.split()[1:])
        lay_out(command, params)
        self.epilog = self.epilog or examples(command)
        return params

    def invoke(self, ctx: typer.Context) -> Any:
        """The command, its runs settled first (``settle_runs``: before torch loads), and in the
        ``tformer`` process the process-wide settings (``tformer_cli.setup``)."""
        friendly_errors(settle_runs)(ctx)
        if ctx.obj is PROCESS:
            from tformer_cli import setup

            with contextlib.suppress(TformerError):  # $TFORMER_THREADS unreadable: the commands
                setup()  # that set threads (loading a run, training) say so, on one line
        return super().invoke(ctx)


# The context object ``main`` gives the app: the ``tformer`` process, whose commands apply the
# process-wide settings; a caller in its own process (a test's CliRunner) keeps its own.
PROCESS = object()


def settle_runs(ctx: typer.Context) -> None:
    """Each run given (``-m``) checked by name before torch loads; none given: the newest,
    named on stderr (not with ``--quiet``). Old spellings and compare are the command's."""
    given = ctx.params.get("model")
    if given:
        from tformer_cli.checkpoint import resolve_run  # imports no torch

        for run in given if isinstance(given, (list, tuple)) else [given]:
            resolve_run(Path(run))
        return
    option = next((p for p in ctx.command.params if p.name == "model"), None)
    if option is None or ctx.params.get("legacy") or ctx.command.name == "compare":
        return
    from tformer_cli.report.pick import default_note, default_run

    try:
        newest, passed = default_run()
    except TformerError:  # none: the command says so where it needs one
        return
    if not ctx.params.get("quiet"):
        err.print(default_note(newest, passed), markup=False, highlight=False)
    chosen = Path(newest.path)
    ctx.params["model"] = [chosen] if getattr(option, "multiple", False) else chosen


def positional(value: Any, option: Any, old: str, new: str) -> Any:
    """A run (or file) given the old way (an argument, with a notice) or as an option; both at
    once is a usage error."""
    if value is None or value == []:
        return option
    if option is not None and option != []:
        raise typer.BadParameter(f"give it once: {new}", param_hint=new.split()[-2])
    deprecated(old, new)
    return value


def option_setting(ctx: typer.Context, field: str) -> Any | None:
    """The option of ``ctx``'s command that sets the settings field ``field`` (``h``:
    ``--heads``); None where none does."""
    names = {field, option_of(field)}
    return next((p for p in ctx.command.params if p.name in names), None)


def long_form(ctx: typer.Context, field: str) -> str:
    """The option that sets ``field``, as its help writes it: ``--beam`` (not ``-k``)."""
    param = option_setting(ctx, field)
    if param is None:
        return "--" + option_of(field).replace("_", "-")
    return max(param.opts, key=len)


@contextlib.contextmanager
def from_options(ctx: typer.Context) -> Iterator[None]:
    """Settings built from ``ctx``'s options: a ``SettingError`` becomes the usage error (exit
    2) of the option that set it, its rule naming options; one no option sets stays as it is."""
    try:
        yield
    except SettingError as e:
        param = option_setting(ctx, e.field)
        if param is None:
            raise
        message = e.explained(lambda field: long_form(ctx, field))
        hint = " / ".join(f"'{name}'" for name in param.opts)  # as click names it: '--beam' / '-k'
        raise typer.BadParameter(message, ctx=ctx, param=param, param_hint=hint) from None


def wrote(path: Path, quiet: bool = False) -> None:
    """The line on stderr that names a file a command was told to write, once it is written."""
    if not quiet:
        err.print(f"wrote {path}", markup=False, highlight=False)


@contextlib.contextmanager
def destination(output: Path | None, quiet: bool = False) -> Iterator[Console]:
    """Where a command prints: stdout, or ``output`` (``-o FILE``), written whole at the end."""
    if output is None:
        yield out
        return
    from tformer_cli.files import atomic_write_text

    buffer = io.StringIO()
    yield Console(file=buffer, width=out.width, highlight=False, soft_wrap=True, no_color=True)
    atomic_write_text(output, buffer.getvalue())
    wrote(output, quiet)


def version_callback(value: bool) -> None:
    if value:
        out.print(f"tformer {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Train, run and study a from-scratch Transformer for machine translation."""


# ---------------------------------------------------------------------------- engines
def check_engine(engine: str, cfg: DecodeConfig, runs: int = 1, cache: bool = True) -> None:
    """A usage error for a search ``cfg`` of ``runs`` runs that ``--engine`` cannot do, before
    anything is loaded (the option's values name the engines)."""
    why = engine_refusal(engine, cfg, runs, cache)
    if why is not None:
        raise typer.BadParameter(why, param_hint="--engine")
