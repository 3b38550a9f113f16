"""Tests for tformer_cli.cli.learn, run in-process: start, check, solutions, --only, the exit
codes an autograder reads, and one-line errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.learn.exercises import EXERCISES

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)


def invoke(*args: object):
    return runner.invoke(app, ["learn", *(str(a) for a in args)])


def rows(stdout: str) -> list[list[str]]:
    """The first line of each exercise's row: name and status."""
    names = {e.name for e in EXERCISES}
    return [
        line.split()
        for line in stdout.splitlines()
        if line.split()[:1] and line.split()[0] in names
    ]


def test_start_then_check_lists_every_exercise_as_not_written_yet(tmp_path):
    started = invoke("start", tmp_path / "ex")
    assert started.exit_code == 0 and "17 exercises" in started.stdout, started.output
    checked = invoke("check", tmp_path / "ex")
    assert checked.exit_code == 1
    assert rows(checked.stdout) == [[e.name, "not", "written", "yet"] for e in EXERCISES]
    assert "17 exercises, 17 not written yet" in checked.stdout


def test_tformer_s_solutions_pass_every_exercise(tmp_path):
    assert invoke("solutions", tmp_path / "ex").exit_code == 0
    checked = invoke("check", tmp_path / "ex" / "solutions.py")
    assert checked.exit_code == 0, checked.output
    assert rows(checked.stdout) == [[e.name, "passed"] for e in EXERCISES]
    one = invoke("check", tmp_path / "ex", "--only", "beam_search")  # the folder: solutions.py
    assert one.exit_code == 0 and rows(one.stdout) == [["beam_search", "passed"]]


def test_a_failure_prints_its_details_and_exits_1(tmp_path):
    (tmp_path / "exercises.py").write_text(
        "def length_penalty(length, alpha):\n    return length ** alpha\n", encoding="utf-8"
    )
    checked = invoke("check", tmp_path, "--only", "length_penalty")
    assert checked.exit_code == 1
    assert rows(checked.stdout) == [
        ["length_penalty", "failed:", "lp(Y)", "=", "|Y|", "**", "alpha"]
    ]
    assert "hint: GNMT's penalty is ((5 + |Y|) / 6) ** alpha" in checked.stdout
    assert "tformer's: tformer_cli/decode/reference.py: length_penalty" in checked.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "nowhere"], "no such file or folder: nowhere"),
    ],
)
def test_bad_input_is_one_line_on_stderr(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]


def test_an_unknown_exercise_is_a_usage_error_naming_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("check", ".", "--only", "nope")
    assert result.exit_code == 2
    assert "Invalid value for '--only'" in result.stderr and "'nope'" in result.stderr
