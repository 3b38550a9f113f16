"""docs/cli.md's option tables are the commands' own: rendered from the Typer app, so a changed
option fails here until the page is regenerated with ``python -m tests.test_cli_docs``. The help
pages agree with it (usage lines, the order of the commands)."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import REPO
from tformer_cli.cli import app

PAGE = REPO / "docs" / "cli.md"
HEADING = "## Options\n"
ORDER = [
    "train", "average", "translate", "inspect-attention", "eval", "runs", "show", "compare",
    "serve", "export", "import", "tokenizer train",
]  # fmt: skip


def cell(text: str) -> str:
    """``text`` as one Markdown table cell: pipes escaped, '<' as an entity."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def commands() -> dict[str, Any]:
    """Every (click) command by its name, ``tokenizer train`` included."""
    root = typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        if hasattr(command, "commands"):  # a group
            found.update({f"{name} {n}": c for n, c in command.commands.items()})
        else:
            found[name] = command
    return found


def usage_piece(argument: Any) -> str:
    """An argument as the usage line shows it: ``TEXT``, ``[RUN]`` or ``[TEXTS]...``."""
    name = argument.name.upper()
    if argument.nargs == -1:
        return f"[{name}]..."
    return name if argument.required else f"[{name}]"


def section(name: str, command: Any) -> str:
    """One command's heading, summary, usage, arguments and option table."""
    summary = (command.help or "").strip().split("\n\n")[0]
    lines = [f"### `tformer {name}`", "", " ".join(summary.split()), ""]
    arguments = [p for p in command.params if p.param_type_name == "argument" and not p.hidden]
    usage = ["[OPTIONS]", *(usage_piece(a) for a in arguments)]
    lines += [f"usage: `tformer {name} {' '.join(usage)}`", ""]
    for argument in arguments:
        help_text = cell(getattr(argument, "help", "") or "")
        lines.append(f"- `{argument.name.upper()}`: {help_text}")
    if arguments:
        lines.append("")
    lines += ["| option | default | meaning |", "|---|---|---|"]
    for option in command.params:
        if option.param_type_name != "option" or option.hidden or option.name == "help":
            continue
        names = ", ".join(f"`{n}`" for n in [*option.opts, *option.secondary_opts])
        default = option.default
        unset = default is None or default is False or default == () or callable(default)
        shown = "" if unset else default
        if option.is_flag and option.secondary_opts:
            shown = "on" if default else "off"
        lines.append(f"| {names} | {cell(str(shown))} | {cell(option.help or '')} |")
    return "\n".join(lines) + "\n"


def rendered() -> str:
    found = commands()
    return HEADING + "\n" + "\n".join(section(name, found[name]) for name in ORDER)


def test_every_command_is_on_the_page():
    assert set(commands()) == set(ORDER)


def test_the_option_tables_are_the_commands_own():
    text = PAGE.read_text(encoding="utf-8")
    assert HEADING in text
    assert text[text.index(HEADING) :] == rendered(), "run: python -m tests.test_cli_docs"


# ---------------------------------------------------------------------------- help pages
def help_page(*path: str) -> str:
    """``tformer PATH --help`` at 80 columns."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("name", ORDER)
def test_the_usage_line_shows_the_arguments_as_this_page_does(name):
    """``TEXT``, ``[RUN]``, ``[TEXTS]...`` (no ``{text}``), and no hidden argument: the old
    spellings still work, but no panel explains them."""
    page = help_page(*name.split())
    usage = next(line for line in page.splitlines() if "Usage:" in line).split()
    arguments = [p for p in commands()[name].params if p.param_type_name == "argument"]
    shown = [usage_piece(a) for a in arguments if not a.hidden]
    assert usage == ["Usage:", "tformer", *name.split(), "[OPTIONS]", *shown]
    assert not re.search(r"\{[a-z_]+\}", page)


def test_tformer_h_lists_the_commands_in_this_page_s_order():
    listed = re.findall(r"^│ ([a-z][a-z-]*) ", help_page(), re.MULTILINE)
    assert listed == list(dict.fromkeys(name.split()[0] for name in ORDER))


if __name__ == "__main__":  # rewrite the page's option tables
    text = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(text[: text.index(HEADING)] + rendered(), encoding="utf-8")
    sys.exit(0)
