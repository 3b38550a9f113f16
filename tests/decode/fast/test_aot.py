"""The decode step compiled ahead of time for the CPU: the eager step's tokens and scores, one
build per model and beam size kept on disk under a key of what it was built from."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch

from tests.decode.test_step import assert_same_search, sources
from tformer_cli.config import DecodeConfig, SamplingConfig
from tformer_cli.decode import search as search_module
from tformer_cli.decode.fast import aot
from tformer_cli.decode.fast.cpu import BUILD_AFTER, FEW_ROWS, LOAD_AFTER, LOAD_WORK, CpuStep
from tformer_cli.decode.search import search
from tformer_cli.decode.step import DecodeStep, make_step

needs_cxx = pytest.mark.skipif(aot.cxx_compiler() is None, reason="needs a C++ compiler")
threads = torch.get_num_threads


@pytest.fixture(autouse=True)
def no_kernel_search(monkeypatch):
    """The build for few rows without ``max_autotune``: Inductor's search among its own matrix
    kernels is most of that build's minutes and chooses kernels, not results (the benchmarks
    time it); the rest of the build is as shipped."""
    monkeypatch.setitem(aot.INDUCTOR, False, {**aot.INDUCTOR[False], "max_autotune": False})


@pytest.fixture
def kept(step_cache, monkeypatch):
    """The session's cache folder, where the trained model's greedy step is built once."""
    monkeypatch.setenv("XDG_CACHE_HOME", step_cache)
    return step_cache


@needs_cxx
def test_compiled_step_gives_the_eager_tokens_and_scores(
    trained_model, kept, tmp_path, monkeypatch
):
    """Greedy over sentences that finish at different steps (rows leave the batch): one
    library serves every row count, source length and span; log-probs within 1e-5."""
    src = sources(7, trained_model.cfg.vocab_size, seed=21)
    cfg = DecodeConfig(max_len_a=0, max_len_b=12)
    eager = search(trained_model, src, cfg, compile="off")
    shared = tmp_path / "inductor"  # the process's Inductor cache: a build writes none of it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    compiled = search(trained_model, src, cfg, compile="on")
    assert DecodeStep.of(trained_model, "on").compiled_now is not None  # it did not fall back
    assert_same_search(eager, compiled, atol=1e-5)
    assert aot.artifact(trained_model, 1).exists()
    assert not list(shared.rglob("*.so")) and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(shared)


@needs_cxx
def test_the_one_beam_library_makes_greedy_choices_and_serves_sampling(
    trained_model, kept, monkeypatch
):
    """Greedy's choice runs inside the library (``min_len`` banning ``</s>`` there too);
    sampling reads the same library's log-probs and draws in Python: both as eager."""
    fused = []
    greedy = CpuStep.greedy  # the search's call for a step that makes greedy's choice
    monkeypatch.setattr(CpuStep, "greedy", lambda *a: fused.append(1) or greedy(*a))
    src = sources(4, trained_model.cfg.vocab_size, seed=29)
    cfg = DecodeConfig(max_len_a=0, max_len_b=10, min_len=6)
    eager = search(trained_model, src, cfg, compile="off")
    assert all(len(h.tokens) >= 6 for n in eager for h in n)  # the ban mattered
    assert_same_search(eager, search(trained_model, src, cfg, compile="on"), atol=1e-5)
    assert len(fused) >= 6
    sampling = DecodeConfig(sampling=SamplingConfig(top_k=5), nbest=2, max_len_b=8, min_len=2)
    fused.clear()
    eager = search(trained_model, src, sampling, compile="off")
    assert_same_search(eager, search(trained_model, src, sampling, compile="on"), atol=1e-5)
    assert not fused and DecodeStep.of(trained_model, "on").compiled_now is not None


@needs_cxx
def test_a_kept_step_is_loaded_not_rebuilt_even_by_auto(trained_model, kept, monkeypatch):
    search(trained_model, sources(1, 16, seed=22), DecodeConfig(), compile="on")  # kept now
    monkeypatch.setattr(aot, "build", lambda *args: pytest.fail("rebuilt a kept step"))
    twin = copy.deepcopy(trained_model)  # same weights: same key
    src = sources(5, twin.cfg.vocab_size, seed=23)
    DecodeStep.of(twin, "auto").eager_seconds = LOAD_AFTER  # past a short job's time
    compiled = search(twin, src, DecodeConfig(), compile="auto")
    assert DecodeStep.of(twin, "auto").compiled_now is not None
    assert_same_search(search(twin, src, DecodeConfig(), compile="off"), compiled, atol=1e-5)


def test_the_key_changes_with_the_weights_beams_and_threads(trained_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = aot.artifact(trained_model, 1)
    assert path.parent == tmp_path / "tformer" / "steps"
    assert aot.artifact(copy.deepcopy(trained_model), 1) == path
    changed = copy.deepcopy(trained_model)
    with torch.no_grad():
        changed.generator.weight[5, 3] += 1e-3  # a retrained model.pt
    assert aot.artifact(changed, 1) != path
    assert aot.artifact(trained_model, 2) != path
    assert aot.artifact(trained_model, 1, many=True) != path  # the build for many rows
    with torch.autocast("cpu", torch.bfloat16):  # a step computing under bf16 autocast
        assert aot.artifact(trained_model, 1) != path
    torch.set_num_threads(2)  # Inductor's kernels fix their thread count
    assert aot.artifact(trained_model, 1) != path
    assert aot.load_step(path, trained_model, None, 1, build_missing=False) == (None, 0.0)


def test_auto_runs_eagerly_until_eager_decoding_took_a_builds_time(
    trained_model, step_cache, tmp_path, monkeypatch
):
    """``auto`` builds nothing for a short job; past ``BUILD_AFTER`` seconds of eager
    decoding, the next batch builds (here: takes the session's kept library as its build)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = []

    def build(model, eager, beams, path, many=False):
        built.append(beams)
        monkeypatch.setenv("XDG_CACHE_HOME", step_cache)
        kept = aot.artifact(model, beams, many)
        if not kept.exists():
            pytest.skip("needs the session's compiled step")
        path.parent.mkdir(parents=True)
        shutil.copy(kept, path)

    monkeypatch.setattr(aot, "build", build)
    step = make_step(trained_model, "auto")
    src = sources(3, trained_model.cfg.vocab_size, seed=24)
    with torch.inference_mode():
        step.start(src, 1, 8)
        assert step.compiled_now is None and not built
        step.eager_seconds = BUILD_AFTER
        step.start(src, 1, 8)
    assert built == [1] and step.compiled_now is not None


def test_auto_waits_for_the_last_build_time_measured_here(trained_model, tmp_path, monkeypatch):
    """A timed build of a step of this shape (any weights) sets ``auto``'s threshold: here 5 s
    instead of ``BUILD_AFTER``; a step of another beam count keeps the default."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert aot.build_seconds(trained_model, 1) is None
    retrained = copy.deepcopy(trained_model)
    with torch.no_grad():
        retrained.generator.weight[5, 3] += 1e-3  # another model.pt of the same shape
    aot.record_build(retrained, 1, 5.04)
    assert aot.build_seconds(trained_model, 1) == 5.0
    assert aot.build_seconds(trained_model, 2) is None
    (tmp_path / "tformer" / "steps" / aot.BUILDS).write_text("[not a table")
    assert aot.build_seconds(trained_model, 1) is None  # unreadable: the default again
    aot.record_build(retrained, 1, 5.0)
    asked = []  # build_missing of each load: whether auto builds now
    monkeypatch.setattr(
        aot, "load_step", lambda path, m, e, b, build, many: asked.append(build) or (None, 0)
    )
    monkeypatch.setattr(aot, "cxx_compiler", lambda: "g++")
    step = make_step(trained_model, "auto")
    step.eager_seconds = 4.0
    step.cpu_step(1)
    step.eager_seconds = 6.0
    step.cpu_step(1)
    step.cpu_step(2)
    assert asked == [False, True, False] and BUILD_AFTER > 6.0


def test_auto_loads_a_kept_step_at_once_for_a_big_batch_and_builds_none(trained_model, monkeypatch):
    """A batch of ``LOAD_WORK`` row-steps or more loads a kept step at its start, before any
    eager time; a smaller one waits for ``LOAD_AFTER``; neither builds one."""
    asked = []  # build_missing of each load
    monkeypatch.setattr(
        aot, "load_step", lambda path, m, e, b, build, many: (asked.append(build), 0)
    )
    monkeypatch.setattr(aot, "cxx_compiler", lambda: "g++")
    src = sources(2, trained_model.cfg.vocab_size, seed=30)
    with torch.inference_mode():
        make_step(trained_model, "auto").start(src, 1, 8)
        assert asked == []
        make_step(trained_model, "auto").start(src, 1, LOAD_WORK // 2)
    assert asked == [False]


def test_the_build_for_few_rows_or_for_many_goes_by_the_rows_of_a_batch(trained_model, monkeypatch):
    """Up to ``FEW_ROWS`` rows (sentences x beams) a batch runs the build for few rows, above it
    the build for many, in ``auto`` and ``on``; ``off`` runs neither."""
    asked = []
    monkeypatch.setattr(CpuStep, "cpu_step", lambda self, beams, many, big: asked.append(many))
    vocab = trained_model.cfg.vocab_size
    few, many = sources(FEW_ROWS // 2, vocab, 26), sources(FEW_ROWS + 1, vocab, 27)
    with torch.inference_mode():
        for mode in ("auto", "on", "off"):
            step = make_step(trained_model, mode)
            step.start(few, 2, 8)  # FEW_ROWS rows
            step.start(few, 3, 8)
            step.start(many, 1, 8)
    assert asked == [False, True, True] * 2


def test_without_a_cxx_compiler_the_step_runs_eagerly_with_a_notice(
    trained_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(aot, "cxx_compiler", lambda: None)
    notices = []
    step = make_step(trained_model, "on", on_notice=notices.append)
    src = sources(2, trained_model.cfg.vocab_size, seed=25)
    with torch.inference_mode():
        cache = step.start(src, 1, 5)
        logp = step(torch.full((2,), 2), cache)
    assert step.compiled_now is None and logp.shape == (2, trained_model.cfg.vocab_size)
    assert notices == ["no C++ compiler found (g++ or $CXX): the decode step runs eagerly"]
    assert not (tmp_path / "tformer").exists()


@needs_cxx
def test_a_step_that_fails_to_build_runs_eagerly_with_a_notice(
    trained_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def broken(*args, **kwargs):
        raise RuntimeError("backend exploded\nmore lines")

    monkeypatch.setattr(aot, "export_step", broken)
    notices = []
    step = make_step(trained_model, "on", on_notice=notices.append)
    with torch.inference_mode():
        step.start(sources(2, trained_model.cfg.vocab_size, seed=26), 1, 5)
    assert step.compiled_now is None
    assert notices == ["compiling the decode step failed (backend exploded); running it eagerly"]


def test_int8_weights_run_eagerly_and_on_says_so(trained_model, tmp_path, monkeypatch):
    from tformer_cli.model.fast import quantize_int8

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    int8 = quantize_int8(copy.deepcopy(trained_model))
    assert aot.supported(trained_model) and not aot.supported(int8)
    notices = []
    step = make_step(int8, "on", on_notice=notices.append)
    with torch.inference_mode():
        step.start(sources(2, int8.cfg.vocab_size, seed=27), 1, 5)
    assert step.compiled_now is None
    assert notices == ["the compiled CPU step takes fp32 weights: running it eagerly"]


@pytest.mark.slow
@needs_cxx
def test_compiled_beam_search_gives_the_eager_hypotheses(trained_model, kept, monkeypatch):
    """Beams: a second library (beams per sentence are fixed in it), rows reordered between
    steps, finished sentences leaving the batch; 10 rows, the build for many rows (MKL's
    kernels, explicit attention; the greedy tests check the build for few); under bf16
    autocast, whose library computes as autocast does (products in bf16 from weights cast once
    at build time, log-softmax in fp32): the eager hypotheses, their scores (sums over up to 12
    steps) as close as bf16's rounding, once per fused operation, allows. Built once: the fp32
    steps' tests build fp32's."""
    src = sources(5, trained_model.cfg.vocab_size, seed=28)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_a=0, max_len_b=12)
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        assert aot.supported(trained_model)
        eager = search(trained_model, src, cfg, compile="off")
        compiled = search(trained_model, src, cfg, compile="on")
        assert aot.artifact(trained_model, 2, many=True).exists()
    assert DecodeStep.of(trained_model, "on").compiled_now is not None
    assert not aot.artifact(trained_model, 2, many=True).exists()  # fp32's is another one
    assert_same_search(eager, compiled, atol=0.1)


@pytest.fixture
def restored_threads():
    before = threads()
    yield
    torch.set_num_threads(before)


def test_a_search_of_one_row_runs_on_one_thread_and_gives_the_threads_back(
    trained_model, monkeypatch, restored_threads
):
    """Greedy at batch 1 or 2 (and one sample) on one thread, beam 5 or three sentences on
    all; the count is restored after, and after an error."""
    seen = []
    monkeypatch.setattr(search_module, "batched_greedy", lambda *a: seen.append(threads()) or [])
    monkeypatch.setattr(search_module, "batched_beam", lambda *a: seen.append(threads()) or [])
    torch.set_num_threads(2)
    vocab = trained_model.cfg.vocab_size
    one, two, three = (sources(n, vocab, 30 + n) for n in (1, 2, 3))
    search(trained_model, one, DecodeConfig())
    search(trained_model, two, DecodeConfig())
    search(trained_model, one, DecodeConfig(sampling="sample", nbest=2))
    search(trained_model, one, DecodeConfig(beam=5))
    search(trained_model, three, DecodeConfig())
    search(trained_model, two, DecodeConfig(sampling="sample", nbest=2))
    assert seen == [1, 1, 1, 2, 2, 2] and threads() == 2
    monkeypatch.setattr(search_module, "batched_greedy", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        search(trained_model, one, DecodeConfig())
    assert threads() == 2


def test_a_compiled_step_is_kept_per_thread_count(
    trained_model, tmp_path, monkeypatch, restored_threads
):
    """Inductor's kernels fix their thread count: the step built for one thread is not the one
    a search on two threads runs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    loaded = []
    monkeypatch.setattr(
        aot, "load_step", lambda path, m, e, b, build, many: loaded.append(path) or (object(), 0.0)
    )
    step = make_step(trained_model, "on")
    torch.set_num_threads(1)
    one = step.cpu_step(1)
    torch.set_num_threads(2)
    two = step.cpu_step(1)
    assert one is not two and len(set(loaded)) == 2 and step.cpu_step(1) is two
