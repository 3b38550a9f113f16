"""Tests for tformer_cli.report.compare: two tiny runs on the same test data, the numbers side
by side, sacrebleu's own paired tests, reuse of stored evaluations, and the overlaid curves."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from tests.report.test_curves import synthetic_log
from tformer_cli.checkpoint import RunConfig, atomic_torch_save
from tformer_cli.config import DecodeConfig, TrainConfig
from tformer_cli.errors import TformerError
from tformer_cli.report.compare import compare_runs, paired_tests, render_comparison
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EVALS, EvalRequest, keyed

CFG = EvalConfig(DecodeConfig(beam=2))
N_AR = 500  # sacrebleu's default is 10,000; fewer trials keep the test fast


@pytest.fixture
def two_runs(tmp_path, make_run, tiny_corpus):
    """Two untrained runs (seeds 0 and 1) whose config says they were trained on tiny_corpus,
    each with a synthetic log."""
    runs = []
    for seed in (0, 1):
        run_dir, model = make_run(tmp_path / "runs" / f"seed{seed}", seed=seed)
        RunConfig(
            model.cfg, TrainConfig(data=str(tiny_corpus), device="cpu", precision="fp32")
        ).save(run_dir)
        log = synthetic_log(300 if seed == 0 else 200)
        (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        runs.append(run_dir)
    return runs


def compare(runs, data=None, limit=None, keep=True, config=CFG, **options):
    """``compare_runs`` as the command calls it (results kept), on the CPU, one thread."""
    console = Console(file=io.StringIO(), width=160, color_system=None)
    err = Console(file=io.StringIO())
    asked = EvalRequest(data=data, limit=limit, config=config, device="cpu", threads=1)
    options = {"quiet": True, "n_ar": N_AR, **options}
    result = compare_runs(runs, console, asked, keep=keep, err=err, **options)
    return result, console.file.getvalue()


def sacrebleu_tests(refs, systems, test, n):
    """sacrebleu's own paired test, called as its command line does."""
    metrics = {"BLEU": BLEU(force=True), "chrF": CHRF()}
    _, scores = PairedTest(systems, metrics, [refs], test_type=test, n_samples=n)()
    return scores


def test_compare_gives_sacrebleus_own_paired_test_numbers(two_runs):
    result, out = compare(two_runs)
    assert [s.reused for s in result.runs] == [False, False]  # evaluated now, and kept
    assert all(len(list((r / EVALS).glob("*.json"))) == 1 for r in two_runs)
    a, b = (s.stored for s in result.runs)
    assert a.refs == b.refs and result.pairs == 6
    for search, hyps in (("greedy", (a.greedy, b.greedy)), ("beam 2", (a.beam, b.beam))):
        systems = [("seed0", hyps[0]), ("seed1", hyps[1])]
        bs = sacrebleu_tests(a.refs, systems, "bs", 1000)
        ar = sacrebleu_tests(a.refs, systems, "ar", N_AR)
        for metric, name in (("BLEU", "BLEU"), ("chrF", "chrF2")):
            t = next(t for t in result.tests if (t.metric, t.search) == (metric, search))
            assert (t.baseline_score, t.score) == (bs[name][0].score, bs[name][1].score)
            assert t.p_bootstrap == bs[name][1].p_value and t.p_ar == ar[name][1].p_value
            assert (t.bootstrap_mean, t.bootstrap_ci) == (bs[name][1].mean, bs[name][1].ci)
            assert t.diff == pytest.approx(t.score - t.baseline_score)
    greedy_bleu = next(m for m in result.metrics if m.label == "BLEU greedy")
    assert greedy_bleu.values == [a.report["greedy"]["bleu"], b.report["greedy"]["bleu"]]
    assert greedy_bleu.diffs[1] == pytest.approx(greedy_bleu.values[1] - greedy_bleu.values[0])
    for text in ("BLEU beam 2", "tf_acc", "excess_error", "decay_ratio", "p (bs)",
                 "evaluated now (result kept)"):  # fmt: skip
        assert text in out, text


def test_a_current_stored_result_is_reused_and_a_stale_one_is_not(two_runs, make_run, tmp_path):
    first, _ = compare(two_runs)
    narrow = Console(file=io.StringIO(), width=80, color_system=None)
    narrow.print(render_comparison(first))  # each test on one line of an 80-column terminal
    lines = narrow.file.getvalue().splitlines()
    (row,) = [line for line in lines if line.startswith("│ BLEU greedy │ seed1 │")]
    test = next(t for t in first.tests if (t.metric, t.search) == ("BLEU", "greedy"))
    assert f"{test.p_bootstrap:.4f} │ {test.p_ar:.4f}" in row and len(row) <= 80
    again, out = compare(two_runs, as_json=True, save=tmp_path / "both.svg")
    assert [s.reused for s in again.runs] == [True, True]
    assert again.tests == first.tests and again.metrics == first.metrics
    data = json.loads(out)
    assert [(r["name"], r["reused"]) for r in data["runs"]] == [("seed0", True), ("seed1", True)]
    assert len(data["significance"]) == 4 and data["n_ar"] == N_AR
    assert data["significance"][0]["p_bootstrap"] == first.tests[0].p_bootstrap
    root = ET.fromstring((tmp_path / "both.svg").read_text())  # the curves, overlaid
    lines = {
        (e.get("data-series"), e.get("data-run"))
        for e in root.iter("{http://www.w3.org/2000/svg}polyline")
    }
    assert {("valid_bleu", "seed0"), ("valid_bleu", "seed1"), ("loss", "seed1")} <= lines
    _, out = compare(two_runs, save=tmp_path / "both.html")
    assert "stored result of" in out and "p bootstrap" in (tmp_path / "both.html").read_text()
    _, other = make_run(two_runs[1].parent / "scratch", seed=7)
    atomic_torch_save(two_runs[1] / "model.pt", other.state_dict())  # new weights
    third, _ = compare(two_runs)
    assert [s.reused for s in third.runs] == [True, False]
    assert len(list((two_runs[1] / EVALS).glob("*.json"))) == 2


def test_an_eval_result_is_reused_whatever_seed_a_search_that_draws_nothing_was_given(two_runs):
    compare(two_runs)
    reseeded = EvalConfig(dataclasses.replace(CFG.search, seed=1234))  # as eval passes its seed
    again, _ = compare(two_runs, config=reseeded)
    assert [s.reused for s in again.runs] == [True, True]
    drawn = EvalConfig(dataclasses.replace(CFG.search, beam=1, mbr=2, seed=1234))
    assert EvalRequest(config=drawn).config.search.seed == 1234
    assert keyed(drawn) == drawn and keyed(reseeded) != reseeded  # draws keep their seed


def test_paired_tests_match_sacrebleu_on_outputs_that_differ():
    refs = ["the cat sat on the mat .", "a dog barks", "it is raining today", "we go home now"] * 5
    good = list(refs)
    good[3] = "we go now"
    bad = ["the cat sat .", "a dog", "it rains", "home"] * 5
    systems = [("good", good), ("bad", bad), ("same", good)]
    found, signatures = paired_tests(refs, systems, n_bootstrap=300, n_ar=300)
    bs = sacrebleu_tests(refs, systems, "bs", 300)
    ar = sacrebleu_tests(refs, systems, "ar", 300)
    bleu = [t for t in found if t.metric == "BLEU"]
    assert [t.system for t in bleu] == ["bad", "same"]
    assert [t.p_bootstrap for t in bleu] == [r.p_value for r in bs["BLEU"][1:]]
    assert [t.p_ar for t in bleu] == [r.p_value for r in ar["BLEU"][1:]]
    assert bleu[0].significant_bootstrap and bleu[0].significant_ar and bleu[0].diff < -50
    assert bleu[1].diff == 0 and not (bleu[1].significant_bootstrap or bleu[1].significant_ar)
    assert bleu[1].p_bootstrap == 1 / 301  # sacrebleu's smallest p for outputs scoring the same
    assert "bs:300" in signatures["BLEU bs"] and "ar:300" in signatures["chrF ar"]


def test_runs_scored_on_different_references_are_refused(two_runs, tiny_corpus, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for name in ("train", "valid", "test"):
        text = (tiny_corpus / f"{name}.tsv").read_text()
        (other / f"{name}.tsv").write_text(text if name != "test" else "red cat\tcat red\n")
    config = RunConfig.load(two_runs[1])
    train = TrainConfig(data=str(other), device="cpu", precision="fp32")
    RunConfig(config.model, train).save(two_runs[1])
    with pytest.raises(TformerError, match=r"different references .* give both the same test data"):
        compare(two_runs)
    result, _ = compare(two_runs, data=str(tiny_corpus), limit=3)  # the same data for both
    assert result.pairs == 3 and [s.reused for s in result.runs] == [False, False]


def test_bad_arguments_fail_in_one_line_before_any_work(two_runs, tmp_path):
    with pytest.raises(TformerError, match="at least two runs"):
        compare(two_runs[:1])
    with pytest.raises(TformerError, match="named twice"):
        compare([two_runs[0], two_runs[0]])
    with pytest.raises(TformerError, match=r"use a \.svg, \.html or \.png"):
        compare(two_runs, save=tmp_path / "x.jpg")
    with pytest.raises(TformerError, match="--x foo: use updates or time"):
        compare(two_runs, x="foo")  # with or without --save
    with pytest.raises(TformerError, match="does not exist"):
        compare([two_runs[0], tmp_path / "missing"])
    broken = tmp_path / "broken"
    shutil.copytree(two_runs[1], broken)
    (broken / "model.pt").write_bytes(b"")
    with pytest.raises(TformerError, match=r"broken/model\.pt is corrupt"):
        compare([two_runs[0], broken])
    (broken / "config.json").unlink()
    with pytest.raises(TformerError, match=r"config\.json is missing"):
        compare([two_runs[0], broken])
    assert not (two_runs[0] / EVALS).exists()


def test_compare_keeps_nothing_in_the_run_folders_unless_asked(two_runs):
    result, out = compare(two_runs, keep=False)
    assert [s.reused for s in result.runs] == [False, False] and "result kept" not in out
    assert not any((r / EVALS).exists() for r in two_runs)
