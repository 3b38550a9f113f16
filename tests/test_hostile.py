"""Hostile input for every command: bad bytes, control characters, huge and empty lines, CRLF,
damaged run folders, out-of-range options, unwritable outputs, no CUDA, an unreachable Hub,
Ctrl-C.

The contract checked here (docs/cli.md, "Exit codes"): a value that no run or machine could
take (out of an option's range or choices, not a number, ``nan``, options at odds) is a usage
error, Typer's usage panel naming the option with exit 2 (every option's: test_cli_errors.py);
what this run, file or machine cannot honour is one line on stderr starting ``Error: `` (exit 1;
130 for Ctrl-C), never a traceback. A failed command loses nothing already saved: the files of
a run folder keep their bytes.

Most cases run in-process through ``CliRunner`` on one untrained run folder built once for the
module (copied for the cases that damage it); three run the real console script in a subprocess,
to prove that no traceback reaches a terminal.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import typer
import typer.main
import typer.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import WORDS, reversal_pairs, tiny_config
from tformer_cli import cli
from tformer_cli.cli import app

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def plain_environment(tmp_path, monkeypatch):
    """An empty working folder (no runs/), no TFORMER_DEBUG (which re-raises errors), one torch
    thread, and a wide terminal so that no message is wrapped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.setenv("COLUMNS", "200")
    if hasattr(cli, "err"):
        monkeypatch.setattr(cli.err, "_width", 200, raising=False)


@pytest.fixture(autouse=True)
def no_thread_raise(monkeypatch):
    """The trainer would raise torch's thread count on the shared two-core machine."""
    from tformer_cli.training import bookkeeping as training

    monkeypatch.setattr(training, "setup_threads", lambda: None)


def write_corpus(folder: Path, newline: str = "\n") -> Path:
    """train/valid/test.tsv of the word-reversal task of ``tests/conftest.py`` (40/6/6 pairs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", 40, 1), ("valid", 6, 2), ("test", 6, 3)):
        text = "".join(f"{s}\t{t}{newline}" for s, t in reversal_pairs(n, seed))
        (folder / f"{name}.tsv").write_bytes(text.encode())
    return folder


def write_tokenizer(path: Path):
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer([" ".join(WORDS)] * 3, vocab_size=40, kind="wordlevel", min_frequency=1)
    save_tokenizer(tok, path)
    return tok


def build_run(run_dir: Path, corpus: Path, seed: int = 0, **train: object) -> Path:
    """An untrained but complete run (as conftest's ``make_run``), whose data is ``corpus``."""
    from tformer_cli.checkpoint import RunConfig, atomic_torch_save
    from tformer_cli.config import TrainConfig
    from tformer_cli.model import Transformer

    tok = write_tokenizer(run_dir / "tokenizer.json")
    cfg = tiny_config(vocab_size=tok.get_vocab_size())
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    settings_ = dict(data=str(corpus), device="cpu", precision="fp32", **train)
    RunConfig(cfg, TrainConfig(**settings_)).save(run_dir)  # type: ignore[arg-type]
    atomic_torch_save(run_dir / "model.pt", model.state_dict())
    return run_dir


@pytest.fixture(scope="module", autouse=True)
def command_built_once():
    """Typer's ``CliRunner`` builds the click command from the app on every ``invoke`` (half
    the time of a failing command): build it once for this module."""
    command = typer.main.get_command(app)
    build = getattr(typer.testing, "_get_command", typer.main.get_command)
    with pytest.MonkeyPatch.context() as patch:  # raising=False: a newer Typer just rebuilds
        patch.setattr(
            typer.testing,
            "_get_command",
            lambda a: command if a is app else build(a),
            raising=False,
        )
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("hostile-corpus") / "corpus")


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus) -> Path:
    """One run folder for every case that leaves it whole (none writes into it)."""
    return build_run(tmp_path_factory.mktemp("hostile-run") / "run", corpus, max_len=64)


@pytest.fixture
def run_copy(run, tmp_path) -> Path:
    """A copy of the module's run, for the cases that damage it."""
    return Path(shutil.copytree(run, tmp_path / "copy"))


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself) with its bytes."""
    if path.is_file():
        return {".": path.read_bytes()}
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------- assertions
def invoke(*args: object, input: bytes | str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def lines_of(text: str) -> list[str]:
    return [line for line in ANSI.sub("", text).splitlines() if line.strip()]


def no_crash(result) -> None:
    """No traceback, and no exception escaped the command (CliRunner would swallow it)."""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}\n{result.output}"
    )


def assert_error(result, *fragments: str, code: int = 1) -> str:
    """Exit ``code``, exactly one line on stderr: ``Error: ...`` holding every fragment (a
    fragment starting with ``re:`` is a regular expression). Returns the line."""
    no_crash(result)
    assert result.exit_code == code, result.output
    lines = lines_of(result.stderr)
    assert len(lines) == 1, f"stderr is not one line:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("Error: "), line
    for fragment in fragments:
        if fragment.startswith("re:"):
            assert re.search(fragment[3:], line), (fragment, line)
        else:
            assert fragment in line, (fragment, line)
    return line


def assert_usage(result, option: str) -> None:
    """Typer's own rejection: exit 2, a usage panel naming the option, no traceback."""
    no_crash(result)
    assert result.exit_code == 2, result.output
    text = ANSI.sub("", result.output)
    assert "Usage:" in text and option in text, text


def assert_ok(result) -> None:
    no_crash(result)
    assert result.exit_code == 0, result.output


def translate_args(run_dir: Path, *extra: object) -> list[object]:
    return ["translate", "-m", run_dir, "--device", "cpu", "--greedy", "--max-len-b", "2", *extra]


def out_lines(result) -> list[bytes]:
    """stdout split at ``\\n`` (the newline that ends the last line makes no extra line)."""
    data = result.stdout_bytes
    assert not data or data.endswith(b"\n"), data[-50:]
    return data.split(b"\n")[:-1] if data else []


# ---------------------------------------------------------------------------- translate: input
BAD_UTF8 = b"red cat\nthe dog\xff\xfe sees\n"


def test_translate_stdin_with_invalid_utf8_is_one_line_naming_the_line(run):
    result = invoke(*translate_args(run), input=BAD_UTF8)
    assert_error(result, "stdin", "line 2", "UTF-8")


def test_translate_file_with_invalid_utf8_is_one_line_naming_file_and_line(run, tmp_path):
    (tmp_path / "in.txt").write_bytes(BAD_UTF8)
    result = invoke(*translate_args(run, "-f", tmp_path / "in.txt"))
    assert_error(result, "in.txt", "line 2", "UTF-8")


def test_translate_file_of_latin1_text_is_one_line(run, tmp_path):
    (tmp_path / "in.txt").write_bytes("der Bär läuft\n".encode("latin-1"))
    result = invoke(*translate_args(run, "-f", tmp_path / "in.txt"))
    assert_error(result, "in.txt", "line 1", "UTF-8")


def test_translate_argument_with_lone_surrogate_is_one_line(run):
    result = invoke(*translate_args(run), "red cat", "der hund\udcff")
    assert_error(result, "argument 2", "UTF-8")


CONTROL_TEXTS = {
    "nul": "red\x00cat",
    "bell-escape": "\x07red \x1b[31mcat\x1b[0m",
    "c1-controls": "\x85red\x9bcat\x1c\x1d\x1e",
    "form-feed-vt": "red\x0ccat\x0bdog",
    "only-controls": "\x00\x01\x02\x7f",
    "bidi-zero-width": "\u202ered\u200bcat\ufeff\u2066",
}


@pytest.mark.parametrize("text", CONTROL_TEXTS.values(), ids=CONTROL_TEXTS.keys())
def test_translate_control_characters_as_argument_give_one_line(run, text):
    result = invoke(*translate_args(run), text)
    assert_ok(result)
    assert len(out_lines(result)) == 1


def test_translate_control_characters_on_stdin_give_one_line_each(run):
    texts = list(CONTROL_TEXTS.values())
    result = invoke(*translate_args(run), input="".join(f"{t}\n" for t in texts).encode())
    assert_ok(result)
    assert len(out_lines(result)) == len(texts)


@pytest.mark.parametrize(
    "line", ["red " * 25_000, "x" * 100_000], ids=["25000-words", "one-100000-char-word"]
)
@pytest.mark.parametrize("source", ["argument", "stdin", "file"])
def test_translate_a_100000_character_line_gives_one_line_or_a_one_line_error(
    run, tmp_path, line, source
):
    assert len(line) == 100_000
    if source == "argument":
        result = invoke(*translate_args(run), line)
    elif source == "stdin":
        result = invoke(*translate_args(run), input=(line + "\n").encode())
    else:
        (tmp_path / "long.txt").write_text(line + "\n", encoding="utf-8")
        result = invoke(*translate_args(run, "-f", tmp_path / "long.txt"))
    no_crash(result)
    if result.exit_code == 0:
        assert len(out_lines(result)) == 1
    else:
        assert_error(result, "re:(input|line|argument) 1", "tokens")


@pytest.mark.parametrize("text", ["", " ", " \t  ", "\u3000\u00a0"], ids=repr)
def test_translate_empty_or_blank_argument_gives_one_empty_line(run, text):
    result = invoke(*translate_args(run), text)
    assert_ok(result)
    assert out_lines(result) == [b""]


@pytest.mark.parametrize(
    ("stdin", "n"),
    [(b"", 0), (b"\n", 1), (b"  \t\n\n \n", 3), (b"\xef\xbb\xbf", 0), (b"   ", 1)],
    ids=["empty", "one-newline", "blank-lines", "bom-only", "spaces-no-newline"],
)
def test_translate_empty_or_blank_stdin(run, stdin, n):
    result = invoke(*translate_args(run), input=stdin)
    assert_ok(result)
    assert out_lines(result) == [b""] * n
    if n == 0:
        assert "nothing to translate" in result.stderr


def test_translate_empty_file_writes_an_empty_output_and_says_so(run, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"")
    result = invoke(*translate_args(run, "-f", tmp_path / "in.txt", "-o", tmp_path / "out.txt"))
    assert_ok(result)
    assert "nothing to translate" in result.stderr
    assert (tmp_path / "out.txt").read_bytes() == b""


def test_translate_crlf_file_gives_one_line_per_line_without_carriage_returns(run, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"red cat\r\nblue dog\r\n\r\nbig bird\r\n")
    result = invoke(*translate_args(run, "-f", tmp_path / "in.txt"))
    assert_ok(result)
    lines = out_lines(result)
    assert len(lines) == 4 and lines[2] == b""
    assert b"\r" not in result.stdout_bytes
    plain = invoke(*translate_args(run), "red cat", "blue dog", "", "big bird")
    assert out_lines(plain) == lines


def test_translate_crlf_stdin_without_final_newline(run):
    result = invoke(*translate_args(run), input=b"red cat\r\nblue dog\r")
    assert_ok(result)
    assert len(out_lines(result)) == 2 and b"\r" not in result.stdout_bytes


def test_translate_json_output_is_one_parseable_line_per_input(run):
    """JSON lines hold the source: NUL, \\u2028 and \\x85 must not break a record in two."""
    texts = ["red\x00cat", "blue\u2028dog", "big\x85bird\r", "", "\x1b[31mred"]
    result = invoke(*translate_args(run, "--json"), input="".join(f"{t}\n" for t in texts))
    assert_ok(result)
    records = [json.loads(line) for line in out_lines(result)]
    assert [r["index"] for r in records] == list(range(len(texts)))
    assert [r["source"] for r in records] == [t.removesuffix("\r") for t in texts]


def test_translate_unicode_separators_stay_inside_their_line(run):
    stdin = "red\u2028cat\nblue\x85dog\u2029\nbig\x0cbird\x1c\n".encode()
    result = invoke(*translate_args(run), input=stdin)
    assert_ok(result)
    assert len(out_lines(result)) == 3


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_translate_file_that_cannot_be_read_is_one_line(run, tmp_path, what):
    path = tmp_path / "in.txt"
    if what == "directory":
        path.mkdir()
    result = invoke(*translate_args(run, "-f", path))
    assert_error(result, "in.txt")


def test_translate_failure_leaves_an_existing_output_file_untouched(run, tmp_path):
    (tmp_path / "out.txt").write_bytes(b"precious\n")
    result = invoke(*translate_args(run, "-o", tmp_path / "out.txt"), input=BAD_UTF8)
    assert_error(result, "line 2")
    assert (tmp_path / "out.txt").read_bytes() == b"precious\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


# ---------------------------------------------------------------------------- unwritable outputs
@pytest.fixture
def blocked(tmp_path) -> Path:
    """A path whose parent is a regular file: no one can write it, root included."""
    (tmp_path / "file.txt").write_text("a file, not a folder\n")
    return tmp_path / "file.txt" / "out.txt"


def test_translate_output_under_a_file_is_one_line(run, blocked):
    result = invoke(*translate_args(run, "-o", blocked), "red cat")
    assert_error(result, str(blocked))
    assert (blocked.parent).read_text() == "a file, not a folder\n"


def test_translate_output_that_is_a_folder_is_one_line(run, tmp_path):
    (tmp_path / "out").mkdir()
    result = invoke(*translate_args(run, "-o", tmp_path / "out"), "red cat")
    assert_error(result, "out")


def eval_args(run_dir: Path, corpus: Path, *extra: object) -> list[object]:
    data = corpus / "test.tsv"
    return ["eval", "-m", run_dir, "--data", data, "--split", "all", "--limit", "2", "--beam", "1",
            "--device", "cpu", "--quiet", *extra]  # fmt: skip


@pytest.mark.parametrize("option", [["--json", "-o"], ["-o"], ["--hypotheses"]])
def test_eval_output_under_a_file_is_one_line(run, corpus, blocked, option):
    result = invoke(*eval_args(run, corpus, *option, blocked))
    assert_error(result, str(blocked))


@pytest.mark.parametrize("suffix", [".svg", ".html"])
def test_inspect_attention_save_under_a_file_is_one_line(run, tmp_path, suffix):
    (tmp_path / "file.txt").write_text("x")
    target = tmp_path / "file.txt" / f"map{suffix}"
    result = invoke("inspect-attention", "red cat", "-m", run, "--device", "cpu", "--save", target)
    assert_error(result, str(target))


def test_inspect_attention_json_under_a_file_is_one_line(run, blocked):
    result = invoke(
        "inspect-attention", "red cat", "-m", run, "--device", "cpu", "--json", "-o", blocked
    )
    assert_error(result, str(blocked))


def test_tokenizer_train_output_under_a_file_is_one_line(corpus, blocked):
    result = invoke("tokenizer", "train", "-o", blocked, "--data", corpus, "--vocab-size", "60")
    assert_error(result, str(blocked))


def test_average_output_under_a_file_is_one_line(run_copy, blocked):
    add_checkpoints(run_copy, 2)
    result = invoke("average", "-m", run_copy, "--last", "2", "-o", blocked)
    assert_error(result, str(blocked))


# ---------------------------------------------------------------------------- out-of-range options
TRANSLATE_BAD = {
    "beam-0": (["--beam", "0"], 2, "--beam"),
    "beam-not-a-number": (["--beam", "five"], 2, "--beam"),
    "nbest-0": (["--nbest", "0"], 2, "--nbest"),
    "nbest-above-beam": (["--beam", "2", "--nbest", "3"], 2, "--nbest"),
    "max-tokens-0": (["--max-tokens", "0"], 2, "--max-tokens"),
    "batch-size-0": (["--batch-size", "0"], 2, "--batch-size"),
    "chunk-size-0": (["--chunk-size", "0"], 2, "--chunk-size"),
    "beam-0-short": (["-k", "0"], 2, "'--beam' / '-k'"),
    "max-len-a-negative": (["--max-len-a", "-1"], 2, "--max-len-a"),
    "max-len-b-negative": (["--max-len-b", "-1"], 2, "--max-len-b"),
    "alpha-negative": (["--alpha", "-1"], 2, "--alpha"),
    "alpha-nan": (["--alpha", "nan"], 2, "--alpha"),
    "max-len-a-nan": (["--max-len-a", "nan"], 2, "--max-len-a"),
    "device-nonsense": (["--device", "nonsense"], 2, "--device"),
    "precision-nonsense": (["--precision", "nonsense"], 2, "--precision"),
    "precision-fp16": (["--precision", "fp16"], 2, "--precision"),
    "compile-maybe": (["--compile", "maybe"], 2, "--compile"),
    "engine-onnx": (["--engine", "onnx"], 2, "--engine"),
    "top-p-2": (["--sample", "--top-p", "2"], 2, "--top-p"),
    "top-p-without-sample": (["--top-p", "0.5"], 2, "--top-p"),
    "threads-negative": (["--threads", "-1"], 2, "--threads"),
    # numbers that overflowed torch or asked for terabytes (tracebacks before their bounds)
    "beam-huge": (["--beam", "99999999999999999999"], 2, "--beam"),
    "beam-1e8": (["--beam", "100000000"], 2, "--beam"),
    "chunk-size-huge": (["--chunk-size", "99999999999999999999"], 2, "--chunk-size"),
    "max-len-b-huge": (["--max-len-b", "99999999999999999999"], 2, "--max-len-b"),
    "nbest-huge": (["--sample", "--nbest", "99999999999999999999"], 2, "--nbest"),
    "mbr-huge": (["--mbr", "99999999999999999999"], 2, "--mbr"),
    "seed-huge": (["--sample", "--seed", "99999999999999999999"], 2, "--seed"),
    "greedy-and-sample": (["--greedy", "--sample"], 2, "--greedy"),
    "greedy-and-mbr": (["--greedy", "--mbr", "4"], 2, "--greedy"),
    "temperature-0": (["--sample", "--temperature", "0"], 2, "--temperature"),
    "temperature-1e-300": (["--sample", "--temperature", "1e-300"], 2, "--temperature"),
    "temperature-1e300": (["--sample", "--temperature", "1e300"], 2, "--temperature"),
}


@pytest.mark.parametrize(("extra", "code", "fragment"), TRANSLATE_BAD.values(), ids=TRANSLATE_BAD)
def test_translate_out_of_range_option(run, extra, code, fragment):
    result = invoke("translate", "red cat", "-m", run, "--device", "cpu", *extra)
    if code == 2:
        assert_usage(result, fragment)
    else:
        assert_error(result, fragment)


# --device cuda is an error only where there is no CUDA
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
TRAIN_BAD = {  # values that no run could take are usage errors: TRAIN_USAGE
    "max-len-100000": (["--max-len", "100000"], "--max-len"),
    "preset-nonexistent": (["--preset", "nonexistent"], "nonexistent"),
    "name-with-slash": (["--name", "../escape"], "--name"),
    "device-cuda": pytest.param(["--device", "cuda"], "cuda", marks=NO_CUDA),
    "hf-without-a-name": (["--data", "hf:"], "hf:"),
    "data-missing": (["--data", "/does/not/exist"], "/does/not/exist"),
    "name-dot-cache": (["--name", ".cache"], "--name"),
}
TINY = ["--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1", "--vocab-size", "60",
        "--max-steps", "2", "--valid-every", "2", "--device", "cpu", "--precision", "fp32",
        "--quiet"]  # fmt: skip


def run_folders(runs: Path) -> list[Path]:
    return [p for p in runs.iterdir() if p.name != ".cache"] if runs.exists() else []


@pytest.mark.parametrize(("extra", "fragment"), TRAIN_BAD.values(), ids=TRAIN_BAD)
def test_train_out_of_range_option_fails_before_training(corpus, tmp_path, extra, fragment):
    runs = tmp_path / "runs"
    result = invoke("train", "--data", corpus, *TINY, "--runs-dir", runs, *extra)
    assert_error(result, fragment)
    assert run_folders(runs) == []


RECIPES = {
    "not-toml": (b"[model\nd_model = ", "TOML"),
    "binary": (b"\x00\xff\xfe garbage", "bad.toml"),
    "unknown-table": (b"[optimizer]\nlr = 1\n", "optimizer"),
    "unknown-setting": (b"[model]\nwidth = 3\n", "width"),
    "wrong-type": (b'[train]\nlr = "fast"\n', "lr"),
    "out-of-range": (b"[model]\ndropout = 2.0\n", "dropout"),
}


@pytest.mark.parametrize(("content", "fragment"), RECIPES.values(), ids=RECIPES)
def test_train_preset_file_that_is_bad_names_it_in_one_line(corpus, tmp_path, content, fragment):
    (tmp_path / "bad.toml").write_bytes(content)
    runs = tmp_path / "runs"
    result = invoke("train", "--data", corpus, *TINY, "--runs-dir", runs, "--preset", "bad.toml")
    assert_error(result, "bad.toml", fragment)
    assert run_folders(runs) == []


TRAIN_USAGE = {
    "positional-nonsense": (["--positional", "nonsense"], "--positional"),
    "norm-nonsense": (["--norm", "middle"], "--norm"),
    "lr-not-a-number": (["--lr", "fast"], "--lr"),
    "epochs-not-an-int": (["--epochs", "1.5"], "--epochs"),
    "seed-huge": (["--seed", "99999999999999999999"], "--seed"),
    "vocab-size-huge": (["--vocab-size", "2000000"], "--vocab-size"),
    "lr-0": (["--lr", "0"], "--lr"),
    "lr-negative": (["--lr", "-1"], "--lr"),
    "lr-nan": (["--lr", "nan"], "--lr"),
    "clip-norm-nan": (["--clip-norm", "nan"], "--clip-norm"),
    "max-minutes-nan": (["--max-minutes", "nan"], "--max-minutes"),
    "warmup-0": (["--warmup", "0"], "--warmup"),
    "dropout-1.5": (["--dropout", "1.5"], "--dropout"),
    "heads-not-dividing-d-model": (["--heads", "3", "--d-model", "32"], "--heads"),
    "vocab-size-0": (["--vocab-size", "0"], "--vocab-size"),
    "clip-norm-negative": (["--clip-norm", "-1"], "--clip-norm"),
    "epochs-negative": (["--epochs", "-1"], "--epochs"),
    "save-every-negative": (["--save-every", "-1"], "--save-every"),
    "label-smoothing-1": (["--label-smoothing", "1"], "--label-smoothing"),
    "tokenizer-nonsense": (["--tokenizer", "nonsense"], "--tokenizer"),
    "max-tokens-0": (["--max-tokens", "0"], "--max-tokens"),
    "accum-0": (["--accum", "0"], "--accum"),
    "valid-every-0": (["--valid-every", "0"], "--valid-every"),
    "layers-0": (["--layers", "0"], "--layers"),
    "d-model-0": (["--d-model", "0"], "--d-model"),
    "average-1": (["--average", "1"], "--average"),
    "max-minutes-negative": (["--max-minutes", "-1"], "--max-minutes"),
    "scheduled-sampling-nonsense": (["--scheduled-sampling", "nonsense"], "--scheduled-sampling"),
    "ss-tau-0": (["--ss-tau", "0"], "--ss-tau"),
    "precision-nonsense": (["--precision", "nonsense"], "--precision"),
    "compile-maybe": (["--compile", "maybe"], "--compile"),
    "src-file-alone": (["--src-file", "train.tsv"], "--src-file"),
    "decay-linear-without-a-budget": (["--decay", "linear", "--max-steps", "0"], "--decay"),
    "nnodes-not-a-number": (
        ["--nproc", "2", "--nnodes", "foo", "--rdzv-endpoint", "h:1"],
        "--nnodes",
    ),
}


@pytest.mark.parametrize(("extra", "option"), TRAIN_USAGE.values(), ids=TRAIN_USAGE)
def test_train_option_rejected_as_a_usage_error(corpus, tmp_path, extra, option):
    runs = tmp_path / "runs"
    result = invoke("train", "--data", corpus, *TINY, "--runs-dir", runs, *extra)
    assert_usage(result, option)
    assert run_folders(runs) == []


EVAL_BAD = {
    "split-nonsense": (["--split", "nonsense"], 2, "--split"),
    "limit-0": (["--limit", "0"], 2, "--limit"),
    "beam-0": (["--beam", "0"], 2, "--beam"),
    "threads-negative": (["--threads", "-1"], 2, "--threads"),
    "alpha-negative": (["--alpha", "-1"], 2, "--alpha"),
    "device-cuda": pytest.param(["--device", "cuda"], 1, "cuda", marks=NO_CUDA),
    "precision-nonsense": (["--precision", "nonsense"], 2, "--precision"),
    "split-dev": (["--split", "dev"], 2, "--split"),
    "min-len-huge": (["--min-len", "99999999999999999999"], 2, "--min-len"),
    "beam-huge": (["--beam", "99999999999999999999"], 2, "--beam"),
    "seed-huge": (["--seed", "99999999999999999999"], 2, "--seed"),
    "threads-huge": (["--threads", "99999999999999999999"], 2, "--threads"),
}


@pytest.mark.parametrize(("extra", "code", "fragment"), EVAL_BAD.values(), ids=EVAL_BAD)
def test_eval_out_of_range_option(run, corpus, extra, code, fragment):
    result = invoke(*eval_args(run, corpus), *extra)
    if code == 2:
        assert_usage(result, fragment)
    else:
        assert_error(result, fragment)


INSPECT_BAD = {
    "layer-99": (["--layer", "99"], 1, "--layer"),
    "layer-0": (["--layer", "0"], 2, "--layer"),
    "layer-not-a-number": (["--layer", "first"], 2, "--layer"),
    "head-0": (["--head", "0"], 2, "--head"),
    "head-99": (["--head", "99"], 1, "--head"),
    "kind-nonsense": (["--kind", "nonsense"], 2, "--kind"),
    "save-bmp": (["--save", "x.bmp"], 1, "x.bmp"),
    "beam-0": (["--beam", "0"], 2, "--beam"),
    "beam-huge": (["--beam", "99999999999999999999"], 2, "--beam"),
    "align-sentences-0": (["--align-sentences", "0"], 2, "--align-sentences"),
    "device-cuda": pytest.param(["--device", "cuda"], 1, "cuda", marks=NO_CUDA),
}


@pytest.mark.parametrize(("extra", "code", "fragment"), INSPECT_BAD.values(), ids=INSPECT_BAD)
def test_inspect_attention_out_of_range_option(run, tmp_path, extra, code, fragment):
    args = ["inspect-attention", "red cat", "-m", run, "--device", "cpu", "--no-align", *extra]
    result = invoke(*args)
    if code == 2:
        assert_usage(result, fragment)
    else:
        assert_error(result, fragment)
    assert not (tmp_path / "x.bmp").exists()


@pytest.mark.parametrize(
    "text", ["", "   ", "red " * 100], ids=["empty", "blank", "longer-than-the-model"]
)
def test_inspect_attention_of_text_it_cannot_take_is_one_line(run, text):
    result = invoke("inspect-attention", text, "-m", run, "--device", "cpu")
    assert_error(result, "re:text|tokens")


@NO_CUDA
def test_translate_on_cuda_without_cuda_is_one_line(run):
    result = invoke("translate", "red cat", "-m", run, "--device", "cuda")
    assert_error(result, "cuda", "re:no CUDA|not available")


# ---------------------------------------------------------------------------- average
def add_checkpoints(run_dir: Path, n: int) -> None:
    from tformer_cli.checkpoint import load_state, save_checkpoint

    state = load_state(run_dir / "model.pt")
    for step in range(1, n + 1):
        save_checkpoint(run_dir, 250 * step, state, keep=10)


def test_average_with_one_checkpoint_is_one_line(run_copy):
    add_checkpoints(run_copy, 1)
    before = snapshot(run_copy)
    result = invoke("average", "-m", run_copy, "-o", run_copy / "model.pt")
    assert_error(result, "1 checkpoint(s)")
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("last", ["1", "0", "-3", "two"])
def test_average_last_below_two_is_a_usage_error(run_copy, last):
    result = invoke("average", "-m", run_copy, "--last", last)
    assert_usage(result, "--last")


def test_average_with_a_corrupt_checkpoint_keeps_model_pt(run_copy):
    add_checkpoints(run_copy, 3)
    newest = sorted((run_copy / "checkpoints").iterdir())[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    before = snapshot(run_copy)
    result = invoke("average", "-m", run_copy, "--last", "3", "-o", run_copy / "model.pt")
    assert_error(result, newest.name)
    assert snapshot(run_copy) == before


def test_average_of_a_file_is_one_line(tmp_path):
    (tmp_path / "run").write_text("not a folder")
    result = invoke("average", "-m", tmp_path / "run")
    assert_error(result, "is a file")


# ---------------------------------------------------------------------------- damaged run folders
def damage(run_dir: Path, how: str) -> Path:
    """Damage a copy of the run; returns the path to give as --model."""
    from tformer_cli.checkpoint import atomic_torch_save
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer
    from tformer_cli.model import Transformer

    config = run_dir / "config.json"
    model = run_dir / "model.pt"
    if how == "missing-folder":
        shutil.rmtree(run_dir)
    elif how == "run-is-a-file":
        shutil.rmtree(run_dir)
        run_dir.write_bytes(b"a file where the run folder should be\n")
    elif how == "empty-folder":
        shutil.rmtree(run_dir)
        run_dir.mkdir()
    elif how == "no-config":
        config.unlink()
    elif how == "config-not-json":
        config.write_text('{"model": {"d_model": 32,', encoding="utf-8")
    elif how == "config-not-utf8":
        config.write_bytes(b'{"model": "\xff\xfe"}')
    elif how == "config-a-list":
        config.write_text("[1, 2, 3]\n", encoding="utf-8")
    elif how == "config-wrong-type":
        raw = json.loads(config.read_text(encoding="utf-8"))
        raw["model"]["d_model"] = "thirty-two"
        config.write_text(json.dumps(raw), encoding="utf-8")
    elif how == "config-impossible-value":
        raw = json.loads(config.read_text(encoding="utf-8"))
        raw["model"]["h"] = 0
        config.write_text(json.dumps(raw), encoding="utf-8")
    elif how == "model-missing":
        model.unlink()
    elif how == "model-truncated":
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    elif how == "model-random-bytes":
        model.write_bytes(random.Random(0).randbytes(model.stat().st_size))
    elif how == "model-empty":
        model.write_bytes(b"")
    elif how == "model-other-d-model":
        cfg = json.loads(config.read_text(encoding="utf-8"))["model"]
        other = Transformer(tiny_config(vocab_size=cfg["vocab_size"], d_model=64))
        atomic_torch_save(model, other.state_dict())
    elif how == "tokenizer-missing":
        (run_dir / "tokenizer.json").unlink()
    elif how == "tokenizer-corrupt":
        (run_dir / "tokenizer.json").write_text('{"version": "1.0", "model": ', encoding="utf-8")
    elif how == "config-future-format":
        raw = json.loads(config.read_text(encoding="utf-8"))
        raw["format"] = 99
        config.write_text(json.dumps(raw), encoding="utf-8")
    elif how == "tokenizer-empty":
        (run_dir / "tokenizer.json").write_bytes(b"")
    elif how == "tokenizer-other-vocab":
        words = [f"w{i}" for i in range(20)]
        tok = train_tokenizer([" ".join(words)], vocab_size=30, kind="wordlevel", min_frequency=1)
        save_tokenizer(tok, run_dir / "tokenizer.json")
    else:  # pragma: no cover
        raise AssertionError(how)
    return run_dir


DAMAGES = {
    "missing-folder": "does not exist",
    "run-is-a-file": "is a file",
    "empty-folder": "config.json",
    "no-config": "config.json",
    "config-not-json": "config.json",
    "config-not-utf8": "config.json",
    "config-a-list": "config.json",
    "config-wrong-type": "config.json",
    "config-impossible-value": "config.json",
    "model-missing": "model.pt",
    "model-truncated": "model.pt",
    "model-random-bytes": "model.pt",
    "model-empty": "model.pt",
    "model-other-d-model": "model.pt",
    "tokenizer-missing": "tokenizer.json",
    "tokenizer-corrupt": "tokenizer.json",
    "tokenizer-other-vocab": "tokenizer.json",
    "config-future-format": "config.json",
    "tokenizer-empty": "tokenizer.json",
}


def command_on(command: str, model: Path, corpus: Path) -> list[object]:
    if command == "translate":
        return translate_args(model, "red cat")
    if command == "eval":
        return eval_args(model, corpus)
    return ["inspect-attention", "red cat", "-m", model, "--device", "cpu", "--no-align"]


@pytest.mark.parametrize("how", DAMAGES, ids=DAMAGES)
@pytest.mark.parametrize("command", ["translate", "eval", "inspect-attention"])
def test_damaged_run_folder_is_one_line_and_left_as_it_was(run_copy, corpus, command, how):
    model = damage(run_copy, how)
    before = snapshot(model)
    result = invoke(*command_on(command, model, corpus))
    assert_error(result, DAMAGES[how])
    assert snapshot(model) == before


@pytest.mark.parametrize(
    "how", ["missing-folder", "run-is-a-file", "empty-folder", "no-config", "config-not-json",
            "config-wrong-type", "tokenizer-corrupt"],
)  # fmt: skip
def test_resume_of_a_damaged_run_is_one_line_and_left_as_it_was(run_copy, tmp_path, how):
    (run_copy / "model.pt").unlink()  # as a run killed before its first save (no last.pt either)
    model = damage(run_copy, how)
    before = snapshot(model)
    result = invoke("train", "--resume", model, "--quiet", "--device", "cpu")
    fragment = {"missing-folder": "copy", "run-is-a-file": "copy"}.get(how, DAMAGES[how])
    assert_error(result, fragment)
    assert snapshot(model) == before
    assert not (tmp_path / "runs").exists()


def test_resume_with_a_corrupt_last_pt_keeps_every_file(tmp_path, corpus):
    run_dir = build_run(tmp_path / "runs" / "r", corpus, max_len=64, tokenizer_kind="wordlevel",
                        vocab_size=60, max_steps=2, valid_every=2)  # fmt: skip
    (run_dir / "last.pt").write_bytes(b"PK\x03\x04 half a zip file")
    before = snapshot(run_dir)
    result = invoke("train", "--resume", run_dir, "--quiet")
    assert_error(result, "last.pt")
    assert snapshot(run_dir) == before


def test_resume_without_last_pt_starts_from_step_0(tmp_path, corpus):
    """config.json + tokenizer.json, no last.pt (killed before the first save): train anew."""
    run_dir = build_run(tmp_path / "runs" / "r", corpus, max_len=64, tokenizer_kind="wordlevel",
                        vocab_size=60, max_steps=2, valid_every=2)  # fmt: skip
    (run_dir / "model.pt").unlink()
    result = invoke("train", "--resume", run_dir, "--quiet")
    assert_ok(result)
    assert (run_dir / "last.pt").is_file() and (run_dir / "model.pt").is_file()
    assert f"run: {run_dir}" in result.stdout


def test_train_into_an_existing_run_name_keeps_its_model(tmp_path, corpus, run):
    runs = tmp_path / "runs"
    shutil.copytree(run, runs / "taken")
    before = snapshot(runs / "taken")
    result = invoke("train", "--data", corpus, *TINY, "--runs-dir", runs, "--name", "taken")
    assert_error(result, "taken", "--resume")
    assert snapshot(runs / "taken") == before


# ---------------------------------------------------------------------------- corpora
def train_on(data: Path, tmp_path: Path, *extra: object):
    return invoke("train", "--data", data, *TINY, "--runs-dir", tmp_path / "runs", *extra)


def test_train_tsv_with_invalid_utf8_names_file_and_line(tmp_path):
    data = write_corpus(tmp_path / "data")
    raw = (data / "train.tsv").read_bytes().split(b"\n")
    raw[2] = raw[2].replace(b" ", b"\xc3 ", 1)
    (data / "train.tsv").write_bytes(b"\n".join(raw))
    result = train_on(data, tmp_path)
    assert_error(result, "train.tsv", "re::3\\b|line 3", "UTF-8")
    assert run_folders(tmp_path / "runs") == []


def test_train_plain_file_with_invalid_utf8_names_file_and_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.de").write_bytes(b"ein hund\neine katze\xff\n" * 10)
    (data / "train.en").write_bytes(b"a dog\na cat\n" * 10)
    result = train_on(data, tmp_path, "--src", "de", "--tgt", "en")
    assert_error(result, "train.de", "re::2\\b|line 2", "UTF-8")


def test_train_tsv_line_without_a_tab_names_file_and_line(tmp_path):
    data = write_corpus(tmp_path / "data")
    lines = (data / "valid.tsv").read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3].replace("\t", " ")
    (data / "valid.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = train_on(data, tmp_path)
    assert_error(result, "valid.tsv", "re::4\\b|line 4", "tab")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"", "empty"), (b"red cat\t   \n", "empty target"), (b"\t\x00\n", "empty source")],
    ids=["empty-file", "blank-target", "blank-source"],
)
def test_train_tsv_with_empty_content_is_one_line(tmp_path, content, fragment):
    data = write_corpus(tmp_path / "data")
    (data / "test.tsv").write_bytes(content)
    result = train_on(data, tmp_path)
    assert_error(result, "test.tsv", fragment)


def test_train_plain_files_with_different_line_counts(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.de").write_text("ein hund\neine katze\n" * 10, encoding="utf-8")
    (data / "train.en").write_text("a dog\na cat\n" * 10 + "one more\n", encoding="utf-8")
    result = train_on(data, tmp_path, "--src", "de", "--tgt", "en")
    assert_error(result, "train.de has 20 lines", "21")


def test_train_src_file_and_tgt_file_with_different_line_counts(tmp_path):
    (tmp_path / "a.de").write_text("ein hund\n" * 20, encoding="utf-8")
    (tmp_path / "b.en").write_text("a dog\n" * 19, encoding="utf-8")
    result = invoke("train", "--src-file", tmp_path / "a.de", "--tgt-file", tmp_path / "b.en",
                    *TINY, "--runs-dir", tmp_path / "runs")  # fmt: skip
    assert_error(result, "a.de has 20 lines", "19")
    assert run_folders(tmp_path / "runs") == []


def test_tokenizer_train_on_a_crlf_tsv_corpus(tmp_path):
    data = write_corpus(tmp_path / "data", newline="\r\n")
    result = invoke("tokenizer", "train", "-o", tmp_path / "tok.json", "--data", data,
                    "--vocab-size", "60", "--tokenizer", "wordlevel")  # fmt: skip
    assert_ok(result)
    assert "valid src: 6 sentences" in result.stdout
    vocab = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert not any("\r" in word for word in vocab)


def test_tokenizer_train_on_crlf_plain_files_and_control_characters(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pairs = reversal_pairs(30, 5)
    src = "".join(f"{s}\x00\x1b\r\n" for s, _ in pairs)
    tgt = "".join(f"\u2028{t}\x0c\r\n" for _, t in pairs)
    (data / "train.de").write_bytes(src.encode())
    (data / "train.en").write_bytes(tgt.encode())
    result = invoke("tokenizer", "train", "-o", tmp_path / "tok.json", "--data", data,
                    "--src", "de", "--tgt", "en", "--vocab-size", "60")  # fmt: skip
    assert_ok(result)
    assert "valid src: 3 sentences" in result.stdout


@pytest.mark.parametrize(
    ("extra", "option"),
    [(["--vocab-size", "0"], "--vocab-size"), (["--tokenizer", "nonsense"], "--tokenizer"),
     (["--kind", "nonsense"], "--tokenizer")],
    ids=["vocab-size-0", "tokenizer-nonsense", "old-kind-nonsense"],
)  # fmt: skip
def test_tokenizer_train_bad_option_is_a_usage_error(corpus, tmp_path, extra, option):
    result = invoke("tokenizer", "train", "-o", tmp_path / "tok.json", "--data", corpus, *extra)
    assert_usage(result, option)
    assert not (tmp_path / "tok.json").exists()


def test_train_on_a_crlf_corpus(tmp_path):
    """A real (two-update) training on CRLF files: the \\r never reaches the tokenizer."""
    data = write_corpus(tmp_path / "data", newline="\r\n")
    result = train_on(data, tmp_path, "--name", "crlf", "--tokenizer", "wordlevel")
    assert_ok(result)
    vocab = json.loads((tmp_path / "runs" / "crlf" / "tokenizer.json").read_text("utf-8"))
    assert not any("\r" in word for word in vocab["model"]["vocab"])


def test_eval_data_with_invalid_utf8_names_file_and_line(run, tmp_path):
    (tmp_path / "bad.tsv").write_bytes(b"red cat\tcat red\nblue\xff dog\tdog blue\n")
    result = invoke("eval", "-m", run, "--data", tmp_path / "bad.tsv", "--split", "all",
                    "--device", "cpu", "--quiet", "--beam", "1")  # fmt: skip
    assert_error(result, "bad.tsv", "re::2\\b|line 2", "UTF-8")


def test_eval_data_with_mismatched_plain_files(run, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.de").write_text("red cat\nblue dog\n", encoding="utf-8")
    (data / "train.en").write_text("cat red\n", encoding="utf-8")
    result = invoke("eval", "-m", run, "--data", data, "--src", "de", "--tgt", "en",
                    "--split", "all", "--device", "cpu", "--quiet")  # fmt: skip
    assert_error(result, "train.de has 2 lines")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"", "empty"), (("red " * 80 + "\tcat\n").encode(), "longer")],
    ids=["empty-file", "every-pair-too-long"],
)
def test_eval_data_it_cannot_score_is_one_line(run, tmp_path, content, fragment):
    (tmp_path / "data.tsv").write_bytes(content)
    result = invoke("eval", "-m", run, "--data", tmp_path / "data.tsv", "--split", "all",
                    "--device", "cpu", "--quiet", "--beam", "1")  # fmt: skip
    assert_error(result, fragment)


def test_eval_data_that_is_missing_is_one_line(run, tmp_path):
    result = invoke("eval", "-m", run, "--data", tmp_path / "nope.tsv", "--device", "cpu")
    assert_error(result, "nope.tsv")


def test_resume_of_a_missing_folder_is_one_line(tmp_path):
    result = invoke("train", "--resume", tmp_path / "never-trained", "--quiet")
    assert_error(result, "never-trained")
    assert not (tmp_path / "never-trained").exists()


def test_resume_of_a_folder_without_config_json_is_one_line(tmp_path):
    (tmp_path / "old").mkdir()
    result = invoke("train", "--resume", tmp_path / "old", "--quiet")
    assert_error(result, "config.json")
    assert list((tmp_path / "old").iterdir()) == []


# ---------------------------------------------------------------------------- property
PIECES = st.one_of(
    st.sampled_from([*WORDS, " ", "\n", "\r\n", "\r", "\x00", "\x0c", "\x0b", "\x85", "\u2028",
                     "\u2029", "\x1b[31m", "\t", "\ufeff", "\x1c", "\x1e", "\u200b"]),
    st.text(max_size=4),
)  # fmt: skip


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.lists(PIECES, max_size=24).map("".join))
def test_translate_any_unicode_gives_one_line_per_line_or_a_one_line_error(run, text):
    stdin = text.encode("utf-8")
    assume(stdin != b"\xef\xbb\xbf")  # a lone byte order mark: its own test above
    expected = stdin.count(b"\n") + (1 if stdin and not stdin.endswith(b"\n") else 0)
    result = invoke(*translate_args(run), input=stdin)
    no_crash(result)
    if result.exit_code == 0:
        assert len(out_lines(result)) == expected, (text, result.stdout_bytes)
        assert b"\r" not in result.stdout_bytes
    else:
        assert_error(result)


# ---------------------------------------------------------------------------- real processes
def real_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TFORMER_DEBUG", "FORCE_COLOR")}
    env.update(TFORMER_THREADS="1", COLUMNS="200", **extra)
    return env


def run_real(*args: object, stdin: bytes = b"", timeout: float = 60, env=None):
    cmd = [sys.executable, "-m", "tformer_cli", *map(str, args)]
    return subprocess.run(
        cmd, input=stdin, capture_output=True, timeout=timeout, env=env or real_env()
    )


def assert_real_error(proc, *fragments: str, code: int = 1) -> None:
    stderr = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    assert proc.returncode == code, stderr
    lines = lines_of(stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_real_process_bad_stdin_bytes(run):
    proc = run_real(*translate_args(run), stdin=b"red cat\n\xff\xfe\x00\n")
    assert_real_error(proc, "line 2", "UTF-8")


def default_sigint() -> None:
    """In the child: SIGINT back to its default. Tests run in the background (``nohup``, ``&``
    in a shell without job control) ignore SIGINT, and a child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_real_process_ctrl_c_exits_130_in_one_line(run):
    """Ctrl-C while translate waits for stdin: exit 130, one line, no traceback."""
    cmd = [sys.executable, "-m", "tformer_cli", "translate",
           *map(str, translate_args(run, "--chunk-size", "1")[1:])]  # fmt: skip
    with subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=real_env(),
        preexec_fn=default_sigint,
    ) as proc:  # fmt: skip
        try:
            proc.stdin.write(b"red cat\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, "no translation within 30 s"
            assert proc.stdout.readline().endswith(b"\n")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
            stderr = proc.stderr.read().decode("utf-8", "replace")
        finally:
            proc.kill()
    assert "Traceback" not in stderr, stderr
    assert code == 130, stderr
    lines = lines_of(stderr)
    assert len(lines) == 1 and "interrupt" in lines[0].lower(), stderr


def closed_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_process_train_from_an_unreachable_hub_fails_fast(tmp_path):
    """``hf:NAME`` with the Hub down (a closed local port): one line within seconds, not
    minutes of retries. Nothing but 127.0.0.1 is contacted."""
    port = closed_local_port()
    env = {k: v for k, v in real_env().items() if "proxy" not in k.lower()}
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")  # fmt: skip
    start = time.monotonic()
    proc = run_real("train", "--data", "hf:some/dataset", "--runs-dir", tmp_path / "runs",
                    "--quiet", "--device", "cpu", timeout=60, env=env)  # fmt: skip
    elapsed = time.monotonic() - start
    assert_real_error(proc, "some/dataset")
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert run_folders(tmp_path / "runs") == []
