"""Tests for tformer_cli.serve through FastAPI's test client: the answers equal those of
``translate --json`` and ``inspect-attention --json``, concurrent requests share a decoding batch
yet each gets its own results, and every limit and bad input gets a one-line 4xx answer while
the server keeps serving."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_without
from tformer_cli.errors import TformerError

try:
    from fastapi.testclient import TestClient

    from tformer_cli import serve
    from tformer_cli.serve import Limits, create_app
except (ModuleNotFoundError, TformerError) as missing:  # serve's error names its extra
    skip_without("serve", missing)

import torch
from typer.testing import CliRunner

from tests.conftest import WORDS, reversal_pairs, tiny_config
from tformer_cli.checkpoint import LoadedRun, RunConfig, atomic_torch_save, load_run
from tformer_cli.cli import app as cli_app
from tformer_cli.config import DecodeConfig, DecodeOptions, TrainConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.data.tokenizer import PAD_ID, encode, save_tokenizer, train_tokenizer
from tformer_cli.decode.streams import format_translations
from tformer_cli.decode.translate import translate_texts
from tformer_cli.model import Transformer

LIMITS = Limits(max_chars=300, max_texts=8, max_body=4096, max_beam=6, timeout=10.0)


@pytest.fixture(autouse=True)
def one_thread_in_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands run here keep torch on the tests' one thread (``--threads`` 0 is
    ``$TFORMER_THREADS``), so that they compute as the API beside them does."""
    monkeypatch.setenv("TFORMER_THREADS", "1")


def build_reversal_run(run_dir: Path, steps: int = 120) -> Path:
    """A run folder of the tiny model (d_model 32, word-level ``WORDS``) trained for a moment
    to reverse word sequences: it ends sentences at varied lengths, as a real run does."""
    tok = train_tokenizer([" ".join(WORDS)] * 3, vocab_size=40, kind="wordlevel", min_frequency=1)
    save_tokenizer(tok, run_dir / "tokenizer.json")
    cfg = tiny_config(vocab_size=tok.get_vocab_size())
    torch.manual_seed(0)
    model = Transformer(cfg)
    pairs = reversal_pairs(64, seed=1)
    b = make_batch(encode(tok, [s for s, _ in pairs]), encode(tok, [t for _, t in pairs]))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = model(b.src, b.tgt_in)  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    RunConfig(cfg, TrainConfig(device="cpu", precision="fp32")).save(run_dir)
    atomic_torch_save(run_dir / "model.pt", model.eval().state_dict())
    return run_dir


def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's reversal run, built by the first test module that asks for it."""
    run_dir = tmp_path_factory.getbasetemp() / "serve-run" / "run"
    if not (run_dir / "model.pt").is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(1)
        build_reversal_run(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def run(run_dir) -> LoadedRun:
    return load_run(run_dir, "cpu")


@pytest.fixture(scope="module")
def client(run) -> Iterator[TestClient]:
    with TestClient(create_app(run, LIMITS)) as c:
        yield c


def expected(run: LoadedRun, texts: list[str], cfg: DecodeConfig) -> list[dict[str, Any]]:
    """What ``translate --json`` prints for ``texts``, each translated on its own."""
    lines = [format_translations(translate_texts(run, [t], cfg), "json")[0] for t in texts]
    return [{**json.loads(line), "index": i} for i, line in enumerate(lines)]


def same(answer: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> None:
    """Equal but for the timing, and scores to float precision (batch padding changes sums)."""
    assert len(answer) == len(wanted)
    for a, w in zip(answer, wanted, strict=True):
        assert {k: a[k] for k in ("index", "source")} == {k: w[k] for k in ("index", "source")}
        assert [h["translation"] for h in a["hypotheses"]] == [
            h["translation"] for h in w["hypotheses"]
        ]
        for ha, hw in zip(a["hypotheses"], w["hypotheses"], strict=True):
            assert ha["score"] == pytest.approx(hw["score"], abs=1e-4)
            assert ha["logprob"] == pytest.approx(hw["logprob"], abs=1e-4)
            assert ha["finished"] == hw["finished"]
        assert a["ms"] >= 0


TEXTS = ["red cat dog", "one two big small bird", "", "green blue"]


# ---------------------------------------------------------------------------- answers
@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2)])
def test_translate_answers_the_objects_of_translate_json(client, run, beam, nbest):
    r = client.post("/translate", json={"texts": TEXTS, "beam": beam, "nbest": nbest})
    assert r.status_code == 200, r.text
    answer = r.json()["translations"]
    same(answer, expected(run, TEXTS, DecodeConfig(beam=beam, nbest=nbest)))
    assert [len(a["hypotheses"]) for a in answer] == [nbest, nbest, 1, nbest]  # "" -> one empty


def test_concurrent_requests_share_a_batch_and_each_gets_its_own_results(run):
    greedy = [" ".join(WORDS[i : i + n]) for i, n in ((0, 3), (2, 5), (5, 2), (1, 4), (3, 6))]
    jobs = [({"texts": [t], "beam": 1}, DecodeConfig()) for t in greedy]
    jobs += [({"texts": greedy[:2], "beam": 3, "nbest": 2}, DecodeConfig(beam=3, nbest=2))]
    answers: list[Any] = [None] * len(jobs)
    with TestClient(create_app(run, LIMITS, wait_ms=400)) as c:
        start = threading.Barrier(len(jobs))

        def post(i: int) -> None:
            start.wait()
            answers[i] = c.post("/translate", json=jobs[i][0])

        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        health = c.get("/health").json()
    for (body, cfg), r in zip(jobs, answers, strict=True):
        assert r.status_code == 200, r.text
        same(r.json()["translations"], expected(run, body["texts"], cfg))
    assert health["requests"] == len(jobs)
    assert health["batches"] <= 3  # one per decoding setting (two), a late arrival at most
    assert health["batches"] < len(jobs)


def assert_same_json(a: Any, b: Any, path: str = "") -> None:
    """Equal JSON, floats within 1e-5: the server and the CLI may sum in another thread order
    (a thread count of their own), which moves the last bits."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-5), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            assert_same_json(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_json(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_attention_answers_the_json_of_inspect_attention(client, run_dir):
    text = "one big red dog"
    args = ["inspect-attention", text, "-m", str(run_dir), "-k", "2", "--json"]
    result = CliRunner().invoke(cli_app, [*args, "--no-align", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    r = client.post("/attention", json={"text": text, "beam": 2})
    assert r.status_code == 200, r.text
    assert_same_json(r.json(), json.loads(result.stdout))
    cross = r.json()["attention"]["cross"]
    assert cross["cols"] == ["▁one", "▁big", "▁red", "▁dog", "</s>"]
    row_sums = torch.tensor(cross["weights"]).sum(-1)  # (L, h, rows)
    assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4)


def test_model_health_page_and_openapi(client, run):
    info = client.get("/model").json()
    assert info["run"] == "run" and info["heads"] == run.model.cfg.h
    assert info["config"]["model"]["d_model"] == 32
    assert info["limits"]["max_texts"] == LIMITS.max_texts
    assert client.get("/health").json()["status"] == "ok"
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("app.js", "style.css"):
        assert f'"{asset}"' in page.text and client.get(f"/{asset}").status_code == 200
    assert "//" not in page.text.replace("<!doctype", "").split("<body>")[0]  # no CDN
    schema = client.get("/openapi.json").json()
    assert {"/translate", "/attention", "/health", "/model"} <= set(schema["paths"])
    docs = client.get("/docs").text  # FastAPI's page, its script served here: works offline
    scripts = re.findall(r'(?:src|href)="([^"]+)"', docs)
    assert scripts and not [u for u in scripts if "//" in u]
    assert all(client.get(u).status_code == 200 for u in scripts)


# ---------------------------------------------------------------------------- limits, bad input
def post_raw(client: TestClient, path: str, content: bytes | str) -> Any:
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


TOO_LONG = " ".join(["red"] * 70)  # 71 tokens with </s>: past the tiny model's 64 positions

BAD_TRANSLATE = [
    ({"texts": ["red " * 80]}, "texts[0]: String should have at most 300 characters"),
    ({"texts": ["red"] * 10_000}, "texts: List should have at most 8 items"),
    ({"texts": []}, "texts: List should have at least 1 item"),
    ({}, "texts: Field required"),
    ({"texts": "red cat"}, "texts: Input should be a valid list"),
    ({"texts": ["red", 7]}, "texts[1]: Input should be a valid string"),
    ({"texts": ["red"], "beam": 0}, "beam: Input should be greater than or equal to 1"),
    ({"texts": ["red"], "beam": 7}, "beam: Input should be less than or equal to 6"),
    ({"texts": ["red"], "beam": "5"}, "beam: Input should be a valid integer"),
    ({"texts": ["red"], "beam": 2.5}, "beam: Input should be a valid integer"),
    ({"texts": ["red"], "beam": True}, "beam: Input should be a valid integer"),
    ({"texts": ["red"], "nbest": 0}, "nbest: Input should be greater than or equal to 1"),
    ({"texts": ["red"], "beam": 2, "nbest": 3}, "nbest: 3 needs beam >= 3"),  # DecodeConfig's
    ({"texts": ["red"], "alpha": -1}, "alpha: Input should be greater than or equal to 0"),
    ({"texts": ["red"], "beams": 3}, "beams: Extra inputs are not permitted"),
    ({"texts": ["red", TOO_LONG]}, "texts[1]: 71 tokens; this model reads at most 64"),
    ([1, 2], "body: Input should be a valid dictionary"),
]


@pytest.mark.parametrize("body, message", BAD_TRANSLATE, ids=[m for _, m in BAD_TRANSLATE])
def test_bad_translate_requests_get_422_naming_the_field(client, body, message):
    if len(json.dumps(body)) > LIMITS.max_body:  # 10,000 texts: too big a body before anything
        r = client.post("/translate", json=body)
        assert r.status_code == 413 and r.json()["detail"] == "body: larger than 4096 bytes"
        with TestClient(create_app(client.app.state.batcher.run, Limits(max_texts=8))) as big:
            r = big.post("/translate", json=body)
    else:
        r = client.post("/translate", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert detail.startswith(message)


@pytest.mark.parametrize(
    ("settings", "detail"),
    [({"beam": 2, "nbest": 3, "alpha": 0.6}, "nbest: 3 needs beam >= 3"),
     ({"alpha": float("nan")}, "alpha: nan must be a finite number"),
     ({"sample": True, "nbest": 4, "mbr_utility": "ter", "alpha": 0.6},
      "mbr_utility: 'ter' must be one of chrf, bleu")],
)  # fmt: skip
def test_a_setting_the_options_refuse_is_a_422_naming_its_field(settings, detail):
    """What the request's schema cannot say (nbest within the beam) is DecodeOptions' to refuse:
    its ``SettingError`` answers 422 with the field's name, as the schema's own errors do."""
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as error:
        serve.request_search(DecodeOptions, **settings)
    assert (error.value.status_code, error.value.detail) == (422, detail)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text": ""}, "text: nothing to translate"),
        ({"text": "  "}, "text: nothing to translate"),
        ({"text": TOO_LONG}, "text: 71 tokens; this model reads at most 64"),
        ({"text": ["red"]}, "text: Input should be a valid string"),
        ({"text": "red", "beam": 0}, "beam: Input should be greater than or equal to 1"),
        ({"text": "red", "nbest": 2}, "nbest: Extra inputs are not permitted"),
        ({"texts": ["red"]}, "text: Field required"),
    ],
)
def test_bad_attention_requests_get_422_naming_the_field(client, body, message):
    r = client.post("/attention", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(message)


def test_a_json_body_sent_as_another_content_type_gets_422_saying_so(client):
    r = client.post("/translate", content='{"texts": ["red"]}')  # no Content-Type, as curl -d
    assert r.status_code == 422
    assert r.json()["detail"] == ("body: send JSON with Content-Type: application/json (not none)")


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"texts": ["red",', "body: invalid JSON at character 17"),
        ("not json", "body: invalid JSON at character 0"),
        (b'{"texts": ["\xff"]}', "body: not valid UTF-8 (bad byte 13)"),
        ('{"texts": ["\\ud800"]}', "texts[0]: Input should be a valid string"),
    ],
)
def test_malformed_json_gets_422(client, content, message):
    r = post_raw(client, "/translate", content)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(message)


def test_a_body_over_the_limit_gets_413_with_or_without_a_length(client):
    big = json.dumps({"texts": ["red cat"] * 600})
    assert len(big) > LIMITS.max_body
    assert post_raw(client, "/translate", big).status_code == 413
    chunks = (big[i : i + 1000].encode() for i in range(0, len(big), 1000))  # chunked: no length
    r = client.post("/translate", content=chunks, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"] == "body: larger than 4096 bytes"


def test_a_request_past_the_timeout_gets_503_and_the_server_goes_on(run, monkeypatch):
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.6)
        return translate_texts(*args, **kwargs)

    monkeypatch.setattr(serve, "translate_texts", slow)
    with TestClient(create_app(run, Limits(timeout=0.2))) as c:
        r = c.post("/translate", json={"texts": ["red cat"]})
        assert r.status_code == 503 and r.json()["detail"].startswith("timeout: no answer within")
        monkeypatch.setattr(serve, "translate_texts", translate_texts)
        deadline = time.monotonic() + 10
        while c.get("/health").json()["batches"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the slow batch ends in the model's thread
        r = c.post("/translate", json={"texts": ["red cat"]})
        assert r.status_code == 200, r.text


def test_unknown_paths_and_methods_get_4xx(client):
    assert client.get("/translate").status_code == 405
    assert client.get("/etc/passwd").status_code == 404
    assert client.get("/../pyproject.toml").status_code == 404


def test_the_server_keeps_serving_after_bad_requests(client):
    for body in ('{"texts": [', '{"texts": ["red"], "beam": 0}', "[]"):
        assert post_raw(client, "/translate", body).status_code == 422
    r = client.post("/translate", json={"texts": ["red cat"]})
    assert r.status_code == 200 and r.json()["translations"][0]["hypotheses"]


# ---------------------------------------------------------------------------- the command
def test_serve_without_the_extra_says_how_to_install_it(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ImportError
    monkeypatch.delitem(sys.modules, "tformer_cli.serve")
    result = CliRunner().invoke(cli_app, ["serve", "-m", str(run_dir)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'tformer[serve]'" in lines[0]


def test_a_port_in_use_is_one_line_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "-m", str(tmp_path), "--port", str(port)]  # a folder, no run in it
        result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0]


def test_serve_threads_set_torch_s_cpu_threads_as_eval_s(run_dir, monkeypatch):
    """--threads reaches the loading of the served run, which sets torch's CPU threads."""
    asked = {}
    monkeypatch.setattr(serve, "serve", lambda *args, **kwargs: asked.update(kwargs))
    result = CliRunner().invoke(cli_app, ["serve", "-m", str(run_dir), "--threads", "2"])
    assert result.exit_code == 0 and asked["threads"] == 2, result.output
    serve.load_served(run_dir, "cpu", None, "torch", asked["threads"])
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("args", "mode"), [([], "auto"), (["--compile", "off"], "off")])
def test_serve_compile_sets_how_the_served_run_s_decode_step_runs(run_dir, monkeypatch, args, mode):
    """--compile (auto unless given) reaches the loading of the served run, as translate's."""
    asked = {}
    monkeypatch.setattr(serve, "serve", lambda *args, **kwargs: asked.update(kwargs))
    result = CliRunner().invoke(cli_app, ["serve", "-m", str(run_dir), *args])
    assert result.exit_code == 0 and asked["compile"] == mode, result.output
    run, _ = serve.load_served(run_dir, "cpu", None, "torch", compile=asked["compile"])
    assert run.compile == mode


def test_requests_without_alpha_take_the_runs_beam_alpha(run):
    """The request bodies' default length penalty is the run's ``beam_alpha``."""
    translate_body, attention_body, _ = serve.request_models(LIMITS, 1.2)
    assert translate_body(texts=["red"]).alpha == attention_body(text="red").alpha == 1.2
    assert translate_body(texts=["red"], alpha=0.3).alpha == 0.3
    train = dataclasses.replace(run.config.train, beam_alpha=0.9)
    app = create_app(dataclasses.replace(run, config=dataclasses.replace(run.config, train=train)))
    schemas = app.openapi()["components"]["schemas"]
    assert schemas["TranslateRequest"]["properties"]["alpha"]["default"] == 0.9


def test_trace_answers_the_json_of_translate_trace(client, run_dir, tmp_path):
    body = {"text": "one big red dog", "beam": 3, "top": 2}
    answer = client.post("/trace", json=body)
    assert answer.status_code == 200, answer.text
    path = tmp_path / "trace.json"
    args = ["translate", "-m", str(run_dir), "-k", "3", "--device", "cpu", "--trace", str(path)]
    result = CliRunner().invoke(cli_app, [*args, body["text"]])  # on the CPU, as the server
    assert result.exit_code == 0, result.output
    wanted = json.loads(path.read_text(encoding="utf-8"))
    got = answer.json()
    assert [f["text"] for f in got["final"]] == [f["text"] for f in wanted["final"]]
    assert got["steps"][0][0]["next"][:2] == wanted["steps"][0][0]["next"][:2]
    assert all(len(h["next"]) <= 2 for step in got["steps"] for h in step)


@pytest.mark.parametrize(
    ("body", "message"),
    [({"text": " "}, "text: nothing to translate"), ({"text": "one", "top": 0}, "top")],
)
def test_bad_trace_requests_get_422_naming_the_field(client, body, message):
    answer = client.post("/trace", json=body)
    assert answer.status_code == 422 and answer.json()["detail"].startswith(message)


def test_the_page_s_example_comes_from_the_run_s_own_data(client):
    from tformer_cli.data.corpus import load_corpus

    example = client.get("/model").json()["example"]
    assert example in load_corpus("toy")["valid"]["src"][:100]  # the run's data: toy
    assert "the big dog sees a small cat" not in client.get("/").text
