"""The README's "A five-minute tour", run as printed: each ``$`` command of the section, in order,
in an empty folder, where its ``tformer train`` commands make the runs the way ``make demo``
does (``runs/toy-<time>``, then ``small``). To take seconds, not minutes, every training gets a
tiny budget and the toy corpus is cut to its first lines; outputs then differ from the README's,
so each command is checked for exit 0, some output and no traceback. ``serve`` is started in the
background, sent the ``curl`` printed after it, and stopped."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, checkout_first_env
from tformer_cli.cli import app
from tformer_cli.data import corpus

README = REPO / "README.md"
TOUR = "## A five-minute tour"
# Commands the README prints with a prompt outside the tour, each run elsewhere or not at all:
# a Hub download, the Multi30k recipes (tens of minutes), the CUDA install.
EXEMPT = ("tformer import hf:", "tformer train --preset multi30k", "python3 -m venv")
# Appended to each `tformer train` of the tour: the same command, a budget of seconds.
BUDGET = [
    "--layers", "1", "--vocab-size", "200", "--max-tokens", "256", "--epochs", "0",
    "--max-steps", "6", "--valid-every", "2", "--valid-bleu-size", "4", "--device", "cpu",
]  # fmt: skip
TOY_LINES = {"train": 400, "valid": 20, "test": 20}  # of the bundled toy corpus's splits


def prompted(text: str) -> list[str]:
    """The ``$ `` command lines of code blocks in ``text``, continuation lines (``\\``) joined."""
    commands, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and (pending or line.startswith("$ ")):
            pending += line.removeprefix("$ ").strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                commands.append(pending)
                pending = ""
    return commands


def tour_section(readme: str) -> str:
    """The tour: from its heading to the next section's."""
    start = readme.index(TOUR)
    end = readme.find("\n## ", start + len(TOUR))
    return readme[start : end if end != -1 else None]


def test_the_tour_has_its_commands_and_only_the_exempt_are_prompted_elsewhere():
    readme = README.read_text(encoding="utf-8")
    tour = prompted(tour_section(readme))
    assert split(tour[0])[0] == ["tformer", "train"]  # first, the run make demo trains:
    assert "\t$(BIN)/tformer train\n" in (REPO / "Makefile").read_text(encoding="utf-8")
    assert any("--name small" in c for c in tour)  # the run that compare and average use
    elsewhere = [c for c in prompted(readme) if c not in tour]
    assert [c for c in elsewhere if not c.startswith(EXEMPT)] == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def short_toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bundled toy corpus cut to its first lines (alignments too), as ``toy`` in this
    process."""
    source = corpus.toy_corpus_dir()
    folder = tmp_path / "toy"
    folder.mkdir()
    for name, n in TOY_LINES.items():
        for suffix in ("tsv", "align"):
            lines = (source / f"{name}.{suffix}").read_text(encoding="utf-8").splitlines()[:n]
            (folder / f"{name}.{suffix}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(corpus, "_REPO_TOY_DIR", folder)
    return folder


class Server:
    """``tformer serve ARGS`` in the background (its own process: it serves until stopped)."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        command = [sys.executable, "-m", "tformer_cli", *args]
        env = checkout_first_env(TFORMER_THREADS="1")
        self.proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output: str | None = None

    def post(self, url: str, headers: dict[str, str], body: str) -> dict:
        """POST ``body`` once the server answers (it loads torch and the run first)."""
        request = urllib.request.Request(url, body.encode(), headers, method="POST")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return json.loads(answer.read())
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve never answered: {self.stop()}") from None
                time.sleep(0.1)

    def stop(self) -> str:
        """Stop it (once); what it printed."""
        if self.proc.returncode is None:
            self.proc.terminate()
        if self.output is None:
            self.output = self.proc.communicate(timeout=30)[0]
        return self.output


def curl(args: list[str], port: int) -> tuple[str, dict[str, str], str]:
    """The URL, headers and body of the tour's ``curl -s URL -H ... -d ...``, on ``port``."""
    url = next(a for a in args[1:] if not a.startswith("-") and "localhost" in a)
    headers = dict([args[args.index("-H") + 1].split(": ", 1)])
    body = args[args.index("-d") + 1]
    return "http://" + re.sub(r":\d+", f":{port}", url, count=1), headers, body


def on_port(args: list[str], port: int) -> list[str]:
    """``args`` with ``--port``'s value replaced: a free port, not the README's."""
    at = args.index("--port") + 1
    return [*args[:at], str(port), *args[at + 1 :]]


def split(command: str) -> tuple[list[str], str | None]:
    """A command's words (its ``# comment`` dropped), and the text piped in by ``echo ... |``."""
    words = shlex.split(command, comments=True)
    if "|" not in words:
        return words, None
    bar = words.index("|")
    assert words[0] == "echo", command
    return words[bar + 1 :], " ".join(words[1:bar]) + "\n"


@pytest.mark.slow
def test_every_command_of_the_tour_runs_as_printed(tmp_path, monkeypatch, short_toy):
    """In order; ``serve`` starts as soon as the tour's first command has trained its run (it
    loads for seconds while the next commands run), and answers the ``curl`` printed after it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    commands = prompted(tour_section(README.read_text(encoding="utf-8")))
    [serve] = [split(c)[0][1:] for c in commands if c.startswith("tformer serve")]
    runner, server, port = CliRunner(), None, free_port()
    said = []  # each command, its seconds and the first line it printed (pytest -s shows them)
    try:
        for command in commands:
            start, (args, stdin) = time.perf_counter(), split(command)
            if args[0] == "curl":
                assert server is not None, f"{command}: no tformer serve before it"
                answer = server.post(*curl(args, port))
                assert answer["translations"][0]["hypotheses"], answer
                said.append((command, time.perf_counter() - start, json.dumps(answer)))
                continue
            assert args[0] == "tformer", command
            if args[1] != "serve":
                budget = BUDGET if args[1] == "train" else []
                result = runner.invoke(app, [*args[1:], *budget], input=stdin)
                assert result.exit_code == 0, f"{command}\n{result.output}"
                assert result.stdout.strip() and "Traceback" not in result.output, command
                said.append((command, time.perf_counter() - start, result.stdout.splitlines()[0]))
            server = server or Server(on_port(serve, port), work)
    finally:
        if server is not None:
            server.stop()
    print("".join(f"\n$ {c}\n    ({s:.1f} s) {first[:90]}" for c, s, first in said))
    assert len(said) == len(commands) - 1  # all but serve, which the curl checked
