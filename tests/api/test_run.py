"""The public API: ``load`` and a run's translate, score, trace, attention and history, checked
against what the CLI and the internals give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tformer_cli as tformer
from tests.conftest import WORDS
from tformer_cli import TformerError
from tformer_cli.cli import app

runner = CliRunner()
TEXTS = ["red blue green", "cat dog", "one two big small bird"]


@pytest.fixture(autouse=True)
def one_thread_in_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands run here keep torch on the tests' one thread (``--threads`` 0 is
    ``$TFORMER_THREADS``), so that they compute as the API beside them does."""
    monkeypatch.setenv("TFORMER_THREADS", "1")


@pytest.fixture
def run_dir(tmp_path, make_run) -> Path:
    return make_run(tmp_path / "run")[0]


def cli_lines(*args: str) -> list[str]:
    """``tformer translate ARGS``'s output lines, on the CPU as the API calls here load."""
    result = runner.invoke(app, ["translate", "--device", "cpu", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


@pytest.mark.parametrize("beam", [1, 4])
def test_translate_gives_what_the_command_prints(run_dir, beam):
    run = tformer.load(str(run_dir), device="cpu")
    got = run.translate(TEXTS, beam=beam, nbest=beam)
    lines = cli_lines("-m", str(run_dir), "-k", str(beam), "--nbest", str(beam), "--json", *TEXTS)
    expected = [
        (h["translation"], h["score"], h["logprob"], h["finished"])
        for line in lines
        for h in json.loads(line)["hypotheses"]
    ]
    assert [(h.text, h.score, h.logprob, h.finished) for t in got for h in t.nbest] == expected


def test_the_run_s_own_length_penalty_applies_unless_given(tmp_path, make_run):
    from tformer_cli.checkpoint import RunConfig

    run_dir = make_run(tmp_path / "run")[0]
    saved = RunConfig.load(run_dir)
    train = saved.train.__class__(**{**saved.train.__dict__, "beam_alpha": 1.2})
    RunConfig(saved.model, train).save(run_dir)
    assert tformer.load(run_dir, device="cpu").alpha == 1.2
    assert tformer.load(run_dir, device="cpu", alpha=0.3).alpha == 0.3
    got = tformer.load(run_dir, device="cpu").translate(TEXTS, beam=3, nbest=3)
    lines = cli_lines("-m", str(run_dir), "-k", "3", "--nbest", "3", *TEXTS)
    assert [f"{h.score:.4f}" for t in got for h in t.nbest] == [ln.split("\t")[1] for ln in lines]


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_an_ensemble_and_int8_translate_as_the_command_does(tmp_path, make_run, precision):
    runs = [make_run(tmp_path / "a")[0], make_run(tmp_path / "b", seed=1)[0]]
    run = tformer.load(runs, device="cpu", precision=precision)
    got = run.translate(TEXTS, beam=2)
    args = [a for r in runs for a in ("-m", str(r))]
    lines = cli_lines(*args, "-k", "2", "--precision", precision, *TEXTS)
    assert [t.text for t in got] == lines


def test_per_token_logprobs_sum_to_the_hypothesis_logprob(run_dir):
    run = tformer.load(run_dir, device="cpu")
    for t in run.translate(TEXTS, beam=3, nbest=2):
        for h in t.nbest:
            assert len(h.token_logprobs) == len(h.tokens)
            assert (h.tokens[-1:] == ["</s>"]) is h.finished
            assert sum(h.token_logprobs) == pytest.approx(h.logprob, abs=1e-4)


def test_score_is_teacher_forced_and_per_token(run_dir):
    from tformer_cli.data.tokenizer import encode
    from tformer_cli.report.evaluation import teacher_forced

    run = tformer.load(run_dir, device="cpu")
    (s,) = run.score(["red blue"], ["blue red"])
    assert s.tokens == ["▁blue", "▁red", "</s>"] and len(s.token_logprobs) == 3
    assert all(v < 0 for v in s.token_logprobs)
    src, tgt = encode(run.tokenizer, ["red blue"]), encode(run.tokenizer, ["blue red"])
    with torch.inference_mode():
        tf = teacher_forced(run.loaded[0].model, src, tgt)  # the evaluation's clean pass
    assert -s.logprob / 3 == pytest.approx(tf.xent, abs=1e-5)


def test_trace_ends_with_the_n_best_of_translate(run_dir):
    run = tformer.load(run_dir, device="cpu")
    for beam in (1, 5):
        trace = run.trace(TEXTS[2], beam=beam, top=3)
        nbest = run.translate(TEXTS[2], beam=beam, nbest=beam)[0].nbest
        assert [run.tokenizer.decode(h.tokens) for h in trace.final] == [h.text for h in nbest]
        assert [h.score for h in trace.final] == pytest.approx([h.score for h in nbest], abs=1e-5)
        assert "<ul" in trace._repr_html_()


def test_translate_trace_writes_the_json(run_dir, tmp_path):
    path = tmp_path / "trace.json"
    lines = cli_lines("-m", str(run_dir), "-k", "3", "--trace", str(path), TEXTS[0])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["beam"] == 3 and data["final"][0]["text"] == lines[0]


def test_attention_maps_are_layer_head_query_key_tensors_with_labels(run_dir):
    run = tformer.load(run_dir, device="cpu")
    att = run.attention("red blue green", target="green blue red")
    cross = att.weights["cross"]
    rows, cols = att.labels("cross")
    assert cross.shape == (2, 4, len(rows), len(cols)) and cols[-1] == "</s>"
    assert rows == ["▁green", "▁blue", "▁red", "</s>"]
    assert torch.allclose(cross.sum(-1), torch.ones(cross.shape[:-1]), atol=1e-5)
    assert len(att.heads) == 8 and "<svg" in att._repr_html_()


@pytest.mark.parametrize("kind", ["cross", "decoder"])
def test_inspect_attention_json_is_the_api_s_attention(run_dir, kind):
    """``inspect-attention --json`` prints what ``Run.attention(...).to_json()`` returns."""
    run = tformer.load(run_dir, device="cpu")
    args = ["inspect-attention", TEXTS[2], "-m", str(run_dir), "-k", "2", "--kind", kind]
    printed = runner.invoke(app, [*args, "--json", "--device", "cpu"])
    assert printed.exit_code == 0, printed.output
    wanted = json.loads(run.attention(TEXTS[2], beam=2, kind=kind).to_json())
    assert json.loads(printed.stdout) == wanted and wanted["heads"]


def test_translate_file_streams_lines(run_dir, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(f"{t}\n" for t in TEXTS), encoding="utf-8")
    run = tformer.load(run_dir, device="cpu")
    assert run.translate_file(src, out, beam=2, chunk_size=2) == 3
    assert out.read_text(encoding="utf-8").splitlines() == [
        t.text for t in run.translate(TEXTS, beam=2)
    ]


def test_loading_changes_no_thread_count(run_dir):
    torch.set_num_threads(1)
    tformer.load(run_dir, device="cpu").translate("red", beam=2)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda r: tformer.load(42), "run"),
        (lambda r: tformer.load(r, device=3), "device"),
        (lambda r: tformer.load(r, alpha=-1), "alpha=-1: must be at least 0"),
        (lambda r: tformer.load(r, device="cpu").translate(TEXTS, beam=2, nbest=3),
         "nbest=3: needs beam >= 3"),
        (lambda r: tformer.load(r, device="cpu").translate([1, 2]), "texts"),
        (lambda r: tformer.load(r, device="cpu").translate("a", beam="5"),
         "beam='5': must be a whole number"),
        (lambda r: tformer.load(r, device="cpu").translate("a", beam=True), "beam=True: must"),
        (lambda r: tformer.load(r, device="cpu").translate("a", beam=0),
         "beam=0: must be in [1, 256]"),
        (lambda r: tformer.load(r, device="cpu").translate("a", alpha="x"),
         "alpha='x': must be a number"),
        (lambda r: tformer.load(r, device="cpu").translate("a", sample=True, top_p=2.0),
         "top_p=2.0: must be in (0, 1]"),
        (lambda r: tformer.load(r, device="cpu").translate("a", max_tokens=0),
         "max_tokens=0: must be at least 1"),
        (lambda r: tformer.load(r, device="cpu").translate("a", sample=1), "sample=1: must be"),
        (lambda r: tformer.load(r, device="cpu", precision="fp8"), "fp8"),
        (lambda r: tformer.load(r, device="cpu").translate("a", temperature=0.5), "temperature"),
        (lambda r: tformer.load(r, device="cpu").score(["a"], ["a", "b"]), "targets"),
        (lambda r: tformer.load(r, device="cpu").trace("red", top=0), "top=0: must be at least 1"),
        (lambda r: tformer.load(r, device="cpu").trace(""), "text"),
        (lambda r: tformer.load(r, device="cpu").evaluate(limit=0), "limit=0: must be at least 1"),
        (lambda r: tformer.compare([r, r], limit=0), "limit=0: must be at least 1"),
        (lambda r: tformer.train(max_stepz=3), "max_stepz"),
        (lambda r: tformer.train(layers=0, runs_dir=r.parent), "layers=0: must be at least 1"),
        (lambda r: tformer.train(heads=3, d_model=32, runs_dir=r.parent),
         "heads=3: must divide d_model (32)"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_tformer_error_naming_them(run_dir, call, name):
    with pytest.raises(TformerError) as e:
        call(run_dir)
    assert name in str(e.value) and "\n" not in str(e.value)


def test_words_fixture_is_what_the_texts_use():
    assert all(w in WORDS for t in TEXTS for w in t.split())
