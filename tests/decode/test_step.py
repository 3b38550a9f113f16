"""The static-shape decode step: which way it runs (eager, compiled, CUDA graphs), and that
every way gives the eager search's tokens and scores (the CPU's compiled step: fast/test_aot.py);
buckets; int8 weights."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from tformer_cli.config import DecodeConfig
from tformer_cli.config.fields import MODES
from tformer_cli.decode import fast
from tformer_cli.decode.fast.buckets import EAGER, GRAPHS, Buckets, FastStep
from tformer_cli.decode.fast.cpu import CpuStep
from tformer_cli.decode.fast.graphs import uses_cuda_graphs
from tformer_cli.decode.search import search
from tformer_cli.decode.step import DecodeStep, make_step
from tformer_cli.errors import TformerError
from tformer_cli.model import fast as model_fast
from tformer_cli.model.fast import quantize_int8


def sources(n: int, vocab: int, seed: int) -> torch.Tensor:
    from tformer_cli.data.batching import pad
    from tformer_cli.data.tokenizer import EOS_ID

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    return pad([[*torch.randint(4, vocab, (k,), generator=g).tolist(), EOS_ID] for k in lengths])


def assert_same_search(a, b, atol: float = 1e-4) -> None:
    """Same tokens, same finished flags, scores within float tolerance, for every n-best."""
    assert [[h.tokens for h in n] for n in a] == [[h.tokens for h in n] for n in b]
    assert [[h.finished for h in n] for n in a] == [[h.finished for h in n] for n in b]
    for x, y in zip(a, b, strict=True):
        for hx, hy in zip(x, y, strict=True):
            assert hx.score == pytest.approx(hy.score, abs=atol)
            assert hx.logprob == pytest.approx(hy.logprob, abs=atol)


def test_buckets_round_rows_up_to_powers_of_two_only_where_shapes_cost():
    assert [GRAPHS.sentences(n) for n in (1, 2, 3, 5, 17, 32)] == [1, 2, 4, 8, 32, 32]
    assert [EAGER.sentences(n) for n in (1, 3, 17)] == [1, 3, 17]
    assert Buckets(rows=True).sentences(7) == 8


def test_on_the_cpu_auto_and_on_may_compile_ahead_of_time_and_off_is_eager(tiny_model):
    model = tiny_model(seed=1).eval()
    steps = [make_step(model, mode) for mode in MODES]
    ways = [step.mode if isinstance(step, CpuStep) else type(step) for step in steps]
    assert ways == [mode if mode != "off" else DecodeStep for mode in MODES]
    assert all(step.buckets == EAGER for step in steps)  # no graphs
    with pytest.raises(TformerError, match="unknown --compile"):
        make_step(model, "sometimes")


def test_auto_and_on_capture_cuda_graphs_on_cuda_and_off_does_not():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert uses_cuda_graphs(cuda, "auto") and uses_cuda_graphs(cuda, "on")
    assert not uses_cuda_graphs(cuda, "off")
    assert not any(uses_cuda_graphs(cpu, mode) for mode in ("auto", "on", "off"))


def test_the_step_is_kept_per_model_and_mode_and_goes_with_the_model(tiny_model):
    model = tiny_model(seed=2).eval()
    assert DecodeStep.of(model, "off") is DecodeStep.of(model, "off")
    assert DecodeStep.of(model, "off") is not DecodeStep.of(model, "auto")
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # the kept steps (and their buffers, graphs) do not keep it alive


@pytest.mark.parametrize("beam", [1, 3])
def test_bucketed_rows_and_lengths_give_the_exact_sizes_results(tiny_model, beam, monkeypatch):
    """Padding rows (copies of real sentences), padded sources and a longer span change no
    result: the buckets a compiled or captured step uses, here run eagerly."""
    model = tiny_model(seed=3).eval()
    src = sources(5, model.cfg.vocab_size, seed=4)
    cfg = DecodeConfig(beam=beam, nbest=beam)
    exact = search(model, src, cfg, compile="off")
    monkeypatch.setattr(fast, "choose", lambda eager, mode, notice: Bucketed(eager))
    twin = copy.deepcopy(model)  # a step of its own, chosen anew
    padded = search(twin, src, cfg, compile="off")
    assert max(DecodeStep.of(twin, "off").rows) == 8 * beam  # 5 sentences: a bucket of 8
    assert_same_search(exact, padded, atol=1e-5)


class Bucketed(FastStep):
    """The eager step over ``GRAPHS``' buckets, recording the rows it ran."""

    buckets = GRAPHS

    def __init__(self, eager):
        super().__init__(eager)
        self.rows = set()

    def __call__(self, tokens, cache, rows):
        self.rows.add(cache.self_kv.size(2))
        return self.eager(tokens, cache, rows)


def test_int8_weights_translate_like_fp32_on_a_trained_model(trained_model):
    """int8 Linear layers (the output layer too) keep the trained toy model's translations."""
    src = sources(16, trained_model.cfg.vocab_size, seed=9)
    fp32 = search(trained_model, src, DecodeConfig(), compile="off")
    int8 = search(quantize_int8(trained_model), src, DecodeConfig(), compile="off")
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(fp32, int8, strict=True))
    assert same >= 14, f"{same} of 16 the same"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_graphs_give_the_eager_tokens_and_scores(trained_model, beam, dtype, monkeypatch):
    """Graph replays (rows bucketed and shrinking as sentences finish, beam reorders inside the
    graph, buffers kept across batches) against the eager step on the same GPU."""
    from tformer_cli.device import inference

    # fp32 as fp32: TF32, on once any test of the process ran setup_threads, rounds the bucketed
    # graphs' kernels and the eager ones differently (scores 1.2e-3 apart on an H100)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = copy.deepcopy(trained_model).cuda()
    cfg = DecodeConfig(beam=beam, nbest=beam)
    for seed in (11, 12):  # the second batch replays the first one's graphs
        src = sources(7, model.cfg.vocab_size, seed=seed).cuda()  # 7 rows: 8 in the bucket
        with inference(src.device, dtype):
            eager = search(model, src, cfg, compile="off")
            graphed = search(model, src, cfg, compile="auto")
        assert_same_search(eager, graphed, atol=1e-3 if dtype else 1e-4)
    assert DecodeStep.of(model, "auto").captured  # graphs were captured and replayed


def test_a_search_of_many_rows_gives_the_fused_kernels_hypotheses(trained_model, monkeypatch):
    """Beam search over more rows than ``EXPLICIT_ROWS`` attends through the explicit ops:
    the same tokens as the fused kernel, scores within float tolerance."""
    src = sources(16, trained_model.cfg.vocab_size, seed=5)  # 16 sentences x 4 beams = 64 rows
    cfg = DecodeConfig(beam=4, nbest=2)
    explicit = search(trained_model, src, cfg, compile="off")
    monkeypatch.setattr(model_fast, "EXPLICIT_ROWS", 10**9)
    assert_same_search(search(trained_model, src, cfg, compile="off"), explicit, atol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_new_buffers_are_left_blank_and_never_read_before_written(trained_model, monkeypatch, beam):
    """The eager step's new buffers (beam search's spare, a cache shrunk as sentences finish)
    are not zeroed: filled with NaN instead, every slot a step attends to is written before it
    is read (spans of exactly pos + 1 slots), and the search is unchanged."""
    src = sources(6, trained_model.cfg.vocab_size, seed=33)
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=0, max_len_b=12)
    zeroed = search(trained_model, src, cfg, compile="off")
    nan = float("nan")
    monkeypatch.setattr(torch, "empty_like", lambda t, **k: torch.full_like(t, nan, **k))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, size, **k: t.new_full(size, nan, **k))
    blank = search(trained_model, src, cfg, compile="off")
    assert_same_search(zeroed, blank, atol=0)
