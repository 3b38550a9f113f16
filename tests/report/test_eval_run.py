"""Tests for tformer_cli.report.eval_run and the kept results of tformer_cli.report.request:
the `tformer eval` command on a run folder, and its kept results."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import pytest
import sacrebleu
import torch
from datasets import Dataset
from rich.console import Console
from tokenizers import normalizers
from typer.testing import CliRunner

from tests.conftest import WORDS
from tformer_cli import device
from tformer_cli.checkpoint import TARGET_TOKENIZER, RunConfig, atomic_torch_save, load_run
from tformer_cli.cli import app
from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import encode, load_tokenizer, save_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.report import eval_run
from tformer_cli.report.eval_run import evaluate_run
from tformer_cli.report.evaluation import EvalConfig, EvalReport, report_json
from tformer_cli.report.exposure import fmt, pct
from tformer_cli.report.request import (
    EVALS,
    EvalKey,
    EvalRequest,
    load_stored_eval,
    read_stored_eval,
    stored_evals,
)

# ---------------------------------------------------------------------------- the command
runner = CliRunner()


def test_eval_prints_the_report_and_writes_json_and_hypotheses(tmp_path, corpus_run):
    json_path, hyp_path = tmp_path / "report.json", tmp_path / "hyps.txt"
    args = ["eval", "-m", str(corpus_run), "--limit", "3", "--beam", "2", "--device", "cpu",
            "--threads", "1", "--quiet"]  # fmt: skip
    written = runner.invoke(
        app, [*args, "--json", "-o", str(json_path), "--hypotheses", str(hyp_path)]
    )
    assert written.exit_code == 0 and written.stdout == "", written.output
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(json_path.read_text())
    assert list(data) == [f.name for f in dataclasses.fields(EvalReport)]
    assert data["source"]["data"] == str(corpus_run.parent / "corpus")  # the run's own data
    assert data["source"]["precision"] == "fp32" and data["source"]["limit"] == 3
    assert data["sizes"]["sentences"] == 3 and data["config"]["search"]["beam"] == 2
    assert len(hyp_path.read_text().splitlines()) == 3
    for number in (fmt(data["beam"]["bleu"]), pct(data["tf"]["acc"]), fmt(data["tf"]["ppl"])):
        assert number in result.stdout
    for section in ("1. Teacher", "2. Free", "3.", "4.", "5.", "6.", "Caveat", "sample:", "time:"):
        assert section in result.stdout
    assert result.stdout.index("1. Teacher") < result.stdout.index("2. Free")  # as numbered


def test_eval_report_names_the_precision_in_effect(corpus_run):
    """--json prints the report's JSON on stdout; without it, the text names the same precision."""
    args = ["eval", "-m", str(corpus_run), "--limit", "1", "--beam", "1", "--device", "cpu",
            "--precision", "bf16", "--threads", "1", "--quiet"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"]["precision"] == "bf16 autocast"
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "cpu bf16 autocast, 1 CPU thread" in text.stdout


def test_eval_split_all_scores_a_whole_file_in_its_order(tmp_path, corpus_run):
    """A single file is carved into train/valid/test for training; ``--split all`` scores it all."""
    pairs = [(" ".join(WORDS[i : i + 3]), " ".join(WORDS[i + 1 : i + 4])) for i in range(7)]
    data = tmp_path / "mine.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    json_path, hyp_path = tmp_path / "r.json", tmp_path / "h.txt"
    result = runner.invoke(
        app,
        ["eval", "-m", str(corpus_run), "--data", str(data), "--split", "all", "--beam", "1",
         "--json", "-o", str(json_path), "--hypotheses", str(hyp_path), "--device", "cpu",
         "--threads", "1", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(json_path.read_text())
    assert report["sizes"]["sentences"] == 7 and report["source"]["split"] == "all"
    assert len(hyp_path.read_text().splitlines()) == 7


def test_hypotheses_keep_one_line_per_pair_when_a_pair_is_too_long(tmp_path, corpus_run):
    too_long = " ".join(WORDS * 30)  # longer than the tiny model's positions
    pairs = [("red cat", "blue dog"), (too_long, "one"), ("big bird", "small bird")]
    data = tmp_path / "mine.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    hyp_path = tmp_path / "h.txt"
    args = ["eval", "-m", str(corpus_run), "--data", str(data), "--split", "all", "--beam", "1",
            "--hyp", str(hyp_path), "--device", "cpu", "--threads", "1", "--quiet"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = hyp_path.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # 3 lines, the 2nd empty
    data.write_text(f"{too_long}\tone\n", encoding="utf-8")
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "every pair (1) is longer than" in result.stderr


def test_eval_of_a_file_without_a_test_split_says_the_test_split_is_carved(tmp_path, corpus_run):
    pairs = [(" ".join(WORDS[i : i + 3]), " ".join(WORDS[i + 1 : i + 4])) for i in range(7)]
    data = tmp_path / "mine.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs) * 3, encoding="utf-8")
    args = ["eval", "-m", str(corpus_run), "--data", str(data), "--beam", "1", "--device", "cpu",
            "--threads", "1"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "has no test split: scoring the 2 pairs carved" in " ".join(result.stderr.split())
    assert "carved" not in runner.invoke(app, [*args, "--split", "all"]).stderr


def test_eval_with_an_unknown_split_is_a_usage_error(corpus_run):
    result = runner.invoke(app, ["eval", "-m", str(corpus_run), "--split", "dev"])
    assert result.exit_code == 2
    assert "Invalid value for '--split'" in result.stderr
    assert "Traceback" not in result.output


def request(**options) -> EvalRequest:
    """A request for the run's own test split on the CPU, one thread, greedy only."""
    options = {"config": EvalConfig(DecodeConfig(beam=1)), "device": "cpu", "threads": 1, **options}
    return EvalRequest(**options)


@pytest.mark.parametrize(
    ("env", "option", "threads"), [("2", 0, 2), ("", 0, 1), ("", 2, 2), ("1", 2, 2)]
)
def test_eval_threads_come_from_the_option_then_tformer_threads_then_idle_cores(
    monkeypatch, corpus_run, env, option, threads
):
    monkeypatch.setenv("TFORMER_THREADS", env)
    monkeypatch.setattr(device, "_process_wide", True)  # the CLI's process: after setup()
    monkeypatch.setattr(device, "allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(device, "busy_cores", lambda: 2.0)  # both cores busy with other work
    asked = request(limit=1, threads=option, device="auto")
    report = evaluate_run(corpus_run, asked, quiet=True).report
    assert torch.get_num_threads() == report.source.threads == threads


# ---------------------------------------------------------------------------- stored results
def test_eval_keeps_its_result_with_both_outputs_in_the_run_folder_when_asked(tmp_path, corpus_run):
    hyp_path = tmp_path / "hyps.txt"
    asked = request(limit=3, config=EvalConfig(DecodeConfig(beam=2)))
    evaluation = evaluate_run(corpus_run, asked, keep=True, quiet=True, hyp_path=hyp_path)
    report = evaluation.report
    (path,) = (corpus_run / EVALS).glob("*.json")
    stored = read_stored_eval(path)
    assert stored == evaluation.stored and path.stem == stored.key
    assert stored.report == json.loads(report_json(report)) == report.to_dict()
    assert stored.model_sha256 == file_sha256(corpus_run / "model.pt")
    assert stored.request["split"] == "test" and stored.request["limit"] == 3
    assert len(stored.greedy) == len(stored.refs) == 3 and stored.beam is not None
    assert stored.beam == hyp_path.read_text(encoding="utf-8").splitlines()
    assert stored.beam == evaluation.hypotheses
    bleu = sacrebleu.BLEU(force=True)
    assert report.greedy.bleu == bleu.corpus_score(stored.greedy, [stored.refs]).score
    assert report.beam is not None
    assert report.beam.bleu == bleu.corpus_score(stored.beam, [stored.refs]).score
    assert stored_evals(corpus_run) == [stored]


def test_a_stored_result_is_keyed_by_model_bytes_data_split_limit_and_settings(
    corpus_run, tiny_corpus, make_run
):
    asked = request(limit=3, config=EvalConfig(DecodeConfig(beam=2)))
    evaluate_run(corpus_run, asked, keep=True, quiet=True)
    config = RunConfig.load(corpus_run)

    def key(dtype: torch.dtype | None = None, **changes) -> EvalKey:
        return dataclasses.replace(asked, **changes).key(
            corpus_run, config, torch.device("cpu"), dtype
        )

    stored = load_stored_eval(corpus_run, key())
    assert stored is not None and stored.key == key().digest
    assert key(data=str(tiny_corpus)).data == key().data == str(tiny_corpus)
    assert key(threads=2).digest == key().digest  # threads do not change the numbers
    others = [
        key(limit=2), key(limit=None), key(split="valid"),
        key(config=EvalConfig(DecodeConfig(beam=3))),
        key(config=EvalConfig(asked.config.search, seed=1)),
        key(torch.bfloat16), key(data="toy"), key(engine="ctranslate2"),
    ]  # fmt: skip
    assert len({k.digest for k in others} | {stored.key}) == len(others) + 1
    assert all(load_stored_eval(corpus_run, k) is None for k in others)
    _, other = make_run(corpus_run.parent / "scratch", seed=5)
    atomic_torch_save(corpus_run / "model.pt", other.state_dict())  # new weights
    assert key().model_sha256 != stored.model_sha256
    assert load_stored_eval(corpus_run, key()) is None


def test_a_run_folder_that_cannot_keep_the_result_gets_a_note(corpus_run, monkeypatch):
    def refuse(run_dir, stored):
        raise TformerError(f"cannot write {run_dir}/evals: Read-only file system")

    monkeypatch.setattr(eval_run, "keep_eval", refuse)
    log = Console(file=io.StringIO(), width=200, log_path=False, soft_wrap=True)
    evaluation = evaluate_run(corpus_run, request(limit=2), keep=True, console=log)
    got = evaluation.stored
    assert evaluation.report.sizes.sentences == 2 and got.beam is None and len(got.greedy) == 2
    assert "note: the result was not kept in the run folder" in log.file.getvalue()


def test_nothing_is_kept_unless_asked_and_a_corrupt_stored_file_is_ignored(corpus_run):
    evaluate_run(corpus_run, request(limit=1), quiet=True)
    assert not (corpus_run / EVALS).exists()
    (corpus_run / EVALS).mkdir()
    (corpus_run / EVALS / "broken.json").write_text('{"key": 1')
    (corpus_run / EVALS / "other.json").write_text('{"key": "x"}')
    assert stored_evals(corpus_run) == []


def test_an_ensemble_of_a_run_with_itself_scores_as_the_run_and_is_not_kept(corpus_run):
    asked = request(limit=4, config=EvalConfig(DecodeConfig(beam=2)), device="auto")
    alone = evaluate_run(corpus_run, asked, keep=True, quiet=True).report
    kept = set((corpus_run / EVALS).glob("*.json"))
    both = evaluate_run(corpus_run, asked, keep=True, quiet=True, ensemble_with=[corpus_run]).report
    assert both.ensemble is not None and both.ensemble.runs == [str(corpus_run)] * 2
    assert (both.ensemble.greedy.bleu, both.ensemble.beam.bleu) == (
        alone.greedy.bleu,
        alone.beam.bleu,
    )
    assert set((corpus_run / EVALS).glob("*.json")) == kept  # an ensemble's report is not kept


def test_an_ensemble_of_runs_with_different_tokenizers_is_a_one_line_error(tmp_path, corpus_run):
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer

    other = tmp_path / "other"
    shutil.copytree(corpus_run, other)
    vocab = RunConfig.load(corpus_run).model.vocab_size
    words = " ".join(f"w{i}" for i in range(100))
    save_tokenizer(
        train_tokenizer([words] * 3, vocab_size=vocab, kind="wordlevel", min_frequency=1),
        other / "tokenizer.json",
    )
    result = runner.invoke(
        app, ["eval", "-m", str(corpus_run), "-m", str(other), "--limit", "2", "--quiet"]
    )
    assert result.exit_code == 1 and "different tokenizers" in result.output
    assert "Traceback" not in result.output


def test_eval_of_an_imported_run_needs_data_named(corpus_run, tiny_corpus):
    """An import (``train.data`` ``none``) has no data of its own: one line asks for --data."""
    config = RunConfig.load(corpus_run)
    train = dataclasses.replace(config.train, data="none")
    RunConfig(config.model, train, imported_from="hf:someone/opus-mt-xx-yy").save(corpus_run)
    result = runner.invoke(app, ["eval", "-m", str(corpus_run), "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "imported from hf:someone/opus-mt-xx-yy" in lines[0] and "pass --data" in lines[0]
    given = ["--data", str(tiny_corpus), "--limit", "2", "--beam", "1", "--quiet"]
    result = runner.invoke(app, ["eval", "-m", str(corpus_run), "--device", "cpu", *given])
    assert result.exit_code == 0, result.output


def test_references_are_encoded_by_the_runs_target_tokenizer(corpus_run):
    tok = load_tokenizer(corpus_run / "tokenizer.json")
    tok.normalizer = normalizers.Replace(WORDS[0], WORDS[1])  # the target side reads differently
    save_tokenizer(tok, corpus_run / TARGET_TOKENIZER)
    run = load_run(corpus_run, "cpu")
    text = " ".join(WORDS[:3])
    split = eval_run.encode_split(run, Dataset.from_dict({"src": [text], "tgt": [text]}))
    assert split.src == encode(run.tokenizer, [text])
    assert split.tgt == encode(run.tgt_tokenizer, [text]) != split.src
    assert split.refs == [text]
