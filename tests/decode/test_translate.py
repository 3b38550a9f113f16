"""Tests for tformer_cli.decode.translate: token lists translated in batches and in input order,
blank inputs, sources too long, minimum Bayes risk reranking, and the depth of the calls from
the Python API down to the model."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from tests.decode.test_search import CFG, as_src, greedy
from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.translate import Batching, mbr_rerank, translate_ids
from tformer_cli.errors import TformerError


@pytest.mark.parametrize("max_tokens", [8, 4096])
def test_translate_ids_returns_results_in_input_order(trained_model, max_tokens):
    sources = [[4, 5, 6, 7, 8, 9], [10], [11, 12, 13], [4, 4], [5, 6, 7, 8, 9, 10, 11], [12, 13]]
    results = translate_ids(trained_model, sources, CFG, Batching(max_tokens=max_tokens))
    assert len(results) == len(sources)
    for s, r in zip(sources, results, strict=True):
        (alone,) = greedy(trained_model, as_src([s]), CFG)
        assert r.hypotheses[0].tokens == alone.tokens


def test_a_blank_input_gets_an_empty_translation_and_the_others_keep_their_places(
    trained_model,
):
    sources = [[4, 5, 6], [], [10, 11]]
    done: list[int] = []
    results = translate_ids(trained_model, sources, CFG, on_batch=done.append)
    assert results[1].hypotheses[0].tokens == [] and sum(done) == 3
    for i in (0, 2):
        (alone,) = greedy(trained_model, as_src([sources[i]]), CFG)
        assert results[i].hypotheses[0].tokens == alone.tokens


def test_source_longer_than_max_positions_is_an_error_naming_it(tiny_model):
    """Never cut silently: the error names the input (counted from ``first``) and its length."""
    model = tiny_model(seed=7, max_positions=8)
    assert len(translate_ids(model, [[4] * 7], CFG)[0].hypotheses[0].tokens) <= 7  # 8 fit
    message = "input 12 has 13 tokens; this model reads at most 8"
    with pytest.raises(TformerError, match=f"^{message}$"):
        translate_ids(model, [[4, 5], [4] * 12], CFG, first=11)


def test_mbr_over_one_candidate_or_identical_ones_returns_it():
    one = [Hypothesis([5], -1.0, -1.0)]
    texts, hyps = mbr_rerank(["der hund ."], one, "chrf")
    assert texts == ["der hund ."] and hyps[0].logprob == -1.0  # the model's, kept
    three = [Hypothesis([i], -i, -i) for i in range(3)]
    texts, hyps = mbr_rerank(["a b", "a b", "a b"], three, "bleu")
    assert texts == ["a b"] * 3 and [h.tokens for h in hyps] == [[0], [1], [2]]
    texts, hyps = mbr_rerank(["q w e r", "a b c", "a b c"], three, "chrf")  # the consensus
    assert texts[0] == "a b c" and hyps[0].tokens == [1] and hyps[-1].tokens == [0]
    assert hyps[0].score == max(h.score for h in hyps)


# Calls from ``Run.translate`` to ``Transformer.decode`` with ``compile`` off: the tformer frames
# on the stack when the model decodes, from Run.translate, translate_texts, translate_ids and the
# greedy or beam loop to Rows.logprobs and the eager DecodeStep
CALL_DEPTH = 6


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_reaches_the_model_through_few_tformer_frames(tmp_path, make_run, beam):
    import tformer_cli as tformer
    from tformer_cli.model import Transformer

    package = str(Path(tformer.__file__).parent)
    run = tformer.load(str(make_run(tmp_path / "run")[0]), device="cpu", compile="off")
    stacks, decode = [], Transformer.decode

    def recorded(self, *args, **kwargs):
        stacks.append([f for f in traceback.extract_stack() if f.filename.startswith(package)])
        return decode(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Transformer, "decode", recorded)
        run.translate("red blue", beam=beam)
    frames = [f.name for f in stacks[0]]
    frames = frames[frames.index("translate") :]  # pytest's own frames above it
    assert len(frames) <= CALL_DEPTH, frames
