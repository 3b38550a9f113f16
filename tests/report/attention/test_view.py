"""Tests for tformer_cli.report.attention (maps, align, render, view): the collected weights are
real attention distributions (rows sum to 1, causal, equal to softmax(QK^T/sqrt(d_k)+M)
recomputed by hand, equal to what cached decoding computed), the alignment score counts right,
the pictures parse and carry every label, the terminal view matches a stored snapshot, and bad
options fail with one line.

Update the snapshot after an intended change of the terminal layout with
``UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/report/attention/test_view.py`` and review the diff
of ``tests/report/attention/snapshots/inspect_attention.txt``.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import ModelConfig
from tformer_cli.data.tokenizer import EOS_ID, train_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.model import Transformer
from tformer_cli.report.attention import align as aa
from tformer_cli.report.attention import maps, render
from tformer_cli.report.attention import view as av

SNAPSHOT = Path(__file__).parent / "snapshots" / "inspect_attention.txt"
SRC = [5, 9, 7, 12]  # ids without </s>
TGT = [6, 11, 8, 3]  # generated tokens, </s> (3) last
SRC_LABELS = ["▁the", "▁red", "▁cat", "▁&<x>", "</s>"]  # one label needs XML escaping
TGT_LABELS = ["▁die", "▁rote", "▁katze", "</s>"]


def tiny() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=20, d_model=16, h=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, max_positions=32,
    )  # fmt: skip
    return Transformer(cfg).eval()


def tiny_maps() -> maps.AttentionMaps:
    weights = {kind: w[0] for kind, w in maps.collect(tiny(), [SRC], [TGT]).items()}
    return maps.AttentionMaps(
        "the red cat &<x>", "die rote katze", SRC_LABELS, ["<s>", *TGT_LABELS[:-1]], TGT_LABELS,
        weights,
    )  # fmt: skip


# ---------------------------------------------------------------------------- the weights
def test_collect_shapes_and_every_row_sums_to_one():
    srcs, tgts = [SRC, SRC[:2]], [TGT, [4, EOS_ID]]
    w = maps.collect(tiny(), srcs, tgts)
    assert w["encoder"].shape == (2, 2, 2, 5, 5)  # (B, L, h, S, S)
    assert w["decoder"].shape == (2, 2, 2, 4, 4)  # (B, L, h, T, T)
    assert w["cross"].shape == (2, 2, 2, 4, 5)  # (B, L, h, T, S)
    for b, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        S, T = len(s) + 1, len(t)
        for kind, rows in (("encoder", S), ("decoder", T), ("cross", T)):
            sums = w[kind][b, :, :, :rows].sum(dim=-1)
            torch.testing.assert_close(sums, torch.ones_like(sums))
        assert w["cross"][b, :, :, :T, S:].abs().sum() == 0  # padded source gets nothing


def test_decoder_self_attention_is_zero_above_the_diagonal():
    w = maps.collect(tiny(), [SRC], [TGT])["decoder"][0]  # (L, h, T, T)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert w[..., future].abs().max() == 0
    assert (w[..., ~future] > 0).all()


def test_recording_is_switched_off_afterwards():
    model = tiny()
    maps.collect(model, [SRC], [TGT])
    for modules in model.attention_modules().values():
        assert all(not m.record_weights and m.weights is None for m in modules)


def test_weights_equal_softmax_of_q_k_recomputed_by_hand():
    """softmax(Q K^T / sqrt(d_k) + M) from each module's own projections of its inputs."""
    model = tiny()
    inputs: dict[int, tuple] = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda m, args, kwargs: inputs.__setitem__(id(m), (args, kwargs)), with_kwargs=True
        )
        for ms in model.attention_modules().values()
        for m in ms
    ]
    try:
        w = {kind: x[0] for kind, x in maps.collect(model, [SRC], [TGT]).items()}
    finally:
        for h in hooks:
            h.remove()
    with torch.inference_mode():  # the captured inputs are inference tensors
        memory, _ = model.encode(torch.tensor([[*SRC, EOS_ID]]))  # (1, S, d)
        d_k = model.cfg.d_k

        def heads(x: torch.Tensor) -> torch.Tensor:  # (1, T, d) -> (1, h, T, d_k)
            return x.view(1, x.size(1), model.cfg.h, d_k).transpose(1, 2)

        for kind, modules in model.attention_modules().items():
            for layer, m in enumerate(modules):
                (x, mask), kwargs = inputs[id(m)]
                if kind == "cross":
                    q = heads(m.w_q(x))
                    k = heads(m.w_kv(memory)[..., : model.cfg.d_model])
                else:
                    q, k, _ = (heads(t) for t in m.w_qkv(x).chunk(3, dim=-1))
                scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
                if mask is not None:
                    scores = scores + mask
                if kwargs.get("causal"):  # the decoder's square causal mask, written out here
                    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
                    scores = scores.masked_fill(future, float("-inf"))
                expected = scores.softmax(dim=-1)[0]  # (h, T, S)
                torch.testing.assert_close(w[kind][layer], expected, atol=1e-6, rtol=1e-5)


def test_teacher_forced_weights_equal_those_of_cached_greedy_decoding():
    """The one pass over the chosen hypothesis sees what each cached decoding step saw."""
    from tformer_cli.decode.search import batched_greedy

    model = tiny()
    src = torch.tensor([[*SRC, EOS_ID]])
    hyp = batched_greedy(model, src)[0][0]  # the one sentence's best
    tokens = hyp.tokens + [EOS_ID] * hyp.finished
    w = maps.collect(model, [SRC], [tokens])
    with torch.no_grad():
        memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, len(tokens))
    model.record_attention(True)
    try:
        for t, prev in enumerate([2, *tokens[:-1]]):  # <s> y_1 .. y_{T-1}
            with torch.no_grad():
                model.decode(torch.tensor([[prev]]), memory, src_mask, cache)
            for kind in ("decoder", "cross"):
                for layer, m in enumerate(model.attention_modules()[kind]):
                    step = m.weights[0, :, 0]  # (h, keys so far)
                    torch.testing.assert_close(
                        step, w[kind][0, layer, :, t, : step.size(-1)], atol=1e-6, rtol=1e-5
                    )
    finally:
        model.record_attention(False)


# ---------------------------------------------------------------------------- measures
def test_entropy_in_bits():
    one_hot = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    uniform = torch.full((1, 4), 0.25)
    assert float(av.entropy_bits(one_hot)) == 0.0
    assert float(av.entropy_bits(uniform)) == pytest.approx(2.0)


def test_word_index_counts_word_start_pieces():
    assert aa.word_index(["▁hund", "e", "▁sieht", "▁", "."], 3) == [0, 0, 1, 2, 2]
    assert aa.word_index(["▁a", "b"], 2) is None  # disagrees with the whitespace words


def test_crossing_words_are_the_reordered_ones():
    # weil(0) die(1) katze(2) schläft(3) <- because the cat sleeps: monotone, no crossing
    assert aa.crossing_words([(0, 0), (1, 1), (2, 2), (3, 3)]) == set()
    # sees(1) the(2) cat(3) -> die(1) katze(2) sieht(3): the verb jumps over the object
    assert aa.crossing_words([(0, 0), (1, 3), (2, 1), (3, 2)]) == {1, 2, 3}


def test_alignment_accuracy_scores_each_head(monkeypatch):
    """Head 1 attends to the gold-aligned word, head 2 to the same position: with the verb moved
    to the end, head 1 scores 3/3 and head 2 only the first word."""
    words = ["red", "blue", "green", "cat", "dog", "bird"]
    tok = train_tokenizer([" ".join(words)] * 2, vocab_size=20, kind="wordlevel", min_frequency=1)
    pairs = [("red blue green", "red green blue")]
    links = [[(0, 0), (1, 2), (2, 1)]]
    gold = torch.zeros(4, 4)  # rows: generated red green blue </s>; cols: red blue green </s>
    gold[0, 0] = gold[1, 2] = gold[2, 1] = gold[3, 3] = 1.0
    diagonal = torch.eye(4)
    cross = torch.stack([gold, diagonal])[None, None]  # (B=1, L=1, h=2, T, S)
    monkeypatch.setattr(aa, "collect", lambda model, s, t: {"cross": cross})

    class Stub:
        decoder = (None,)  # one layer
        cfg = ModelConfig(vocab_size=20, d_model=4, h=2)

    score = aa.alignment_accuracy(Stub(), tok, pairs, links)  # type: ignore[arg-type]
    assert score.words == 3 and score.crossing_words == 2 and score.sentences == 1
    assert score.accuracy.tolist() == [[1.0, pytest.approx(1 / 3)]]
    assert score.crossing.tolist() == [[1.0, 0.0]]
    assert score.best() == (0, 0)


def test_select_panels_and_titles():
    maps = tiny_maps()
    assert [p.title for p in av.select(maps, "cross").panels] == [
        "layer 2 · head 1",
        "layer 2 · head 2",
    ]
    assert len(av.select(maps, "encoder", "all", "all").panels) == 4
    mean = av.select(maps, "decoder", "1", "mean").panels
    assert [p.title for p in mean] == ["layer 1 · mean of 2 heads"]
    torch.testing.assert_close(mean[0].weights, maps.weights["decoder"][0].mean(dim=0))


@pytest.mark.parametrize(
    ("kind", "layer", "head", "message"),
    [
        ("cross", "3", "all", "--layer 3 is out of range: 2 decoder layers"),
        ("cross", "first", "all", "--layer 'first' is not a number"),
        ("cross", "last", "0", "--head 0 is out of range: 2 heads"),
        ("self", "last", "all", "unknown attention kind 'self'"),
    ],
)
def test_select_rejects_bad_choices(kind, layer, head, message):
    with pytest.raises(TformerError, match=message):
        av.select(tiny_maps(), kind, layer, head)


# ---------------------------------------------------------------------------- pictures
def test_svg_parses_and_labels_every_token():
    maps = tiny_maps()
    svg = render.view_svg(av.select(maps, "cross", "all", "all"), maps.source, maps.translation)
    root = ET.fromstring(svg)
    texts = {"".join(e.itertext()) for e in root.iter("{http://www.w3.org/2000/svg}text")}
    assert set(SRC_LABELS) | set(TGT_LABELS) <= texts
    assert {"layer 1 · head 1", "layer 2 · head 2"} <= texts
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) >= 4 * 4 * 5  # a cell per weight in each of the 4 panels
    assert len(list(root.iter("{http://www.w3.org/2000/svg}circle"))) == 4 * 4  # a mark per row


def test_html_is_self_contained():
    maps = tiny_maps()
    rows = av.summary_rows(maps, "cross")
    html = render.view_html(av.select(maps, "cross"), maps.source, maps.translation, rows)
    assert html.startswith("<!doctype html>") and "<svg" in html and "<table>" in html
    assert "&amp;&lt;x&gt;" in html and "<x>" not in html
    assert "src=" not in html and "href=" not in html and "<script" not in html


def test_png_is_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "attn.png"
    render.view_png(av.select(tiny_maps(), "cross"), path, "src", "tgt")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_holds_every_weight_with_its_tokens():
    maps = tiny_maps()
    record = json.loads(render.to_json(maps, av.summary_rows(maps, "cross")))
    cross = record["attention"]["cross"]
    assert cross["rows"] == TGT_LABELS and cross["cols"] == SRC_LABELS
    assert torch.tensor(cross["weights"]).shape == (2, 2, 4, 5)
    assert len(record["heads"]) == 4 and record["heads"][0]["layer"] == 1


# ---------------------------------------------------------------------------- terminal
def render_text(width: int = 100) -> str:
    maps = tiny_maps()
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=width, color_system=None, file=sink)
        console.print(render.view_terminal(av.select(maps, "cross", "all"), width, color=False))
        console.print(render.summary_table(av.summary_rows(maps, "cross"), "cross", None, width))
    return console.export_text()


def test_terminal_output_matches_the_snapshot():
    text = render_text()
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8")


def test_terminal_crops_long_sentences_with_a_note():
    text = render_text(width=12)
    assert "cropped: first 3 of 5 columns shown" in " ".join(text.split())
    labels = ("die ", "rote ", "katze ", "</s> ")
    grid = [line for line in text.splitlines() if line.lstrip().startswith(labels)]
    assert len(grid) == 4 * 4 and all(len(line) <= 12 for line in grid)
    # a row's strongest cell is marked only when it is among the columns shown
    shown = int((tiny_maps().weights["cross"].argmax(dim=-1) < 3).sum())  # of 16 rows
    assert sum(any(ch.isdigit() for ch in line) for line in grid) == shown < 16


def test_colour_terminal_shades_cells_with_a_background():
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=100, color_system="truecolor", file=sink)
        console.print(render.view_terminal(av.select(tiny_maps(), "cross"), 100, color=True))
    assert "\x1b[" in console.export_text(styles=True)
    assert render.colour(0.0) == "#440154" and render.colour(1.0) == "#fde725"


# ---------------------------------------------------------------------------- the command
runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path, make_run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    return make_run(tmp_path / "run")[0]


def test_command_prints_heatmaps_and_writes_files(run_dir, tmp_path):
    svg, js = tmp_path / "a.svg", tmp_path / "a.json"
    args = ["inspect-attention", "red cat dog", "-m", str(run_dir), "--no-align", "--beam", "2"]
    result = runner.invoke(app, [*args, "--save", str(svg)])
    assert result.exit_code == 0, result.output
    assert "L2 H4" in result.stdout and "cross attention per head" in result.stdout  # 80 columns
    assert ET.fromstring(svg.read_text(encoding="utf-8")) is not None
    written = runner.invoke(app, [*args, "--json", "-o", str(js)])
    assert written.exit_code == 0 and written.stdout == "", written.output
    assert json.loads(js.read_text(encoding="utf-8"))["src_tokens"][-1] == "</s>"
    printed = runner.invoke(app, [*args, "--json"])  # the same JSON on stdout
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout) == json.loads(js.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--layer", "7"], "--layer 7 is out of range"),
        (["--head", "5"], "--head 5 is out of range"),
        (["--save", "a.pdf"], "use a .svg, .html or .png"),
    ],
)
def test_command_bad_arguments_give_one_line_errors(run_dir, option, message):
    result = runner.invoke(app, ["inspect-attention", "red cat", "-m", str(run_dir), *option])
    assert result.exit_code == 1
    assert result.stdout == "" and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]


@pytest.mark.parametrize(
    "option", [["--kind", "selfish"], ["--head", "x"], ["--layer", "0"]], ids=" ".join
)
def test_command_values_of_no_run_are_usage_errors(run_dir, option):
    result = runner.invoke(app, ["inspect-attention", "red cat", "-m", str(run_dir), *option])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '{option[0]}'" in result.stderr


def test_command_follows_the_best_beam_hypothesis(run_dir, tmp_path):
    from tformer_cli.checkpoint import load_run
    from tformer_cli.config import DecodeConfig
    from tformer_cli.data.tokenizer import encode
    from tformer_cli.decode.search import search

    js = tmp_path / "a.json"
    args = ["inspect-attention", "red cat dog", "-m", str(run_dir), "-k", "3", "--no-align"]
    assert runner.invoke(app, [*args, "--device", "cpu", "--json", "-o", str(js)]).exit_code == 0
    run = load_run(run_dir, "cpu")
    src = torch.tensor([[*encode(run.tokenizer, ["red cat dog"])[0], EOS_ID]])
    best = search(run.model, src, DecodeConfig(beam=3))[0][0]
    ids = best.tokens + [EOS_ID] * best.finished
    record = json.loads(js.read_text(encoding="utf-8"))
    assert record["tgt_tokens"] == [run.tokenizer.id_to_token(i) for i in ids]


def test_command_says_when_no_gold_alignment_applies(run_dir):
    """The fixture run says it was trained on toy, but its word-level vocabulary maps the toy
    test words to <unk>: no pair can be scored, and the command says so instead of failing."""
    args = ["inspect-attention", "red cat", "-m", str(run_dir), "--align-sentences", "4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "no test pair's subwords map to its words" in result.stdout
