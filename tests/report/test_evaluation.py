"""Tests for tformer_cli.report.evaluation: the whole report on hand-built models (values
worked out by hand in tests/report/test_exposure.py), the sanity checks of docs/exposure_bias.md,
and the JSON round trip."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
import sacrebleu
import torch
from rich.console import Console

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
from tformer_cli.config import DecodeConfig
from tformer_cli.data.split import Split
from tformer_cli.data.tokenizer import EOS_ID, UNK_ID, decode, train_tokenizer
from tformer_cli.report.evaluation import (
    EvalConfig,
    EvalReport,
    evaluate_split,
    render_report,
    report_json,
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
    data = Split(SOURCES, GOLD, text(tok, GOLD))
    return evaluate_split(model, tok, data, EvalConfig(DecodeConfig(beam=2), seed=5))


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
    report, outputs = stub_report
    hyps = outputs.hypotheses
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
    oracle = oracle_stub(tok.get_vocab_size())
    report, out = evaluate_split(oracle, tok, Split(src, tgt, text(tok, tgt)))
    assert out.hypotheses == text(tok, tgt)
    assert report.exposure_gap.bleu_gap == 0.0
    assert report.greedy.exact_match == 1.0 and report.tf.acc == 1.0
    a = report.accumulation
    assert a.positions == 0 and (a.err_clean, a.err_self, a.excess_error_pct) == (None,) * 3
    row = next(line for line in rendered(report).splitlines() if line.startswith("│ all"))
    assert row.count("n/a") == 3


def test_beam_1_reports_greedy_only(tok):
    data = Split(SOURCES, GOLD, text(tok, GOLD))
    report, out = evaluate_split(
        bigram_stub(tok.get_vocab_size()), tok, data, EvalConfig(DecodeConfig(beam=1))
    )
    assert report.beam is None and report.timing.beam is None
    assert out.hypotheses == out.greedy == text(tok, [[4, 5, 6]] * 4)
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
    data = Split(SOURCES, GOLD, text(tok, GOLD))
    config = EvalConfig(DecodeConfig(2))
    report, out = evaluate_split(unk_stub(tok.get_vocab_size()), tok, data, config)
    hyps = out.hypotheses
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
    assert tf.tokens == 6 and 0.0 <= tf.acc <= 1.0 and tf.ppl == pytest.approx(math.exp(tf.xent))
