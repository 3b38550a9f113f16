"""Tests for tformer_cli.learn.use: a learner's functions translating inside a trained run
(``tformer translate --use``, ``tformer.load(use=...)``)."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tformer_cli as tformer
from tests.interop.conftest import TEST_SENTENCES, toy_pairs
from tformer_cli.cli import app
from tformer_cli.learn.mistakes import MISTAKES
from tformer_cli.learn.use import ACTING, Use, prepare
from tformer_cli.model.attention import MultiHeadAttention

NO_SCALE = next(m for m in MISTAKES if m.name == "no_scale")


@pytest.fixture(autouse=True)
def one_thread_in_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFORMER_THREADS", "1")


@pytest.fixture(scope="module")
def toy_test() -> list[str]:
    return toy_pairs("test", TEST_SENTENCES)[0]


def tokens(run: tformer.Run, texts: list[str]) -> list[list[str]]:
    return [t.nbest[0].tokens for t in run.translate(texts, beam=1)]


def counted(use: Use, calls: Counter[str]) -> Use:
    """``use`` with each function wrapped to count its calls in ``calls``."""

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counting(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return counting

    return dataclasses.replace(use, functions={n: wrap(n, f) for n, f in use.functions.items()})


def test_a_complete_correct_set_translates_as_tformer_on_100_toy_sentences(
    toy_run: Path, solutions_file: Path, toy_test: list[str]
) -> None:
    own = tformer.load(toy_run, compile="off")
    yours = tformer.load(toy_run, use=solutions_file)
    assert yours.use is not None and yours.use.learners == list(ACTING)
    assert tokens(yours, toy_test) == tokens(own, toy_test)


def test_every_swapped_function_is_called_and_put_back(
    toy_run: Path, solutions_file: Path, toy_test: list[str]
) -> None:
    run = tformer.load(toy_run, compile="off")
    calls: Counter[str] = Counter()
    run.use = counted(prepare(solutions_file), calls)
    run.translate(toy_test[:4], beam=2)
    assert set(calls) == set(ACTING), calls
    assert all(n > 0 for n in calls.values())
    calls.clear()
    run.use = None
    run.translate(toy_test[:4], beam=2)
    assert not calls  # put back: tformer's own functions again
    attention = [m for m in run.loaded[0].model.modules() if isinstance(m, MultiHeadAttention)]
    assert not any(m.explicit for m in attention)


def test_the_no_scale_mistake_changes_the_translations_and_fails_its_check(
    toy_run: Path, solutions_file: Path, toy_test: list[str]
) -> None:
    run = tformer.load(toy_run, compile="off")
    use = prepare(solutions_file)
    right = tokens(run, toy_test[:20])
    run.use = dataclasses.replace(use, functions={**use.functions, "attention": NO_SCALE.fn})
    assert tokens(run, toy_test[:20]) != right
    # through a file, the check keeps the mistake out: tformer's attention translates
    mistaken = solutions_file.parent / "no_scale.py"
    source = solutions_file.read_text(encoding="utf-8")
    mistaken.write_text(source.replace("/ math.sqrt(q.size(-1))", ""), encoding="utf-8")
    from_file = prepare(mistaken)
    assert "attention" not in from_file.learners and "write_cache" in from_file.learners
    assert "tformer's own for: attention" in from_file.line()


def test_translate_use_prints_what_compile_off_prints_and_names_the_pieces(
    toy_run: Path, solutions_file: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    folder = tmp_path / "ex"
    folder.mkdir()
    shutil.copy(solutions_file, folder / "solutions.py")
    sentence = "the dog sees the cat ."
    own = runner.invoke(app, ["translate", "-m", str(toy_run), "--compile", "off", sentence])
    yours = runner.invoke(app, ["translate", "-m", str(toy_run), "--use", str(folder), sentence])
    assert own.exit_code == 0 and yours.exit_code == 0, yours.output
    assert yours.stdout == own.stdout and yours.stdout.strip()
    assert "--compile off" in yours.stderr
    assert "using your sinusoidal_positions, attention, causal_mask" in yours.stderr


def test_use_with_ctranslate2_is_a_usage_error(toy_run: Path, solutions_file: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["translate", "-m", str(toy_run), "--use", str(solutions_file), "--engine",
         "ctranslate2", "a dog ."],
    )  # fmt: skip
    assert result.exit_code == 2 and "--use" in result.stderr


def test_use_of_a_missing_file_is_a_one_line_error(toy_run: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["translate", "-m", str(toy_run), "--use", str(tmp_path / "nope.py"), "a dog ."]
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "no such file" in lines[0], result.stderr
