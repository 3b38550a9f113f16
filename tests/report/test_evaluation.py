"""Tests for tformer_cli.report.evaluation: the whole report on hand-built models (values
worked out by hand in tests/report/test_exposure.py), the sanity checks of EXPOSURE_BIAS.md,
the JSON round trip, and the `tformer eval` command."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil

import pytest
import sacrebleu
import torch
from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import WORDS
from tests.report.test_exposure import (
    CLEAN,
    GOLD,
    P_BEST,
    SELF,
    SOURCES,
    StubModel,
    bigram_stub,
    oracle_stub,
)
from tformer_cli import device
from tformer_cli.checkpoint import RunConfig, atomic_torch_save
from tformer_cli.cli import app
from tformer_cli.config import DecodeConfig, TrainConfig
from tformer_cli.data.tokenizer import EOS_ID, UNK_ID, decode, train_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.report import evaluation
from tformer_cli.report.evaluation import (
    EVALS,
    EvalConfig,
    EvalData,
    EvalReport,
    StoredEval,
    eval_request,
    evaluate,
    file_sha256,
    load_stored_eval,
    read_stored_eval,
    render_report,
    report_json,
    stored_evals,
    teacher_forced,
)
from tformer_cli.report.exposure import accumulation, fmt, gold_io, pct, points, tf_argmax_tokens


@pytest.fixture(scope="module")
def tok():
    """Word-level: ids 4.. are the ten WORDS; 14 ids in all."""
    return train_tokenizer([" ".join(WORDS)] * 3, vocab_size=40, kind="wordlevel", min_frequency=1)


def text(tok, seqs) -> list[str]:
    return decode(tok, seqs)


def rendered(report: EvalReport) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_report(report))
    return console.file.getvalue()


@pytest.fixture(scope="module")
def stub_report(tok):
    """The report of the bigram stub on GOLD (beam 2), and its hypotheses."""
    model = bigram_stub(tok.get_vocab_size())
    data = EvalData(SOURCES, GOLD, text(tok, GOLD))
    return evaluate(model, tok, data, EvalConfig(DecodeConfig(beam=2), seed=5))


def test_tf_metrics_equal_the_hand_computed_values(stub_report, tok):
    report, _ = stub_report
    wrong = (1 - P_BEST) / (tok.get_vocab_size() - 1)
    xent = (12 * -math.log(P_BEST) + 8 * -math.log(wrong)) / 20
    assert report.tf.tokens == report.sizes.target_tokens == 20
    assert report.tf.acc == 0.6
    assert report.tf.xent == pytest.approx(xent, rel=1e-5)
    assert report.tf.ppl == pytest.approx(math.exp(xent), rel=1e-5)


def test_exposure_sections_equal_the_hand_computed_values(stub_report):
    report, _ = stub_report
    a = report.accumulation
    assert a == accumulation(gold_io(GOLD)[1], CLEAN, SELF)
    assert (a.err_clean, a.excess_error_pct) == (pytest.approx(5 / 9), pytest.approx(20.0))
    levels = report.prefix_noise.levels
    assert [x.q for x in levels] == [0.0, 0.1, 0.25]
    assert levels[0].acc == 0.6 and levels[0].kept == 20
    assert report.prefix_noise.paired_drop == 0.0  # a bigram reads no earlier context


def test_bleu_sections_are_sacrebleu_on_the_expected_texts(stub_report, tok):
    report, hyps = stub_report
    refs = text(tok, GOLD)
    greedy = text(tok, [[4, 5, 6]] * 4)  # <s> -> 4 -> 5 -> 6 -> </s> whatever the source
    tf = text(tok, tf_argmax_tokens(CLEAN))
    bleu = sacrebleu.BLEU(force=True)
    assert report.greedy.bleu == bleu.corpus_score(greedy, [refs]).score
    assert report.greedy.chrf == sacrebleu.CHRF().corpus_score(greedy, [refs]).score
    assert report.greedy.exact_match == 0.25  # only the first reference is w4 w5 w6
    assert report.exposure_gap.tf_bleu == bleu.corpus_score(tf, [refs]).score
    assert report.exposure_gap.bleu_gap == report.exposure_gap.tf_bleu - report.greedy.bleu
    assert report.beam is not None and report.beam.beam == 2
    assert report.beam.bleu == bleu.corpus_score(hyps, [refs]).score  # --hyp holds beam output
    shortest = report.length_decay.quartiles[0]  # GOLD[2], two tokens
    chrf = sacrebleu.CHRF().sentence_score
    assert shortest.greedy_chrf == chrf(greedy[2], [refs[2]]).score
    assert shortest.tf_chrf == chrf(tf[2], [refs[2]]).score


def test_a_model_perfect_under_tf_has_no_bleu_gap_and_section_4_prints_na(tok):
    src = [[4, 5, 6, 7, 8], [9, 10, 11, 12], [13, 4, 6, 8, 10, 12]]
    tgt = [s[::-1] for s in src]
    report, hyps = evaluate(
        oracle_stub(tok.get_vocab_size()), tok, EvalData(src, tgt, text(tok, tgt))
    )
    assert hyps == text(tok, tgt)
    assert report.exposure_gap.bleu_gap == 0.0
    assert report.greedy.exact_match == 1.0 and report.tf.acc == 1.0
    a = report.accumulation
    assert a.positions == 0 and (a.err_clean, a.err_self, a.excess_error_pct) == (None,) * 3
    row = next(line for line in rendered(report).splitlines() if line.startswith("│ all"))
    assert row.count("n/a") == 3


def test_beam_1_reports_greedy_only(tok):
    data = EvalData(SOURCES, GOLD, text(tok, GOLD))
    report, hyps = evaluate(
        bigram_stub(tok.get_vocab_size()), tok, data, EvalConfig(DecodeConfig(beam=1))
    )
    assert report.beam is None and report.timing.beam is None
    assert hyps == text(tok, [[4, 5, 6]] * 4)
    lines = rendered(report).splitlines()
    assert lines[0].endswith("| greedy only")
    header = next(line for line in lines if "greedy" in line and "┃" in line)
    assert header.split() == ["┃", "┃", "greedy", "┃"]  # one column: no beam


def test_json_holds_the_numbers_of_the_dataclass_and_of_the_printed_report(stub_report):
    report, _ = stub_report
    data = json.loads(report_json(report))
    assert data == json.loads(json.dumps(dataclasses.asdict(report)))
    out = rendered(report)
    for number in (
        fmt(data["greedy"]["bleu"]),
        fmt(data["beam"]["chrf"]),
        fmt(data["tf"]["xent"], ".4f"),
        pct(data["tf"]["acc"]),
        fmt(data["exposure_gap"]["bleu_gap"], "+.2f"),
        pct(data["accumulation"]["err_self"]),
        pct(data["accumulation"]["buckets"][1]["err_clean"]),
        f"{data['accumulation']['excess_error_pct']:+.1f}%",
        pct(data["prefix_noise"]["levels"][2]["acc"]),
        points(data["prefix_noise"]["drop"]),
        fmt(data["length_decay"]["quartiles"][3]["tf_chrf"]),
        fmt(data["length_decay"]["decay_ratio"], ".3f"),
        data["greedy"]["bleu_signature"],
    ):
        assert number in out, number


def unk_stub(vocab_size: int) -> StubModel:
    """Whatever the source and the prefix: ``<unk>`` at position 0, word id 4 at 1, then
    ``</s>``; so greedy and beam search both output ``<unk> 4``."""
    wanted = torch.tensor([UNK_ID, 4, EOS_ID])

    def fn(src: torch.Tensor, y: torch.Tensor, start: int) -> torch.Tensor:
        at = torch.arange(start, start + y.size(1)).clamp(max=2)  # (T,)
        logits = torch.nn.functional.one_hot(wanted[at], vocab_size).float() * 20 - 10  # (T, V)
        return logits.repeat(y.size(0), 1, 1)  # (b, T, V)

    return StubModel(fn, vocab_size)


def test_generated_unk_tokens_are_counted_and_said_to_be_dropped(tok):
    """sacrebleu scores the text ``tformer translate`` prints, where ``<unk>`` is dropped;
    the report counts the ``<unk>`` tokens so a shorter output has a visible cause."""
    data = EvalData(SOURCES, GOLD, text(tok, GOLD))
    report, hyps = evaluate(unk_stub(tok.get_vocab_size()), tok, data, EvalConfig(DecodeConfig(2)))
    assert hyps == text(tok, [[4]] * 4) and "<unk>" not in " ".join(hyps)
    for search in (report.greedy, report.beam):
        assert search is not None and (search.unk, search.unk_rate) == (4, 0.5)
    saved = json.loads(report_json(report))
    assert (saved["greedy"]["unk"], saved["beam"]["unk_rate"]) == (4, 0.5)
    out = " ".join(rendered(report).split())
    assert "<unk> generated │ 4 (50.00%) │ 4 (50.00%)" in out
    assert "<unk> tokens are dropped from the text before scoring" in out


def test_a_search_without_unk_reports_zero(stub_report):
    report, _ = stub_report
    assert (report.greedy.unk, report.greedy.unk_rate) == (0, 0.0)


def test_teacher_forced_keeps_its_api(tiny_model):
    model = tiny_model()
    tf = teacher_forced(model, [[5, 6], [7]], [[8, 9, 10], [11]])
    assert (
        tf.tokens == 6 and 0.0 <= tf.accuracy <= 1.0 and tf.ppl == pytest.approx(math.exp(tf.xent))
    )


# ---------------------------------------------------------------------------- the command
runner = CliRunner()


@pytest.fixture
def corpus_run(tmp_path, make_run, tiny_corpus):
    """An untrained run whose config says it was trained on ``tiny_corpus`` in fp32."""
    run_dir, model = make_run(tmp_path / "run")
    train = TrainConfig(data=str(tiny_corpus), device="cpu", precision="fp32")
    RunConfig(model.cfg, train).save(run_dir)
    return run_dir


def test_eval_prints_the_report_and_writes_json_and_hypotheses(tmp_path, corpus_run):
    json_path, hyp_path = tmp_path / "report.json", tmp_path / "hyps.txt"
    result = runner.invoke(
        app,
        ["eval", "-m", str(corpus_run), "--limit", "3", "--beam", "2", "--json", str(json_path),
         "--hyp", str(hyp_path), "--device", "cpu", "--threads", "1", "--quiet"],
    )  # fmt: skip
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


def test_eval_report_names_the_precision_in_effect(tmp_path, corpus_run):
    json_path = tmp_path / "report.json"
    result = runner.invoke(
        app,
        ["eval", "-m", str(corpus_run), "--limit", "1", "--beam", "1", "--json", str(json_path),
         "--device", "cpu", "--precision", "bf16", "--threads", "1", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(json_path.read_text())["source"]["precision"] == "bf16 autocast"
    assert "cpu bf16 autocast, 1 CPU thread" in result.stdout


def test_eval_split_all_scores_a_whole_file_in_its_order(tmp_path, corpus_run):
    """A single file is carved into train/valid/test for training; ``--split all`` scores it all."""
    pairs = [(" ".join(WORDS[i : i + 3]), " ".join(WORDS[i + 1 : i + 4])) for i in range(7)]
    data = tmp_path / "mine.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    json_path, hyp_path = tmp_path / "r.json", tmp_path / "h.txt"
    result = runner.invoke(
        app,
        ["eval", "-m", str(corpus_run), "--data", str(data), "--split", "all", "--beam", "1",
         "--json", str(json_path), "--hyp", str(hyp_path), "--device", "cpu", "--threads", "1",
         "--quiet"],
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


def test_eval_with_an_unknown_split_is_a_one_line_error(corpus_run):
    result = runner.invoke(app, ["eval", "-m", str(corpus_run), "--split", "dev"])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("Error: unknown split 'dev'")
    assert "Traceback" not in result.output


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
    cfg = EvalConfig(DecodeConfig(beam=1))
    report = evaluation.evaluate_run(corpus_run, limit=1, cfg=cfg, threads=option, quiet=True)
    assert torch.get_num_threads() == report.source.threads == threads


# ---------------------------------------------------------------------------- stored results
def test_eval_keeps_its_result_with_both_outputs_in_the_run_folder(tmp_path, corpus_run):
    got: list[StoredEval] = []
    cfg = EvalConfig(DecodeConfig(beam=2))
    hyp_path = tmp_path / "hyps.txt"
    report = evaluation.evaluate_run(
        corpus_run, limit=3, cfg=cfg, device="cpu", threads=1, quiet=True, hyp_path=hyp_path,
        on_result=got.append,
    )  # fmt: skip
    (path,) = (corpus_run / EVALS).glob("*.json")
    stored = read_stored_eval(path)
    assert stored == got[0] and path.stem == stored.key
    assert stored.report == json.loads(report_json(report))
    assert stored.model_sha256 == file_sha256(corpus_run / "model.pt")
    assert stored.request["split"] == "test" and stored.request["limit"] == 3
    assert len(stored.greedy) == len(stored.refs) == 3 and stored.beam is not None
    assert stored.beam == hyp_path.read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.BLEU(force=True)
    assert report.greedy.bleu == bleu.corpus_score(stored.greedy, [stored.refs]).score
    assert report.beam is not None
    assert report.beam.bleu == bleu.corpus_score(stored.beam, [stored.refs]).score
    assert stored_evals(corpus_run) == [stored]


def test_a_stored_result_is_keyed_by_model_bytes_data_split_limit_and_settings(
    corpus_run, tiny_corpus, make_run
):
    cfg = EvalConfig(DecodeConfig(beam=2))
    evaluation.evaluate_run(corpus_run, limit=3, cfg=cfg, device="cpu", threads=1, quiet=True)
    config = RunConfig.load(corpus_run)

    def request(**changes) -> evaluation.EvalRequest:
        options = dict(data=None, src_lang=None, tgt_lang=None, split="test", limit=3, cfg=cfg,
                       device=torch.device("cpu"), dtype=None)  # fmt: skip
        return eval_request(corpus_run, config, **{**options, **changes})

    stored = load_stored_eval(corpus_run, request())
    assert stored is not None and stored.key == request().key
    assert request(data=str(tiny_corpus)).data == request().data == str(tiny_corpus)
    others = [
        request(limit=2), request(limit=None), request(split="valid"),
        request(cfg=EvalConfig(DecodeConfig(beam=3))), request(cfg=EvalConfig(cfg.search, seed=1)),
        request(dtype=torch.bfloat16), request(data="toy"),
    ]  # fmt: skip
    assert len({r.key for r in others} | {stored.key}) == len(others) + 1
    assert all(load_stored_eval(corpus_run, r) is None for r in others)
    _, other = make_run(corpus_run.parent / "scratch", seed=5)
    atomic_torch_save(corpus_run / "model.pt", other.state_dict())  # new weights
    assert request().model_sha256 != stored.model_sha256
    assert load_stored_eval(corpus_run, request()) is None


def test_a_run_folder_that_cannot_keep_the_result_gets_a_note(corpus_run, monkeypatch):
    def refuse(run_dir, stored):
        raise TformerError(f"cannot write {run_dir}/evals: Read-only file system")

    monkeypatch.setattr(evaluation, "keep_eval", refuse)
    log = Console(file=io.StringIO(), width=200, log_path=False, soft_wrap=True)
    got: list[StoredEval] = []
    cfg = EvalConfig(DecodeConfig(beam=1))
    report = evaluation.evaluate_run(
        corpus_run, limit=2, cfg=cfg, device="cpu", threads=1, console=log, on_result=got.append
    )
    assert report.sizes.sentences == 2 and got[0].beam is None and len(got[0].greedy) == 2
    assert "note: the result was not kept in the run folder" in log.file.getvalue()


def test_store_false_keeps_nothing_and_a_corrupt_stored_file_is_ignored(corpus_run):
    cfg = EvalConfig(DecodeConfig(beam=1))
    evaluation.evaluate_run(corpus_run, limit=1, cfg=cfg, threads=1, quiet=True, store=False)
    assert not (corpus_run / EVALS).exists()
    (corpus_run / EVALS).mkdir()
    (corpus_run / EVALS / "broken.json").write_text('{"key": 1')
    (corpus_run / EVALS / "other.json").write_text('{"key": "x"}')
    assert stored_evals(corpus_run) == []


def test_an_ensemble_of_a_run_with_itself_scores_as_the_run_and_is_not_kept(corpus_run):
    cfg = EvalConfig(DecodeConfig(beam=2))
    alone = evaluation.evaluate_run(corpus_run, limit=4, cfg=cfg, threads=1, quiet=True)
    kept = set((corpus_run / EVALS).glob("*.json"))
    both = evaluation.evaluate_run(
        corpus_run, limit=4, cfg=cfg, threads=1, quiet=True, ensemble_with=[corpus_run]
    )
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
