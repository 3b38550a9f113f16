"""``--engine ctranslate2``: translate, eval and serve decode a run through its CTranslate2
export, made on first use and kept while model.pt stays, with tformer's outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import skip_without
from tformer_cli.errors import TformerError

try:
    import ctranslate2  # noqa: F401 (tformer_cli.interop.engine's)
    from fastapi.testclient import TestClient

    from tformer_cli.serve import create_app
except (ModuleNotFoundError, TformerError) as missing:  # serve's error names its extra
    skip_without("dev,serve", missing)

import torch

from tests.interop.conftest import cli
from tformer_cli.checkpoint import atomic_torch_save, load_run
from tformer_cli.config import DecodeConfig, SamplingConfig
from tformer_cli.data.tokenizer import encode
from tformer_cli.decode.translate import translate_sources
from tformer_cli.interop import engine
from tformer_cli.interop.ct2 import CACHE


@pytest.fixture(scope="module")
def ct2_run(toy_run, tmp_path_factory) -> Path:
    """A copy of the toy run (its exports stay out of the shared fixture's folder)."""
    return Path(shutil.copytree(toy_run, tmp_path_factory.mktemp("engine") / "run"))


@pytest.fixture(scope="module")
def loaded(ct2_run):
    return load_run(ct2_run, "cpu")


@pytest.fixture(scope="module")
def ct2_model(loaded) -> engine.Ct2Model:
    torch.set_num_threads(1)
    return engine.load_ctranslate2(loaded)


@pytest.mark.parametrize("beam", [1, 5])
def test_the_engine_finds_tformers_best_hypothesis(loaded, ct2_model, toy_test, beam):
    """Greedy, and beam 5 at alpha 0 (no length penalty on either side): the same tokens,
    log-probabilities and ends, with each sentence's own length limit (|src| + </s>: tight
    enough that some stop there)."""
    cfg = DecodeConfig(beam=beam, alpha=0.0, max_len_a=1.0, max_len_b=0)
    sources = encode(loaded.tokenizer, toy_test)
    ours = translate_sources(loaded.model, loaded.tokenizer, sources, cfg)
    theirs = engine.translate_on_ct2(ct2_model, loaded.tokenizer, sources, cfg)
    for (our_text, a), (their_text, b) in zip(ours, theirs, strict=True):
        x, y = a.hypotheses[0], b.hypotheses[0]
        assert (our_text, x.tokens, x.finished) == (their_text, y.tokens, y.finished)
        assert x.logprob == pytest.approx(y.logprob, abs=1e-3)
    assert {t.hypotheses[0].finished for _, t in ours} == {True, False}  # ended both ways


def test_scores_and_nbest_follow_ctranslate2s_length_penalty(loaded, ct2_model, toy_test):
    """At alpha > 0 CTranslate2 divides by |Y|^alpha (|Y| with </s>); the log-probability is
    the score times that penalty."""
    cfg = DecodeConfig(beam=4, alpha=1.0, nbest=3)
    sources = encode(loaded.tokenizer, toy_test[:10])
    for texts, t in engine.translate_on_ct2(ct2_model, loaded.tokenizer, sources, cfg):
        assert len(texts) == len(t.hypotheses) == 3
        for h in t.hypotheses:
            length = len(h.tokens) + h.finished
            assert h.score == pytest.approx(h.logprob / length, rel=1e-5)
        assert [h.score for h in t.hypotheses] == sorted(h.score for h in t.hypotheses)[::-1]


def test_blank_inputs_samples_and_too_long_sources(loaded, toy_test):
    """Samples: a new translator (a new command) with the same seed draws the same ones."""
    ct2_model = engine.load_ctranslate2(loaded)
    sources = [[], *encode(loaded.tokenizer, toy_test[:3]), []]
    cfg = DecodeConfig(sampling=SamplingConfig(top_k=5), nbest=2, seed=7)
    done: list[int] = []
    first = engine.translate_on_ct2(ct2_model, loaded.tokenizer, sources, cfg, on_batch=done.append)
    again = engine.translate_on_ct2(engine.load_ctranslate2(loaded), loaded.tokenizer, sources, cfg)
    assert [(t, r.hypotheses) for t, r in first] == [(t, r.hypotheses) for t, r in again]
    assert first[0][0] == first[-1][0] == [""] and sum(done) == len(sources)
    assert all(len(r.hypotheses) == 2 for _, r in first[1:-1])
    assert engine.translate_on_ct2(ct2_model, loaded.tokenizer, [], cfg) == []
    with pytest.raises(TformerError, match="input 3 has 200 tokens; this model reads at most 128"):
        engine.translate_on_ct2(ct2_model, loaded.tokenizer, [[5], [5], [5] * 199], cfg)


def test_the_export_is_made_once_and_again_when_model_pt_changes(ct2_run, loaded, ct2_model):
    model_bin = ct2_model.folder / "model.bin"
    made = model_bin.stat().st_mtime_ns
    assert ct2_model.folder.parent == ct2_run / CACHE
    assert engine.load_ctranslate2(loaded).folder == ct2_model.folder  # reused, not rewritten
    assert model_bin.stat().st_mtime_ns == made
    changed = Path(shutil.copytree(ct2_run, ct2_run.parent / "changed"))
    state = torch.load(changed / "model.pt", weights_only=True)
    state["generator.bias" if "generator.bias" in state else "tgt_embed.tokens.weight"] += 0.01
    atomic_torch_save(changed / "model.pt", state)
    remade = engine.load_ctranslate2(load_run(changed, "cpu")).folder
    assert remade.name != ct2_model.folder.name and (remade / "model.bin").is_file()
    assert [p.name for p in (changed / CACHE).iterdir()] == [remade.name]  # the stale one went


def test_translate_greedy_equals_the_torch_engine_on_the_command_line(ct2_run, toy_test, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join([*toy_test[:20], ""]) + "\n")
    outputs = {}
    for name in ("torch", "ctranslate2"):
        result = cli("translate", "-m", ct2_run, "--greedy", "-f", source, "--device", "cpu",
                     "--engine", name)  # fmt: skip
        assert result.exit_code == 0, result.output
        outputs[name] = result.stdout
    assert outputs["torch"] == outputs["ctranslate2"] and len(outputs["torch"].splitlines()) == 21
    result = cli("translate", "-m", ct2_run, "-k", "3", "--nbest", "2", "--json",
                 "--engine", "ctranslate2", toy_test[0])  # fmt: skip
    hyps = json.loads(result.stdout)["hypotheses"]
    assert result.exit_code == 0 and len(hyps) == 2 and hyps[0]["score"] >= hyps[1]["score"]


def test_eval_searches_on_ctranslate2_and_says_the_rest_runs_on_torch(ct2_run):
    reports = {}
    for name in ("torch", "ctranslate2"):
        result = cli("eval", "-m", ct2_run, "--limit", "30", "--beam", "3", "--alpha", "0",
                     "--device", "cpu", "--engine", name, "--json", "--quiet")  # fmt: skip
        assert result.exit_code == 0, result.output
        reports[name] = json.loads(result.stdout)
    torch_report, ct2 = reports["torch"], reports["ctranslate2"]
    assert ct2["source"]["engine"] == "ctranslate2" and torch_report["source"]["engine"] == "torch"
    assert ct2["greedy"]["bleu"] == torch_report["greedy"]["bleu"]  # token for token
    assert ct2["tf"] == torch_report["tf"] and ct2["accumulation"] == torch_report["accumulation"]
    result = cli("eval", "-m", ct2_run, "--limit", "30", "--beam", "3", "--alpha", "0",
                 "--device", "cpu", "--engine", "ctranslate2", "--quiet")  # fmt: skip
    text = " ".join(result.stdout.split())
    assert "engine ctranslate2" in text and f"{ct2['beam']['bleu']:.2f}" in text
    assert "teacher-forced and exposure-bias sections (1, 3-6) run on torch" in text
    assert len(list((ct2_run / "evals").glob("*.json"))) == 2  # kept apart: the key has the engine


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["translate", "--mbr", "4", "x"], "minimum Bayes risk"),
        (["translate", "--sample", "--epsilon", "0.1", "x"], "epsilon sampling"),
        (["translate", "--no-cache", "x"], "without the KV cache"),
        (["translate", "-m", "RUN", "x"], "an ensemble of runs"),
        (["eval", "--mbr", "4"], "minimum Bayes risk"),
        (["eval", "-m", "RUN"], "an ensemble of runs"),
    ],
)
def test_what_ctranslate2_cannot_do_is_a_usage_error_naming_the_torch_engine(ct2_run, args, named):
    args = [str(ct2_run) if a == "RUN" else a for a in args]
    result = cli(args[0], "-m", ct2_run, *args[1:], "--engine", "ctranslate2")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.replace("│", " ").split())
    assert named in message and "use --engine torch" in message and "Traceback" not in message


def test_an_unknown_engine_is_a_usage_error(ct2_run):
    result = cli("translate", "-m", ct2_run, "--engine", "onnx", "x")
    assert result.exit_code == 2 and "Invalid value for '--engine'" in result.output


def test_serve_translates_on_ctranslate2_and_refuses_attention_maps(loaded, toy_test):
    body = {"texts": toy_test[:4], "beam": 1, "alpha": 0.0}
    answers = {}
    for name, decoder in (("torch", None), ("ctranslate2", engine.ctranslate2_engine(loaded))):
        with TestClient(create_app(loaded, engine=decoder)) as client:
            response = client.post("/translate", json=body)
            assert response.status_code == 200, response.text
            answers[name] = [
                t["hypotheses"][0]["translation"] for t in response.json()["translations"]
            ]
            attention = client.post("/attention", json={"text": toy_test[0]})
    assert answers["torch"] == answers["ctranslate2"]
    assert attention.status_code == 422 and "--engine torch" in attention.json()["detail"]
