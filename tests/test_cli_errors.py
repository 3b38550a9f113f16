"""One rule for errors (docs/cli.md, "Exit codes"), checked on every option of every command:
a value that no run or machine could take is Typer's usage error, exit 2, its panel naming the
option by its long form. The bad values come from each option's declaration and from the
settings field it sets (below the minimum, above the maximum, ``nan``, a word for a number, an
unknown choice), so an option declared without its range or choices fails here. The command
never runs: a value the parser lets through reaches a body stubbed to exit 1, as a check against
a run or machine would, and fails the test.

Also: a ``SettingError`` of the settings objects as the command line says it (by the option's
long form) and Python (by the keyword); the server's 422 naming the field: test_serve.py."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
import typer.main
import typer.testing
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.cli.app import Command, from_options
from tformer_cli.cli.options import Parsed
from tformer_cli.config import (
    TRAIN_OPTIONS,
    AttentionOptions,
    DecodeConfig,
    DecodeOptions,
    EvalOptions,
    OneOf,
    Pattern,
    Range,
    SamplingConfig,
    ServeOptions,
)
from tformer_cli.errors import SettingError

runner = CliRunner()
ROOT = typer.main.get_command(app)

PATHS = ("file", "output", "trace", "save", "hypotheses", "src_file", "tgt_file",
         "valid_src_file", "valid_tgt_file", "tokenizer_file", "init_from", "resume", "runs_dir",
         "tensorboard", "use")  # fmt: skip
# The options whose values only a run, the data or the machine can judge, with why.
EXEMPT = {
    "model": "a run folder, or a name under runs/: found or not",
    **dict.fromkeys(PATHS, "a file or folder: the file system's to judge when the command runs"),
    "data": "a corpus: toy, a folder, a file or hf:NAME, found or not",
    "src": "a language suffix of the data's file names",
    "tgt": "a language suffix of the data's file names",
    "preset": "a shipped recipe's name or a .toml file",
    "name": "a run name, free or taken in the runs folder",
    "host": "an address this machine can listen on, or not",
    "rdzv_endpoint": "torchrun's HOST[:PORT], reachable or not",
    "only": "an exercise's name, read from the catalogue when the command runs (a usage error"
    " too: tests/learn)",
}


def commands() -> dict[str, Any]:
    """Every command by its path (``tokenizer train`` too), walked from the Typer app."""
    found: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                found[prefix + name] = command

    walk(ROOT, "")
    return found


def valued_options() -> list[tuple[str, Any]]:
    """(command, option) for every option that takes a value (flags and --help aside)."""
    return [
        (path, param)
        for path, command in commands().items()
        for param in command.params
        if param.param_type_name == "option" and not param.is_flag and param.name != "help"
    ]


def declared(param: Any) -> tuple[Any, Any, Any]:
    """What an option's declaration says of its values: (the annotation's type, its Typer
    ``min``/``max`` as a Range or None, its ``Parsed`` parser or None), from Typer >= 0.29's
    type descriptor or from the click type of older Typers."""
    described = getattr(param, "type_descriptor", None)
    if described is not None:
        info = described.parameter_info
        bounds = None if info.min is None and info.max is None else Range(info.min, info.max)
        kind = getattr(described.annotation, "__origin__", None) or described.annotation
        return kind, bounds, info.parser if isinstance(info.parser, Parsed) else None
    kind = param.type  # click's: IntRange, INT, FuncParamType(Parsed) ...
    parser = getattr(kind, "func", None)
    if hasattr(kind, "min") or hasattr(kind, "max"):
        return int, Range(kind.min, kind.max), None
    return (
        {"integer": int}.get(kind.name, str),
        None,
        parser if isinstance(parser, Parsed) else None,
    )


def settings_values(path: str, param: Any) -> Any:
    """The values of the settings field an option sets, where it sets one: a train option's
    (train, tokenizer train), else the search's (``DecodeConfig``, ``SamplingConfig``) or a
    job's settings object's."""
    if path in ("train", "tokenizer train"):
        return getattr(TRAIN_OPTIONS.get(param.name), "values", None)
    jobs = (EvalOptions, AttentionOptions, ServeOptions)
    for config in (DecodeConfig, SamplingConfig, *jobs):
        fields = {f.name: f for f in dataclasses.fields(config)}
        if param.name in fields:
            return fields[param.name].metadata.get("values")
    return None


def bad_values(path: str, param: Any) -> list[str]:
    """Values of ``param`` that its declaration refuses, or the settings field it sets: values
    no run or machine could take."""
    kind, bounds, parser = declared(param)
    number = kind is int or (parser is not None and parser.kind in (int, float))
    values: list[Any] = ["abc"] if number else []
    if parser is not None and parser.kind is float:
        values += ["nan", "inf"]
    for allowed in (parser.allowed if parser else bounds, settings_values(path, param)):
        if isinstance(allowed, Range):
            if allowed.low is not None:
                values.append(allowed.low if allowed.low_open else allowed.low - 1)
            if allowed.high is not None:
                values.append(allowed.high if allowed.high_open else allowed.high + 1)
        if isinstance(allowed, OneOf):
            values.append("no-such-choice")
        if isinstance(allowed, Pattern):
            values.append("?")
    return list(dict.fromkeys(str(v) for v in values))


CASES = [(path, p) for path, p in valued_options() if p.name not in EXEMPT]


def test_every_option_has_bad_values_or_is_exempt_by_name():
    """A new option gets a declared range or set, or an exemption that says why; an exemption
    never hides an option that declares its values."""
    untyped = [f"{path} {p.opts[0]}" for path, p in CASES if not bad_values(path, p)]
    assert not untyped, f"declare their values, or exempt them: {untyped}"
    hidden = [f"{path} {p.opts[0]}" for path, p in valued_options()
              if p.name in EXEMPT and (declared(p)[1] or declared(p)[2])]  # fmt: skip
    assert not hidden, hidden
    assert {p.name for _, p in valued_options()} >= set(EXEMPT)  # no stale exemption


@pytest.fixture(scope="module", autouse=True)
def built_once() -> Iterator[None]:
    """The app built once: Typer rebuilds it on every ``invoke`` otherwise."""
    build = getattr(typer.testing, "_get_command", typer.main.get_command)
    with pytest.MonkeyPatch.context() as patch:  # raising=False: a newer Typer just rebuilds
        patch.setattr(
            typer.testing, "_get_command", lambda a: ROOT if a is app else build(a), raising=False
        )
        yield


@pytest.fixture
def stubbed(monkeypatch) -> None:
    """Every command's body stubbed to exit 1: a value past the parser fails the test
    without any work."""

    def ran(self: Any, ctx: typer.Context) -> None:
        raise typer.Exit(1)

    monkeypatch.setattr(Command, "invoke", ran)


def given_the_rest(command: Any, tested: Any) -> list[str]:
    """Valid values for the command's required parameters besides ``tested``: the argument
    ``x``, a required option its first choice (``x`` where it has none)."""
    args = []
    for param in command.params:
        if not param.required or param is tested:
            continue
        if param.param_type_name == "argument":
            args.append("x")
        else:  # its first choice, or a name (a required path: distill -o)
            parser = declared(param)[2]
            args += [param.opts[0], parser.allowed.choices[0] if parser else "x"]
    return args


def panel(text: str) -> str:
    """Typer's usage panel as one line: its box drawn away, its wrapped lines joined."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize(("path", "param"), CASES, ids=[f"{path} {p.opts[0]}" for path, p in CASES])
def test_a_value_no_run_could_take_is_a_usage_error_naming_the_option(stubbed, path, param):
    long = max(param.opts, key=len)
    typed = min(param.opts, key=len)  # -k for --beam: the panel still names --beam
    rest = given_the_rest(commands()[path], param)
    for value in bad_values(path, param):
        result = runner.invoke(app, [*path.split(), *rest, typed, value])
        assert result.exit_code == 2, f"{typed} {value}: exit {result.exit_code}\n{result.output}"
        text = panel(result.stderr)
        assert text.startswith("Usage: ") and f"Invalid value for '{long}'" in text, text
        assert "Traceback" not in result.output


def test_a_parsed_option_takes_the_values_of_the_setting_it_sets():
    """One declaration, two faces: --top-p refuses what SamplingConfig(top_p=...) refuses."""
    pairs = [(declared(p)[2], settings_values(path, p)) for path, p in CASES]
    same = [parser.allowed == own for parser, own in pairs if parser and own is not None]
    assert all(same) and len(same) >= 30  # translate, eval, compare, train, tokenizer train


def test_export_quantizations_are_ctranslate2_s():
    from tformer_cli.config import QUANTIZATIONS

    ct2 = pytest.importorskip("tformer_cli.interop.ct2")
    assert ct2.QUANTIZATIONS is QUANTIZATIONS  # declared once, in config


# ---------------------------------------------------------------------------- a SettingError
def context(path: str) -> typer.Context:
    return typer.Context(commands()[path], info_name=f"tformer {path}")


def test_the_command_line_names_a_setting_by_its_option_s_long_form():
    with pytest.raises(typer.BadParameter) as error, from_options(context("translate")):
        SamplingConfig(top_p=2.0)
    assert error.value.param.name == "top_p"
    assert error.value.format_message() == "Invalid value for '--top-p': 2.0 must be in (0, 1]"
    with pytest.raises(typer.BadParameter) as error, from_options(context("translate")):
        DecodeOptions(beam=2, nbest=3)  # the rule's other setting: an option too
    assert error.value.format_message() == "Invalid value for '--nbest': 3 needs --beam >= 3"
    with pytest.raises(typer.BadParameter) as error, from_options(context("eval")):
        DecodeConfig(beam=0)
    message = "Invalid value for '--beam' / '-k': 0 must be at least 1"
    assert error.value.format_message() == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", "x", "-k", "2", "--nbest", "3"], "'--nbest': 3 needs --beam >= 3"),
        (["eval", "--top-k", "3"], "'--top-k': 3 needs --sample or --mbr"),
        (["train", "--scheduled-sampling", "exp", "--ss-k", "5"],
         "'--ss-k': 5.0 must be in (0, 1] for --scheduled-sampling exp"),
        (["train", "--scheduled-sampling", "inverse-sigmoid", "--ss-k", "0.5"],
         "'--ss-k': 0.5 must be at least 1 for --scheduled-sampling inverse-sigmoid"),
    ],
)  # fmt: skip
def test_the_command_line_says_it_with_the_usage_panel_before_anything_loads(
    tmp_path, monkeypatch, args, message
):
    """In a folder without runs or data: what loaded first would fail with exit 1. (train's:
    test_config.py.)"""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert f"Invalid value for {message}" in panel(result.stderr)
    assert not any(tmp_path.iterdir())


def test_a_setting_no_option_sets_stays_a_one_line_error():
    with pytest.raises(SettingError), from_options(context("translate")):
        raise SettingError("activation", "gelu", "must be one of relu, silu")


def test_python_names_a_setting_by_its_keyword():
    with pytest.raises(SettingError) as error:
        SamplingConfig(top_p=2.0)
    assert str(error.value) == "top_p=2.0: must be in (0, 1]"
    assert (error.value.field, error.value.value) == ("top_p", 2.0)
