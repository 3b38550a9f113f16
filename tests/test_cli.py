"""Tests for tformer_cli.cli: help for every command, one-line errors with exit code 1, and a
translation from a run folder."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys

import pytest
import torch
import typer
from typer.testing import CliRunner

from tformer_cli import __version__, cli
from tformer_cli.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_environment(tmp_path, monkeypatch):
    """Run in an empty folder (no runs/), without TFORMER_DEBUG, on one torch thread (as the
    other tests), and with an 80-column stderr as a log file or CI gets it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.setenv("COLUMNS", "80")
    if hasattr(cli, "err"):
        monkeypatch.setattr(cli.err, "_width", 80, raising=False)


def invoke(*args: str):
    return runner.invoke(app, list(args))


def panel(text: str) -> str:
    """Typer's usage panel as one line: its box drawn away, its wrapped lines joined."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def assert_clean_error(result, *fragments: str) -> None:
    """Exit 1, an ``Error:`` on stderr naming ``fragments``, nothing on stdout, no traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    text = " ".join(line.strip() for line in error_lines(result))
    assert text.startswith("Error:")
    for fragment in fragments:
        assert fragment in text


def command_paths() -> list[list[str]]:
    """Every command and sub-command of the app, as argument lists."""
    paths: list[list[str]] = []

    def walk(cmd, prefix: list[str]) -> None:
        paths.append(prefix)
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click classes)
            for name, sub in cmd.commands.items():
                walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


# ---------------------------------------------------------------------------- help
def test_the_app_has_train_translate_and_tokenizer_train():
    paths = command_paths()
    for expected in (["train"], ["translate"], ["tokenizer", "train"]):
        assert expected in paths


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "tformer")
def test_help_of_every_command_exits_zero(path):
    result = invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout


def test_command_help_paragraphs_are_one_line_each_for_the_terminal_to_wrap():
    for info in [*app.registered_commands, *cli.tokenizer_app.registered_commands]:
        paragraphs = info.help.split("\n\n")
        assert info.help and not any("\n" in p for p in paragraphs), info.name


def test_no_arguments_shows_help():
    result = invoke()
    assert "Usage:" in result.output and "translate" in result.output


def test_version_option_prints_the_version():
    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.stdout


# ---------------------------------------------------------------------------- errors
def test_translate_without_runs_tells_to_run_tformer_train():
    result = invoke("translate", "x")
    assert_clean_error(result, "tformer train")


def test_translate_without_runs_error_is_one_line():
    assert len(error_lines(invoke("translate", "x"))) == 1


def long_missing_folder(tmp_path):
    return tmp_path.joinpath(*["a-folder-that-is-not-there" for _ in range(6)])


def test_translate_with_a_missing_model_folder_is_an_error(tmp_path):
    result = invoke("translate", "x", "--model", str(long_missing_folder(tmp_path)))
    assert_clean_error(result, "does not exist")


def test_translate_with_a_folder_without_config_json_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("translate", "x", "--model", str(tmp_path / "empty"))
    assert_clean_error(result, "config.json")


def test_translate_with_a_corrupt_model_pt_is_an_error(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (run_dir / "model.pt").write_bytes(b"definitely not a checkpoint")
    result = invoke("translate", "x", "--model", str(run_dir), "--device", "cpu")
    assert_clean_error(result, "model.pt")


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "no-config",
        "corrupt",
    ],
)
def test_model_errors_are_one_line(tmp_path, make_run, case):
    if case == "missing":
        model = long_missing_folder(tmp_path)
    elif case == "no-config":
        model = tmp_path / "a-run-folder-without-any-config-json-file-in-it"
        model.mkdir()
    else:
        model, _ = make_run(tmp_path / "run")
        (model / "model.pt").write_bytes(b"definitely not a checkpoint")
    result = invoke("translate", "x", "--model", str(model), "--device", "cpu")
    assert result.exit_code == 1
    assert len(error_lines(result)) == 1, result.stderr


def test_train_with_missing_data_is_a_one_line_error():
    result = invoke("train", "--data", "/does/not/exist", "--quiet")
    assert_clean_error(result, "/does/not/exist")
    assert len(error_lines(result)) == 1


def test_train_with_missing_data_leaves_no_run_folder(tmp_path):
    invoke("train", "--data", "/does/not/exist", "--quiet")
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_train_with_an_unknown_tokenizer_kind_is_a_usage_error_and_leaves_no_run_folder(tmp_path):
    result = invoke("train", "--tokenizer", "nope", "--quiet")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Invalid value for '--tokenizer': Value error, 'nope' must be one of bpe" in panel(
        result.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_an_interrupted_training_exits_130_and_says_how_to_resume(tmp_path, monkeypatch):
    from tformer_cli.training.trainer import Trainer, TrainResult

    def interrupted_run(self, quiet: bool = False) -> TrainResult:
        return TrainResult(self.run_dir, self.state, None, "interrupted (Ctrl-C)", True)

    monkeypatch.setattr(Trainer, "run", interrupted_run)
    result = invoke("train", "--name", "cut", "--quiet")
    assert result.exit_code == 130, result.output
    assert "--resume runs/cut" in result.stderr and "no model.pt yet" in result.stderr


def test_ctrl_c_while_the_data_is_tokenized_leaves_no_run_folder(tmp_path, monkeypatch):
    from tformer_cli.data.data_cache import DataCache

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DataCache, "encoded", interrupted)
    result = invoke("train", "--name", "cut", "--quiet")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert not (tmp_path / "runs" / "cut").exists()


def test_ctrl_c_while_the_command_starts_up_is_one_word_and_exit_130():
    """Importing torch takes a second or two: a Ctrl-C then is no traceback either."""
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'tformer_cli.cli':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "from tformer_cli.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")


def test_running_out_of_memory_is_one_line_naming_the_size(tmp_path, make_run, monkeypatch):
    from tformer_cli.decode import streams

    def out_of_memory(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate"
            " memory: you tried to allocate 2867200000000 bytes. Error code 12"
        )

    monkeypatch.setattr(streams, "translate_chunks", out_of_memory)
    run_dir, _ = make_run(tmp_path / "run")
    result = invoke("translate", "red cat", "--model", str(run_dir), "--device", "cpu")
    assert_clean_error(result, "out of memory (tried to allocate 2867200000000 bytes): try")


def test_resume_of_a_folder_without_config_json_is_an_error(tmp_path):
    (tmp_path / "old").mkdir()
    result = invoke("train", "--resume", str(tmp_path / "old"), "--quiet")
    assert_clean_error(result, "no config.json")


def test_bad_norm_is_a_usage_error():
    result = invoke("train", "--norm", "middle", "--quiet")
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "--norm" in result.output


# ---------------------------------------------------------------------------- a working run
def test_translate_prints_one_line_per_input_in_order(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    args = ["--model", str(run_dir), "--device", "cpu", "--max-len-b", "3"]
    result = invoke("translate", "red cat", "big dog two", "one", *args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for text, line in zip(["red cat", "big dog two", "one"], lines, strict=True):
        alone = invoke("translate", text, *args)
        assert alone.stdout.splitlines() == [line]


def test_translate_threads_set_torch_s_cpu_threads_as_eval_s(tmp_path, make_run):
    """--threads N decodes on N CPU threads, as eval's (report.eval_run.use_threads)."""
    run_dir, _ = make_run(tmp_path / "run")
    run = ["-m", str(run_dir), "--device", "cpu"]
    args = ["translate", "red", *run, "--greedy", "--max-len-b", "2"]
    for threads in (2, 1):
        assert invoke(*args, "--threads", str(threads)).exit_code == 0
        assert torch.get_num_threads() == threads


def test_a_min_len_past_the_length_limit_is_noted_once(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    args = ["translate", "red cat", "one", "big dog", "-m", str(run_dir), "--device", "cpu"]
    result = invoke(*args, "--min-len", "500")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 3
    note = (
        "note: --min-len 500 is cut to the length limit (--max-len-a 1.5 x source tokens +"
        " --max-len-b 10) for sources of up to 326 tokens"
    )
    assert [line for line in error_lines(result) if "--min-len" in line] == [note]
    everyone = invoke(*args, "--min-len", "20", "--max-len-a", "0", "--max-len-b", "4")
    assert "for every source" in everyone.stderr
    for quiet in (["--min-len", "3"], ["--min-len", "500", "--quiet"]):
        assert "--min-len" not in invoke(*args, *quiet).stderr


@pytest.mark.parametrize("options", [["--precision", "int8"], ["--compile", "off"]])
def test_translate_runs_int8_and_eager_steps_and_bad_values_are_usage_errors(
    tmp_path, make_run, options
):
    run_dir, _ = make_run(tmp_path / "run")
    args = ["--model", str(run_dir), "--device", "cpu", "--max-len-b", "3", *options]
    result = invoke("translate", "red cat", "one", *args)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2
    bad = invoke("translate", "red cat", *args[:-1], "int4" if "int8" in options else "maybe")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert f"Invalid value for '{options[0]}'" in panel(bad.stderr)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--sample", "--temperature", "0"], "'--temperature': Value error, 0.0 must be in"
         " [0.0001, 10000]"),
        (["--sample", "--top-p", "1.5"], "'--top-p': Value error, 1.5 must be in (0, 1]"),
        (["--sample", "--epsilon", "1"], "'--epsilon': Value error, 1.0 must be in [0, 1)"),
        (["--top-k", "3"], "'--top-k': 3 needs --sample or --mbr"),
        (["--mbr", "4", "--mbr-from", "beam", "--temperature", "0.5"],
         "'--temperature': 0.5 needs --sample or --mbr"),
        (["--mbr", "4", "--mbr-utility", "ter"], "'--mbr-utility': Value error, 'ter' must be"
         " one of chrf, bleu"),
        (["--mbr", "4", "--mbr-from", "dice"], "'--mbr-from': Value error, 'dice' must be one"
         " of sample, beam"),
        (["--beam", "2", "--nbest", "3"], "'--nbest': 3 needs --beam >= 3"),
    ],
)  # fmt: skip
def test_bad_sampling_and_mbr_values_are_usage_errors(tmp_path, make_run, options, message):
    run_dir, _ = make_run(tmp_path / "run")
    result = invoke("translate", "red cat", "--model", str(run_dir), "--device", "cpu", *options)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert f"Invalid value for {message}" in panel(result.stderr)


def test_samples_and_mbr_translate_with_one_line_per_input(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    args = ["--model", str(run_dir), "--device", "cpu", "--max-len-b", "3", "--seed", "4"]
    samples = invoke("translate", "red cat", "one", "--sample", "--nbest", "3", *args)
    assert samples.exit_code == 0, samples.output
    assert [line.split("\t")[0] for line in samples.stdout.splitlines()] == ["0"] * 3 + ["1"] * 3
    again = invoke("translate", "red cat", "one", "--sample", "--nbest", "3", *args)
    assert again.stdout == samples.stdout  # a seed repeats the samples
    mbr = invoke("translate", "red cat", "one", "--mbr", "4", "--scores", *args)
    assert mbr.exit_code == 0 and len(mbr.stdout.splitlines()) == 2
    assert all(0 <= float(line.split("\t")[0]) <= 100 for line in mbr.stdout.splitlines())


def test_a_blank_line_of_a_file_gives_a_blank_line_in_its_place(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("red cat\n \t \none\n", encoding="utf-8")
    args = ["--model", str(run_dir), "--device", "cpu", "--max-len-b", "3"]
    result = invoke("translate", "-f", str(tmp_path / "in.txt"), *args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == ""
    assert lines[2] == invoke("translate", "one", *args).stdout.strip()


def test_translate_reads_a_file_and_the_newest_run_by_default(tmp_path, make_run):
    make_run(tmp_path / "runs" / "only")
    (tmp_path / "in.txt").write_text("red cat\nsmall bird\n", encoding="utf-8")
    result = invoke("translate", "--file", "in.txt", "--device", "cpu", "--max-len-b", "2")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2


# ---------------------------------------------------------------------------- average
def test_average_writes_the_mean_of_the_newest_checkpoints(tmp_path, make_run):
    from tformer_cli.checkpoint import load_state, save_checkpoint

    run_dir, model = make_run(tmp_path / "run")
    states = [{k: v + step for k, v in model.state_dict().items()} for step in (0, 1, 2)]
    for step, state in enumerate(states, start=1):
        save_checkpoint(run_dir, 250 * step, state, keep=5)
    result = invoke("average", "-m", str(run_dir), "--last", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "averaged 2 checkpoints (step-000500 to step-000750)"
    assert result.stderr.strip() == f"wrote {run_dir / 'averaged.pt'}"
    averaged = load_state(run_dir / "averaged.pt")
    for k, v in model.state_dict().items():
        assert torch.allclose(averaged[k], v + 1.5, atol=1e-6), k
    result = invoke("average", "-m", str(run_dir), "-o", str(tmp_path / "all.pt"))  # 3 of --last 5
    assert result.exit_code == 0, result.output
    averaged = load_state(tmp_path / "all.pt")
    for k, v in model.state_dict().items():
        assert torch.allclose(averaged[k], v + 1.0, atol=1e-6), k


def test_average_of_a_missing_run_is_a_one_line_error(tmp_path):
    result = invoke("average", "-m", str(long_missing_folder(tmp_path)))
    assert_clean_error(result, "does not exist")
    assert len(error_lines(result)) == 1


def test_average_of_a_run_without_checkpoints_is_a_one_line_error(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    result = invoke("average", "-m", str(run_dir))
    assert_clean_error(result, "0 checkpoint(s)", "--average")
    assert len(error_lines(result)) == 1


# ---------------------------------------------------------------------------- --data errors
def write_plain(folder, stem: str, lines: dict[str, list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, text in lines.items():
        (folder / f"{stem}.{lang}").write_text("".join(f"{t}\n" for t in text), encoding="utf-8")


@pytest.mark.parametrize(
    ("case", "fragment"),
    [("no train split", "no train split"), ("missing target file", "val.en: no such file"),
     ("line counts", "val.de has 2 lines but"), ("unknown language", "no language 'cs'")],
)  # fmt: skip
def test_train_with_bad_plain_data_is_a_one_line_error(tmp_path, case, fragment):
    data = tmp_path / "data"
    pairs = {"de": ["ein Hund", "eine Katze"] * 10, "en": ["a dog", "a cat"] * 10}
    write_plain(data, "test" if case == "no train split" else "train", pairs)
    if case == "missing target file":
        write_plain(data, "val", {"de": ["ein Baum"]})
    if case == "line counts":
        write_plain(data, "val", {"de": ["ein Baum", "zwei"], "en": ["a tree"]})
    tgt = "cs" if case == "unknown language" else "en"
    result = invoke("train", "--data", str(data), "--src", "de", "--tgt", tgt, "--quiet")
    assert_clean_error(result, fragment)
    assert len(error_lines(result)) == 1
    assert not (tmp_path / "runs").exists()


def test_errors_naming_paths_with_brackets_print_them_as_given(tmp_path):
    """Error text is not read as rich markup: ``[/bold]`` in a path neither crashes nor vanishes."""
    missing = tmp_path / "a[/bold]b[red]c.txt"
    result = invoke("translate", "-f", str(missing))
    assert_clean_error(result, "a[/bold]b[red]c.txt")


def test_translate_with_both_sentences_and_a_file_is_an_error(tmp_path):
    (tmp_path / "in.txt").write_text("the dog\n")
    result = invoke("translate", "the cat", "-f", str(tmp_path / "in.txt"))
    assert_clean_error(result, "not both")


def test_a_file_given_as_the_model_is_named_as_a_file(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    result = invoke("translate", "x", "--model", str(tmp_path / "model.pt"))
    assert_clean_error(result, "is a file", "run folder")


def test_an_empty_input_file_says_there_is_nothing_to_translate(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "out.txt"
    args = ("translate", "-m", str(run_dir), "-f", str(tmp_path / "empty.txt"), "-o", str(out))
    result = invoke(*args)
    assert result.exit_code == 0 and "nothing to translate" in result.stderr
    assert out.read_text() == ""


# ---------------------------------------------------------------------------- translate input
def run_args(run_dir, *extra: str) -> list[str]:
    return ["-m", str(run_dir), "--device", "cpu", "--greedy", "--max-len-b", "2", *extra]


def test_invalid_utf8_on_stdin_is_a_one_line_error_naming_the_line(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    result = runner.invoke(
        app, ["translate", *run_args(run_dir)], input=b"red cat\nder hund\xff sieht\n"
    )
    assert_clean_error(result, "stdin line 2 is not valid UTF-8")
    assert len(error_lines(result)) == 1


def test_invalid_utf8_in_a_file_is_a_one_line_error_naming_file_and_line(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "in.txt").write_bytes(b"der hund\xff sieht\n")
    result = invoke("translate", "-f", "in.txt", *run_args(run_dir))
    assert_clean_error(result, "in.txt line 1 is not valid UTF-8")
    assert len(error_lines(result)) == 1


def test_an_argument_that_is_not_utf8_is_a_one_line_error(tmp_path, make_run):
    """Python keeps an argument's undecodable bytes as lone surrogates (``surrogateescape``)."""
    run_dir, _ = make_run(tmp_path / "run")
    result = invoke("translate", "red cat", "der hund\udcff", *run_args(run_dir))
    assert_clean_error(result, "argument 2 is not valid UTF-8")


SEPARATED = "red\u2028cat\r\nblue\x85dog\x1c\n\x0c\n big  dog\x1d"  # 4 lines, ended by \n only


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_a_line_is_what_ends_in_a_newline_as_in_corpus_files(tmp_path, make_run, source):
    """Other Unicode separators stay inside a line, a CRLF line loses its \\r: one output line
    per input line, each the translation of that line alone."""
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "in.txt").write_bytes(SEPARATED.encode())
    if source == "stdin":
        result = runner.invoke(app, ["translate", *run_args(run_dir)], input=SEPARATED.encode())
    else:
        result = invoke("translate", "-f", "in.txt", *run_args(run_dir))
    assert result.exit_code == 0, result.output
    lines = result.stdout_bytes.decode().split("\n")
    assert lines.pop() == "" and len(lines) == 4
    texts = ["red\u2028cat", "blue\x85dog\x1c", "\x0c", " big  dog\x1d"]
    alone = invoke("translate", *texts, *run_args(run_dir))
    assert alone.stdout_bytes.decode().split("\n")[:-1] == lines


def test_chunks_keep_input_order_and_global_indices(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    texts = ["red cat", "one", "big dog two three", "", "bird", "small green cat"]
    stdin = "".join(f"{t}\n" for t in texts).encode()
    whole = runner.invoke(app, ["translate", *run_args(run_dir, "--json")], input=stdin)
    chunked = runner.invoke(
        app, ["translate", *run_args(run_dir, "--json", "--chunk-size", "2")], input=stdin
    )
    assert chunked.exit_code == 0, chunked.output
    records = [json.loads(line) for line in chunked.stdout.splitlines()]
    assert [r["index"] for r in records] == list(range(6))
    assert [r["source"] for r in records] == texts
    alone = [json.loads(line) for line in whole.stdout.splitlines()]
    translations = [[h["translation"] for h in r["hypotheses"]] for r in records]
    assert translations == [[h["translation"] for h in r["hypotheses"]] for r in alone]


def test_a_too_long_line_is_named_by_its_line_number_across_chunks(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")  # max_positions 64
    stdin = ("red cat\n" * 4 + "dog " * 70 + "\n").encode()
    result = runner.invoke(app, ["translate", *run_args(run_dir, "--chunk-size", "2")], input=stdin)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "input 5 has 71 tokens; this model reads at most 64" in result.stderr
    args = ["inspect-attention", "dog " * 70, "-m", str(run_dir), "--device", "cpu", "--no-align"]
    assert_clean_error(invoke(*args), "the text has 71 tokens; this model reads at most 64")


def test_output_file_appears_whole_at_the_end_or_not_at_all(tmp_path, make_run):
    """Chunks go to stdout as they are translated, but -o FILE is written atomically: an error
    in a later chunk leaves the old file untouched."""
    run_dir, _ = make_run(tmp_path / "run")
    stdin = b"red cat\nblue dog\none\ntwo\nbad \xff line\n"
    args = ["translate", *run_args(run_dir, "--chunk-size", "2")]
    streamed = runner.invoke(app, args, input=stdin)
    assert streamed.exit_code == 1 and "stdin line 5 is not valid UTF-8" in streamed.stderr
    assert len(streamed.stdout.splitlines()) == 4  # the two chunks before the bad line
    (tmp_path / "out.txt").write_text("old\n")
    failed = runner.invoke(app, [*args, "-o", "out.txt"], input=stdin)
    assert failed.exit_code == 1
    assert (tmp_path / "out.txt").read_text() == "old\n"
    assert not list(tmp_path.glob(".out.txt.*"))  # no temporary file left behind
    ok = runner.invoke(app, [*args, "-o", "out.txt"], input=stdin[: stdin.index(b"bad")])
    assert ok.exit_code == 0 and ok.stdout == ""
    assert (tmp_path / "out.txt").read_text() == streamed.stdout


def test_translate_streams_output_before_stdin_ends(tmp_path, make_run):
    """A real process in a pipe: the first chunk's translations come out while stdin is still
    open, and every line gets its own output line once it closes."""
    run_dir, _ = make_run(tmp_path / "run")
    cmd = [
        sys.executable,
        "-m",
        "tformer_cli",
        "translate",
        *run_args(run_dir, "--chunk-size", "2"),
    ]
    env = {**os.environ, "TFORMER_THREADS": "1"}
    with subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as proc:
        try:
            proc.stdin.write(b"red cat\nblue dog\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, "no output within 30 s while stdin was open"
            first = proc.stdout.readline()
            assert first.endswith(b"\n")
            proc.stdin.write(b"one\ntwo\nbig bird\n")
            proc.stdin.close()
            rest = proc.stdout.read()
            assert proc.wait(timeout=30) == 0, proc.stderr.read()
        finally:
            proc.kill()
    assert (first + rest).count(b"\n") == 5


def test_a_reader_that_stops_early_ends_translate_quietly(tmp_path, make_run):
    """``tformer translate -f big | head -1``: once the reader is gone, the next chunk's write
    fails (EPIPE); translate then stops with the shell's code for it (141), saying nothing."""
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("red cat blue dog\n" * 3000)  # output > a pipe's 64 KiB
    args = run_args(run_dir, "-f", "in.txt", "--chunk-size", "500", "--max-len-b", "1", "-q")
    env = {**os.environ, "TFORMER_THREADS": "1"}
    with subprocess.Popen(
        [sys.executable, "-m", "tformer_cli", "translate", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    ) as proc:  # fmt: skip
        assert proc.stdout.readline().endswith(b"\n")
        proc.stdout.close()
        assert proc.wait(timeout=60) == 141
        assert proc.stderr.read() == b""


# ---------------------------------------------------------------------------- parallel files
TINY_TRAIN = [
    "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1", "--vocab-size", "60",
    "--max-tokens", "96", "--warmup", "2", "--valid-every", "4", "--valid-bleu-size", "2",
    "--max-steps", "4", "--epochs", "0", "--device", "cpu", "--precision", "fp32",
]  # fmt: skip


@pytest.fixture
def wmt_files(tmp_path):
    """WMT-style plain parallel files (train/dev/newstest .de/.en) in a folder of their own."""
    from tests.conftest import reversal_pairs

    folder = tmp_path / "wmt"
    for stem, n, seed in (("train", 40, 1), ("dev", 6, 2), ("newstest", 5, 3)):
        pairs = reversal_pairs(n, seed)
        write_plain(folder, stem, {"de": [s for s, _ in pairs], "en": [t for _, t in pairs]})
    return folder


def test_train_on_plain_parallel_files_keeps_their_absolute_paths(tmp_path, wmt_files):
    """train.* are the train split, dev.* the valid one, and the test split is carved from
    train (a tenth of 40 pairs): 36 pairs left to train on."""
    files = ["--src-file", "wmt/train.de", "--tgt-file", "wmt/train.en"]
    valid = ["--valid-src-file", "wmt/dev.de", "--valid-tgt-file", "wmt/dev.en"]
    result = invoke("train", *files, *valid, "--name", "r", *TINY_TRAIN)
    assert result.exit_code == 0, result.output
    assert "36 training pairs" in result.stderr
    config = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())["train"]
    assert config["data"] == "files"
    assert config["src_file"] == str(wmt_files / "train.de")
    assert config["valid_tgt_file"] == str(wmt_files / "dev.en")


def eval_json(folder, *args: str) -> dict:
    result = invoke("eval", *args, "--beam", "1", "--device", "cpu", "--json", "-o", "e.json")
    assert result.exit_code == 0, result.output
    return json.loads((folder / "e.json").read_text())


def test_eval_scores_a_files_runs_own_test_split_and_any_two_files(
    tmp_path, wmt_files, monkeypatch
):
    """From another folder: the run's test split is carved again from its train files with its
    seed; --src-file/--tgt-file score every pair of two files, in order."""
    files = ["--src-file", "wmt/train.de", "--tgt-file", "wmt/train.en"]
    assert invoke("train", *files, "--name", "r", *TINY_TRAIN, "--quiet").exit_code == 0
    run_dir = tmp_path / "runs" / "r"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    own = eval_json(elsewhere, "-m", str(run_dir))
    assert (own["source"]["data"], own["source"]["split"]) == ("files", "test")
    assert own["sizes"]["sentences"] == 4
    news = [wmt_files / "newstest.de", wmt_files / "newstest.en"]
    scored = eval_json(elsewhere, "-m", str(run_dir), "--src-file", str(news[0]),
                       "--tgt-file", str(news[1]))  # fmt: skip
    assert scored["source"]["split"] == "all" and scored["sizes"]["sentences"] == 5
    assert scored["source"]["data"] == f"{news[0]} + {news[1]}"


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--src-file", "wmt/newstest.de"], "give both a source file and a target file"),
     (["--src-file", "wmt/newstest.de", "--tgt-file", "wmt/newstest.en", "--data", "toy"],
      "give --data or --src-file/--tgt-file, not both"),
     (["--src-file", "wmt/newstest.de", "--tgt-file", "wmt/dev.en"], "has 5 lines but"),
     (["--src-file", "wmt/newstest.de", "--tgt-file", "wmt/nope.en"], "nope.en: no such file")],
)  # fmt: skip
def test_eval_with_bad_parallel_files_is_a_one_line_error(
    tmp_path, make_run, wmt_files, options, message
):
    run_dir, _ = make_run(tmp_path / "run")
    result = invoke("eval", "-m", str(run_dir), *options, "--device", "cpu", "--quiet")
    assert_clean_error(result, message)
    assert len(error_lines(result)) == 1


def test_beam_search_takes_the_runs_beam_alpha_unless_alpha_is_given(
    tmp_path, make_run, monkeypatch
):
    """translate, eval and compare decode with the run's ``beam_alpha`` (a recipe's choice on
    validation) by default, and with --alpha when it is given."""
    import dataclasses

    from tformer_cli.checkpoint import RunConfig
    from tformer_cli.decode import streams

    runs = [make_run(tmp_path / name)[0] for name in ("a", "b")]
    for run, alpha in zip(runs, (1.3, 0.2), strict=True):
        saved = RunConfig.load(run)
        dataclasses.replace(saved, train=dataclasses.replace(saved.train, beam_alpha=alpha)).save(
            run
        )
    seen: list[float] = []
    real = streams.translate_chunks
    monkeypatch.setattr(
        streams, "translate_chunks", lambda run, lines, cfg, *a, **k: (
            seen.append(cfg.alpha), real(run, lines, cfg, *a, **k))[1],
    )  # fmt: skip
    for options in ([], ["--alpha", "0.4"]):
        result = invoke("translate", "red cat", "-m", str(runs[0]), "-m", str(runs[1]), *options)
        assert result.exit_code == 0, result.output
    assert seen == [1.3, 0.4]  # the first run's, then the option's
    (tmp_path / "s.txt").write_text("red cat\nbig dog\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("cat red\ndog big\n", encoding="utf-8")
    files = ["--src-file", "s.txt", "--tgt-file", "t.txt", "-m", str(runs[1])]
    assert eval_json(tmp_path, *files)["config"]["search"]["alpha"] == 0.2
    assert eval_json(tmp_path, *files, "--alpha", "0.9")["config"]["search"]["alpha"] == 0.9
    from tformer_cli.report import compare

    compared: list[float] = []
    monkeypatch.setattr(
        compare,
        "compare_runs",
        lambda runs, out, request, **k: compared.append(request.config.search.alpha),
    )
    assert invoke("compare", "-m", str(runs[1]), "-m", str(runs[0])).exit_code == 0
    assert compared == [0.2]
