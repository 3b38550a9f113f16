"""The one convention every ``tformer`` command follows (docs/cli.md#conventions): ``-h``,
``--json`` a flag with ``-o FILE`` for a file, the run as ``-m RUN``, the old spellings kept one
release with a notice, the run's own precision by default, and the shared exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import typer
from typer.testing import CliRunner

from tests.conftest import checkout_first_env
from tformer_cli.cli import app
from tformer_cli.config import MAX_VOCAB

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture
def run_dir(tmp_path, make_run):
    return make_run(tmp_path / "run")[0]


def invoke(*args: object, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def without_time(record: dict) -> dict:
    """A translate --json record less its timing (``ms``)."""
    return {k: v for k, v in record.items() if k != "ms"}


def commands() -> list[list[str]]:
    """Every command (leaf) of the app, as argument lists."""
    found: list[list[str]] = []

    def walk(cmd, prefix: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            found.append(prefix)
        for name, sub in (subs or {}).items():
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return found


# ---------------------------------------------------------------------------- help, completion
@pytest.mark.parametrize("path", [[], ["tokenizer"], *commands()], ids=" ".join)
def test_dash_h_is_help_everywhere(path):
    short, long = invoke(*path, "-h"), invoke(*path, "--help")
    assert short.exit_code == 0, short.output
    assert short.stdout == long.stdout and "Usage:" in short.stdout


def test_shell_completion_is_on():
    result = invoke("--help")
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


# ---------------------------------------------------------------------------- --json and -o
@pytest.mark.parametrize(
    "args",
    [
        ["eval", "--json", "out.json"],
        ["inspect-attention", "red cat", "--json", "maps.JSON"],
        ["translate", "--json", "out.json", "red cat"],
        ["compare", "--json", "c.json"],
        ["runs", "--json", "r.json"],
    ],
    ids=lambda a: a[0],
)
def test_json_with_a_file_name_is_a_one_line_usage_error_pointing_to_o(args, tmp_path):
    result = invoke(*args)
    assert result.exit_code == 2
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("Error:") and "--json -o" in lines[0]
    assert result.stdout == "" and list(tmp_path.iterdir()) == []  # nothing translated or written


def test_translate_json_goes_to_stdout_or_with_o_to_a_file(run_dir, tmp_path):
    args = ["translate", "-m", run_dir, "--device", "cpu", "--greedy", "--max-len-b", "2"]
    printed = invoke(*args, "--json", "red cat")
    assert printed.exit_code == 0, printed.output
    written = invoke(*args, "--json", "-o", tmp_path / "t.jsonl", "red cat")
    assert written.exit_code == 0 and written.stdout == "", written.output
    record = json.loads((tmp_path / "t.jsonl").read_text(encoding="utf-8"))
    assert without_time(record) == without_time(json.loads(printed.stdout))


def test_runs_json_and_o_write_what_would_print(run_dir, tmp_path):
    printed = invoke("runs", run_dir.parent, "--json")
    assert printed.exit_code == 0, printed.output
    written = invoke("runs", run_dir.parent, "--json", "-o", tmp_path / "runs.json")
    assert written.exit_code == 0 and written.stdout == ""
    assert json.loads((tmp_path / "runs.json").read_text()) == json.loads(printed.stdout)
    table = invoke("runs", run_dir.parent)
    written = invoke("runs", run_dir.parent, "-o", tmp_path / "runs.txt")
    assert written.exit_code == 0 and written.stdout == ""
    assert (tmp_path / "runs.txt").read_text() == table.stdout and "run" in table.stdout


@pytest.mark.parametrize(
    ("args", "written"),
    [(["translate", "--greedy", "--max-len-b", "2", "-o", "t.txt", "red cat"], "t.txt"),
     (["translate", "-k", "2", "--max-len-b", "2", "--trace", "trace.json", "red cat"],
      "trace.json"),
     (["eval", "--data", "corpus", "--limit", "2", "--beam", "1", "-o", "report.txt"],
      "report.txt"),
     (["eval", "--data", "corpus", "--limit", "2", "--beam", "1", "--json", "-o", "e.json"],
      "e.json"),
     (["eval", "--data", "corpus", "--limit", "2", "--beam", "1", "--hypotheses", "hyps.txt"],
      "hyps.txt"),
     (["inspect-attention", "red cat", "--no-align", "-o", "maps.txt"], "maps.txt"),
     (["inspect-attention", "red cat", "--no-align", "--json", "-o", "maps.json"], "maps.json"),
     (["inspect-attention", "red cat", "--no-align", "--json", "--save", "m.svg"], "m.svg"),
     (["runs", "-o", "runs.txt"], "runs.txt"),
     (["average", "--last", "2", "-o", "mean.pt"], "mean.pt"),
     (["tokenizer", "train", "--data", "corpus", "--vocab-size", "60", "-o", "tok.json"],
      "tok.json")],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)  # fmt: skip
def test_a_file_written_where_a_command_was_told_is_named_once_on_stderr(
    args, written, tmp_path, make_run, tiny_corpus
):
    """``wrote FILE`` on stderr, once, after the file is whole; ``--quiet`` silences it."""
    from tformer_cli.checkpoint import save_checkpoint

    run_dir, model = make_run(tmp_path / "runs" / "r")
    for step in (1, 2):
        save_checkpoint(run_dir, step, model.state_dict(), keep=2)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert stderr_lines(result).count(f"wrote {written}") == 1, result.stderr
    assert (tmp_path / written).is_file()
    command = typer.main.get_command(app)
    for name in args[: 2 if args[0] == "tokenizer" else 1]:
        command = command.commands[name]
    if any(p.name == "quiet" for p in command.params):
        assert "wrote" not in invoke(*args, "--quiet").stderr


# ---------------------------------------------------------------------------- the run as -m
def test_a_command_given_no_run_names_the_one_it_uses(tmp_path, make_run):
    """``make demo``'s run, ``runs/toy-<time>``, is the newest: a command without -m says it uses
    it (not with --quiet), ``-m toy`` names it, and ``tformer runs`` marks it."""
    run_dir, _ = make_run(tmp_path / "runs" / "toy-20261126-093738")
    stop = {"step": 1, "stopped_by": "reached --max-steps 1"}
    (run_dir / "log.jsonl").write_text(f'{{"step": 1, "loss": 1.0}}\n{json.dumps(stop)}\n')
    args = ["translate", "--device", "cpu", "--greedy", "--max-len-b", "2", "red cat"]
    chosen = invoke(*args)
    assert chosen.exit_code == 0, chosen.output
    assert stderr_lines(chosen) == [
        "using run runs/toy-20261126-093738 (finished, newest; -m to choose)"
    ]
    assert invoke(*args, "--quiet").stderr == ""
    named = invoke(*args, "-m", "toy")
    assert (named.stdout, named.stderr) == (chosen.stdout, "")
    table = invoke("runs").stdout.splitlines()
    assert [line.split()[1] for line in table if line.startswith("* ")] == [run_dir.name]


def test_a_mistyped_run_is_one_line_before_torch_is_imported(tmp_path):
    """Found by name alone, before the seconds of importing torch (``python -X importtime``
    lists every module imported)."""
    command = [sys.executable, "-X", "importtime", "-m", "tformer_cli", "translate", "-m",
               "nosuchrun", "x"]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=checkout_first_env(), capture_output=True, text=True
    )
    lines = done.stderr.splitlines()
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import ")]
    said = [line for line in lines if not line.startswith("import ")]
    assert done.returncode == 1 and done.stdout == ""
    assert said == [
        "Error: run folder nosuchrun does not exist (nor runs/nosuchrun, nor"
        " runs/nosuchrun-YYYYMMDD-HHMMSS): see tformer runs"
    ]
    assert "tformer_cli.cli" in imported and "torch" not in imported


def test_show_takes_the_run_as_m_and_still_as_an_argument_with_a_notice(run_dir):
    new, old = invoke("show", "-m", run_dir), invoke("show", run_dir)
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert old.stdout == new.stdout
    assert new.stderr == ""
    [notice] = stderr_lines(old)
    assert "deprecated" in notice and "tformer show -m RUN" in notice


def test_a_run_given_both_ways_is_a_usage_error(run_dir):
    result = invoke("show", run_dir, "-m", run_dir)
    assert result.exit_code == 2 and "give it once" in result.output


def test_compare_needs_two_runs(run_dir):
    result = invoke("compare", "-m", run_dir)
    assert result.exit_code == 2 and "two runs or more" in result.output


# ---------------------------------------------------------------------------- renamed options
def test_tokenizer_train_kind_is_now_tokenizer_with_a_notice(tiny_corpus, tmp_path):
    args = ["tokenizer", "train", "--data", tiny_corpus, "--vocab-size", "60"]
    new = invoke(*args, "-o", tmp_path / "new.json", "--tokenizer", "wordlevel")
    old = invoke(*args, tmp_path / "old.json", "--kind=wordlevel")
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert (tmp_path / "new.json").read_text() == (tmp_path / "old.json").read_text()
    *notices, written = stderr_lines(old)
    assert written == f"wrote {tmp_path / 'old.json'}"
    assert len(notices) == 2 and all("deprecated" in n for n in notices)
    assert any("use --tokenizer" in n for n in notices)
    assert any("tokenizer train -o FILE" in n for n in notices)


def test_the_rename_is_per_command(run_dir):
    """inspect-attention's own --kind (cross, encoder, decoder) is not tokenizer train's."""
    result = invoke("inspect-attention", "red cat", "-m", run_dir, "--kind", "nope")
    assert result.exit_code == 2 and "deprecated" not in result.stderr
    assert "Invalid value for '--kind'" in result.stderr


# ---------------------------------------------------------------------------- precision
def test_the_default_precision_is_the_runs_own(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["precision"] = "bf16"
    (run_dir / "config.json").write_text(json.dumps(config))
    from tformer_cli.api.run import own_precision

    assert own_precision(run_dir) == "bf16"
    import tformer_cli as tformer

    assert tformer.load(run_dir, device="cpu").loaded[0].dtype == torch.bfloat16
    args = ["translate", "-m", run_dir, "--device", "cpu", "-k", "2", "--json", "red cat dog"]
    default, bf16 = invoke(*args), invoke(*args, "--precision", "bf16")
    assert default.exit_code == 0, default.output
    assert without_time(json.loads(default.stdout)) == without_time(json.loads(bf16.stdout))


# ---------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_an_unknown_option_is_exit_2_everywhere(path):
    result = invoke(*path, "--no-such-option")
    assert result.exit_code == 2, result.output


def test_our_errors_are_exit_1(tmp_path):
    result = invoke("tokenizer", "train", "-o", tmp_path / "t.json", "--vocab-size", MAX_VOCAB + 1)
    assert result.exit_code == 2  # out of the option's range: a usage error
    result = invoke("show", "-m", tmp_path / "missing")
    assert result.exit_code == 1 and stderr_lines(result)[0].startswith("Error:")


# ---------------------------------------------------------------------------- help at 80 columns
def shown_options(path: list[str]) -> list:
    """The options a command's help shows (hidden ones aside), laid out as for its help."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    with typer.Context(cmd, info_name=" ".join(["tformer", *path])) as ctx:
        params = cmd.get_params(ctx)
    return [p for p in params if p.param_type_name == "option" and not p.hidden]


def declared_options(path: list[str]) -> list[str]:
    """Every option name a command declares."""
    return [opt for param in shown_options(path) for opt in (*param.opts, *param.secondary_opts)]


TYPE_NAMES = re.compile(r"<(bool|str|int|float|path|text|list\[[^]]*\])[^>]*>", re.IGNORECASE)


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_help_reads_at_80_columns_with_nothing_cut(path):
    """Every declared option name in full, no ellipsis, no line over 80 columns, plain
    metavars (no Python type names), options in panels, and an example."""
    text = invoke(*path, "--help").stdout
    assert "…" not in text and not re.search(r"-[\w-]*\.\.\.", text)  # nothing cut
    assert max(len(line) for line in text.splitlines()) <= 80
    for option in declared_options(path):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), option
    assert not TYPE_NAMES.search(text), TYPE_NAMES.search(text)
    for param in shown_options(path):  # each metavar whole, on one line
        assert not param.metavar or re.search(rf"\s{re.escape(param.metavar)}\s", text), (
            param.metavar
        )
    assert "Examples:" in text and f"$ tformer {' '.join(path)}" in text
    if len(declared_options(path)) > 8:  # a long page is grouped
        assert len(re.findall(r"╭─ ", text)) >= 3


@pytest.mark.parametrize("path", [[], ["tokenizer"]], ids=["tformer", "tokenizer"])
def test_the_groups_help_has_plain_metavars(path):
    text = invoke(*path, "--help").stdout
    assert "…" not in text and not TYPE_NAMES.search(text), TYPE_NAMES.search(text)
    assert max(len(line) for line in text.splitlines()) <= 80


def test_choices_show_as_choices():
    text = invoke("train", "--help").stdout
    for choices in ("bpe|unigram|wordlevel", "auto|rsqrt|linear|cosine", "fp32|bf16|auto"):
        assert choices in text
