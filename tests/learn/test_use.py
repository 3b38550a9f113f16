"""Tests for tformer_cli.learn.use: a learner's functions translating inside a trained run
(``tformer translate --use``, ``tformer.load(use=...)``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

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


def no_scale(use: Use) -> Use:
    """``use`` with the no-scale mistake's attention, past the check that keeps it out."""
    return dataclasses.replace(use, functions={**use.functions, "attention": NO_SCALE.fn})


def test_the_no_scale_mistake_changes_the_translations_and_fails_its_check(
    toy_run: Path, solutions_file: Path, no_scale_file: Path, toy_test: list[str]
) -> None:
    run = tformer.load(toy_run, compile="off")
    right = tokens(run, toy_test[:20])
    run.use = no_scale(prepare(solutions_file))
    assert tokens(run, toy_test[:20]) != right
    # through a file, the check keeps the mistake out: tformer's attention translates
    from_file = prepare(no_scale_file)
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


# ---------------------------------------------------------------------------- eval
def evaluated(toy_run: Path, out: Path, *args: str) -> tuple[dict[str, Any], str, str]:
    """``tformer eval`` of the first 10 toy test pairs: its JSON report, hypotheses, stderr."""
    hyps, report = out.with_suffix(".txt"), out.with_suffix(".json")
    result = CliRunner().invoke(
        app,
        ["eval", "-m", str(toy_run), "--limit", "10", "--json", "-o", str(report),
         "--hypotheses", str(hyps), *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text()), hyps.read_text(), result.stderr


def test_eval_use_scores_what_compile_off_scores_and_keeps_no_result(
    toy_run: Path, solutions_file: Path, no_scale_file: Path, tmp_path: Path
) -> None:
    own, own_hyps, _ = evaluated(toy_run, tmp_path / "own", "--compile", "off")
    kept = set((toy_run / "evals").glob("*.json"))  # the run's own result
    yours, hyps, said = evaluated(toy_run, tmp_path / "yours", "--use", str(solutions_file))
    assert set((toy_run / "evals").glob("*.json")) == kept  # yours is not the run's
    assert hyps == own_hyps and hyps.strip()
    for part in ("greedy", "beam", "exposure_gap"):
        assert {k: v for k, v in yours[part].items() if k != "seconds"} == pytest.approx(
            {k: v for k, v in own[part].items() if k != "seconds"}
        ), part
    assert "--compile off" in said and "using your sinusoidal_positions, attention" in said
    # the no-scale mistake: kept out by its check, tformer's attention scores
    _, mistaken_hyps, said = evaluated(toy_run, tmp_path / "mistaken", "--use", str(no_scale_file))
    assert "tformer's own for: attention" in said and mistaken_hyps == own_hyps


def test_evaluate_with_use_scores_the_learner_s_functions(
    toy_run: Path, solutions_file: Path, tmp_path: Path
) -> None:
    run = tformer.load(toy_run, use=solutions_file)
    assert run.use is not None
    run.evaluate(limit=10, hyp_path=tmp_path / "right.txt")
    run.use = no_scale(run.use)
    run.evaluate(limit=10, hyp_path=tmp_path / "wrong.txt")
    assert (tmp_path / "wrong.txt").read_text() != (tmp_path / "right.txt").read_text()
    with pytest.raises(tformer.TformerError, match="save"):
        run.evaluate(limit=10, save=True)


def test_eval_use_with_ctranslate2_is_a_usage_error(toy_run: Path, solutions_file: Path) -> None:
    result = CliRunner().invoke(
        app, ["eval", "-m", str(toy_run), "--use", str(solutions_file), "--engine", "ctranslate2"]
    )
    assert result.exit_code == 2 and "--use" in result.stderr


# ---------------------------------------------------------------------------- inspect-attention
def inspected(toy_run: Path, *args: str) -> Result:
    result = CliRunner().invoke(
        app,
        ["inspect-attention", "-m", str(toy_run), "the dog sees the cat .", "--no-align", *args],
    )
    assert result.exit_code == 0, result.output
    return result


def test_inspect_attention_use_shows_the_weights_of_tformer_s_own_functions(
    toy_run: Path, solutions_file: Path
) -> None:
    own = json.loads(inspected(toy_run, "--json").stdout)
    yours = inspected(toy_run, "--json", "--use", str(solutions_file))
    assert "using your sinusoidal_positions, attention" in yours.stderr
    theirs = json.loads(yours.stdout)
    assert theirs["tgt_tokens"] == own["tgt_tokens"]
    for kind, maps in own["attention"].items():  # printed to 6 decimals
        weights = torch.tensor(theirs["attention"][kind]["weights"])  # (layers, h, T, S)
        torch.testing.assert_close(weights, torch.tensor(maps["weights"]), atol=2e-6, rtol=0)
    drawn = inspected(toy_run, "--use", str(solutions_file))
    assert "translation (greedy): " + own["translation"] in drawn.stdout


def test_run_attention_calls_the_learner_s_functions(toy_run: Path, solutions_file: Path) -> None:
    run = tformer.load(toy_run, compile="off")
    calls: Counter[str] = Counter()
    run.use = counted(prepare(solutions_file), calls)
    run.attention("the dog sees the cat .", target="der hund sieht die katze .", align=False)
    assert calls["attention"] > 0 and calls["embed"] > 0
