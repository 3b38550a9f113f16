"""Decoding throughput: tokens/s and sentences/s, measured side by side in one run.

Greedy and beam 5 at batch 1 (several sentences, one at a time) and batch 32, for each
precision (fp32; int8 on CPU; bf16 where the device computes it fast): our search, for each
``--compile`` mode (on the CPU ``on``, the step compiled ahead of time, fp32 and bf16, and ``off``,
the eager step); the "floor", the same weights through the bare static-shape step (argmax only,
no search bookkeeping, beam's rows without reordering), so the search's overhead is a number;
our search without the KV cache (fp32); Hugging Face ``generate()`` on a ``MarianMTModel`` of
equal dimensions as shipped, and at its best (static cache and a compiled forward, where that
works); and CTranslate2 (that model converted, CPU) when the ``bench`` extra is installed; and
``tformer --engine ctranslate2``: our model through tformer's own export (``tformer export
--to ctranslate2``) and its engine (``interop.engine.translate_sources``: length-grouped
``translate_batch`` calls, hypotheses mapped back and detokenized), as a user runs it.
Every system generates exactly ``--length`` tokens per sentence: ``</s>`` is forbidden until
then (our ``DecodeConfig.min_len``, Hugging Face's ``min_new_tokens``, CTranslate2's
``min_decoding_length``), so all do the same work on random weights. int8 is the same
quantization (``tformer_cli.model.fast.quantize_int8``) of the Linear layers for us and for HF, and
CTranslate2's own int8. CTranslate2 runs in a worker process of its own (its OpenMP runtime
slows torch's down when both live in one process), started for its precision's measurements
and closed before the next precision's, so that no idle worker's threads spin beside the one
measured; its default backend unless ``--ct2-env`` (e.g. ``CT2_USE_MKL=1``,
``CT2_FORCE_CPU_ISA=AVX512``). Precisions are measured one after the other; within one, rounds
are interleaved, the order of systems rotated; each figure is the median over rounds.
Multi-threaded timings collapse when other jobs share the cores: the header says how busy they
were. The compiled CPU step is built at the warm-up if not kept yet (``~/.cache/tformer/steps``).

    python benchmarks/bench_decode.py                  # full table, CPU, several minutes
    python benchmarks/bench_decode.py --device cuda    # on a GPU: CUDA graphs, fp32 and bf16
    python benchmarks/bench_decode.py --quick          # one round, 2 sentences at batch 1
    python benchmarks/bench_decode.py --json out.json  # every figure, for the README's table
    python benchmarks/bench_decode.py --profile        # and where a greedy step's time goes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from tformer_cli.checkpoint import for_inference
from tformer_cli.config import DecodeConfig, ModelConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tformer_cli.decode.fast import search_threads
from tformer_cli.decode.fast.buckets import round_up
from tformer_cli.decode.search import search
from tformer_cli.decode.step import DecodeStep
from tformer_cli.device import cpu_has_fast_bf16, cpu_model, inference, setup
from tformer_cli.model import Transformer
from tformer_cli.model.fast import quantize_int8

Run = Callable[[Tensor, int, int], list[int]]  # (src (B, S), beam, length) -> generated lengths


@dataclass(frozen=True)
class Setting:
    beam: int
    batch: int

    @property
    def label(self) -> str:
        search_ = "greedy" if self.beam == 1 else f"beam {self.beam}"
        return f"{search_}, batch {self.batch}"


@dataclass
class System:
    name: str
    run: Run
    greedy_only: bool = False  # skip beam settings (the uncached path)
    worker: Worker | None = None  # a process of its own, open only while its precision runs


def busy_cores(seconds: float = 0.5) -> float:
    """Cores kept busy by other processes while this one sleeps ``seconds`` (Linux; else 0)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="utf-8") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # busy (not idle, iowait), total

    try:
        busy0, total0 = sample()
        time.sleep(seconds)
        busy1, total1 = sample()
    except (OSError, IndexError, ValueError):
        return 0.0
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def model_config(vocab: int = 8000, layers: str = "3+3") -> ModelConfig:
    """The benchmark's model: ``layers`` encoder+decoder layers (3+3 unless given), d=256,
    4 heads, FFN 1024, no dropout."""
    encoder, _, decoder = layers.partition("+")
    return ModelConfig(
        vocab_size=vocab, d_model=256, h=4, d_ff=1024, n_encoder_layers=int(encoder),
        n_decoder_layers=int(decoder), dropout=0.0,
    )  # fmt: skip


def cpu_model_of(cfg: ModelConfig) -> Transformer:
    """The benchmark's fp32 model on the CPU, random weights of seed 0, prepared as ``tformer
    translate`` runs it."""
    torch.manual_seed(0)
    return for_inference(Transformer(cfg).eval(), torch.device("cpu"), None)


def random_sources(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n random sentences of 16-24 ordinary tokens, each followed by ``</s>``."""
    rng = random.Random(seed)
    return [
        [rng.randrange(4, vocab) for _ in range(rng.randint(16, 24))] + [EOS_ID] for _ in range(n)
    ]


def tformer_run(
    model: Transformer, use_cache: bool, compile: str, dtype: torch.dtype | None
) -> Run:
    """Our real search path, with ``min_len = max_len`` so that every sentence is full length."""

    def run(src: Tensor, beam: int, length: int) -> list[int]:
        cfg = DecodeConfig(beam=beam, max_len_a=0, max_len_b=length, min_len=length)
        with inference(src.device, dtype):
            return [len(nbest[0].tokens) for nbest in search(model, src, cfg, use_cache, compile)]

    return run


def floor_run(model: Transformer, compile: str, dtype: torch.dtype | None) -> Run:
    """The bare step: the same static-shape ``DecodeStep`` the search uses, fed its own argmax,
    at the search's rows (sentences x beams), without reordering, stopping rule or n-best."""

    def run(src: Tensor, beam: int, length: int) -> list[int]:
        with inference(src.device, dtype), search_threads(src.device, src.size(0) * beam):
            step = DecodeStep.of(model, compile)
            cache = step.start(src, beam, length)
            tokens = torch.full((cache.self_kv.size(2),), BOS_ID, device=src.device)
            for t in range(length):
                cache.span = min(round_up(t + 1, step.buckets.span), cache.self_kv.size(4))
                logp = step(tokens, cache)
                logp[:, EOS_ID] = float("-inf")
                tokens = logp.argmax(dim=-1)
            tokens.tolist()  # the host waits for the last step, as the search's output does
        return [length] * src.size(0)

    return run


def marian(cfg: ModelConfig) -> Any | None:
    """Hugging Face MarianMTModel with our dimensions (post-LN, ReLU, tied, sinusoidal)."""
    try:
        import transformers
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf_cfg = MarianConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers, encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function="relu", max_position_embeddings=cfg.max_positions,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    return MarianMTModel(hf_cfg).eval()


def hf_run(model: Any, static: bool = False) -> Run:
    """``generate()`` with the cache; ``min_new_tokens`` forbids ``</s>`` until ``length``.
    ``static``: its preallocated static cache (for a compiled forward)."""
    extra = {"cache_implementation": "static"} if static else {}

    def run(src: Tensor, beam: int, length: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                input_ids=src, attention_mask=src != PAD_ID, num_beams=beam, do_sample=False,
                max_new_tokens=length, min_new_tokens=length, use_cache=True, **extra,
            )  # fmt: skip
        # out: (B, 1 + generated), the decoder start token first; no row may have ended early
        assert not (out[:, 1:] == EOS_ID).any(), "Hugging Face generated </s> before min length"
        return [out.size(1) - 1] * out.size(0)

    return run


def hf_best(model: Any, src: Tensor, mode: str) -> Run | str:
    """HF at its best: the static cache with its forward compiled (``mode`` ``reduce-overhead``:
    CUDA graphs on a GPU), as Hugging Face documents for fast generation; or why not."""
    torch._dynamo.config.recompile_limit = 64  # a graph per batch shape and precision
    model.forward = torch.compile(model.forward, mode=mode, fullgraph=True)
    run = hf_run(model, static=True)
    try:
        run(src, 1, 4)
    except Exception as e:  # any failure is the reason to report
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
    return run


def ctranslate2_model(model: Any, workdir: str) -> tuple[str, list[str]] | str:
    """The converted Marian model's folder and its vocabulary, or why CTranslate2 cannot run."""
    try:
        from ctranslate2.converters import Converter
        from ctranslate2.converters.transformers import BartLoader, MarianMTLoader
    except ImportError:
        return "not installed (pip install -e '.[bench]')"
    vocab = vocab_of(model.config.vocab_size)

    class Tokenizer:  # what the loader reads from a tokenizer; no sentencepiece files needed
        eos_token, unk_token = "</s>", "<unk>"

        def get_vocab(self) -> dict[str, int]:
            return {token: i for i, token in enumerate(vocab)}

    class Loader(MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            # Marian's own <pad> is the last id and gets dropped; ours is id 0: keep every row.
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return BartLoader.get_model_spec(self, model)

    class InMemory(Converter):
        def _load(self) -> Any:
            return Loader()(model, Tokenizer())

    try:
        return InMemory().convert(os.path.join(workdir, "ct2")), vocab
    except Exception as e:  # any converter failure is the reason to report
        return f"conversion failed ({type(e).__name__}: {e})"


def tformer_ctranslate2(model: Transformer, workdir: str, quantization: str) -> str:
    """Our model's CTranslate2 export by tformer's own converter (``interop.ct2``, what
    ``tformer export --to ctranslate2`` writes), its folder; its vocabulary is ``vocab_of``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from tformer_cli.interop.ct2 import RunConverter

    ids = {token: i for i, token in enumerate(vocab_of(model.cfg.vocab_size))}
    run = SimpleNamespace(model=model, tokenizer=Tokenizer(WordLevel(ids, unk_token="<unk>")))
    converter = RunConverter(run)  # type: ignore[arg-type]  # what it reads of a LoadedRun
    return converter.convert(os.path.join(workdir, "tformer-ct2"), quantization=quantization)


def vocab_of(size: int) -> list[str]:
    """Token strings of the random models' ids, the special tokens at tformer's ids."""
    vocab = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, size)]
    assert [vocab[i] for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]
    return vocab


class Worker:
    """CTranslate2 (``compute_type``: float32, int8...) serving ``translate_batch`` from a
    process of its own, started by ``open`` and ended by ``close``; called as a ``Run``."""

    def __init__(
        self,
        path: str,
        vocab: list[str],
        threads: int,
        compute_type: str,
        env: dict[str, str],
        engine: bool = False,
    ) -> None:
        self.args = (
            (path, vocab, threads, compute_type) if engine else (path, threads, compute_type)
        )
        self.vocab, self.env = vocab, env
        self.engine = engine  # through tformer's engine (token ids in), else translate_batch
        self.conn: Connection | None = None
        self.process: multiprocessing.process.BaseProcess | None = None

    def open(self) -> str | None:
        """Start the worker; None once it has loaded the model, else why not."""
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=engine_worker if self.engine else ctranslate2_worker,
            args=(*self.args, self.env, child_conn),
            daemon=True,
        )
        self.process.start()  # a daemon: it ends with the benchmark at the latest
        ready = self.conn.recv()  # "ready" once the model is loaded, else why not
        return None if ready == "ready" else f"the worker could not load it ({ready})"

    def close(self) -> None:
        """End the worker: it returns when its pipe closes."""
        if self.conn is not None and self.process is not None:
            self.conn.close()
            self.process.join(timeout=10)
            self.conn = self.process = None

    def __call__(self, src: Tensor, beam: int, length: int) -> list[int]:
        assert self.conn is not None, "the CTranslate2 worker is not open"
        ids = [[i for i in row if i != PAD_ID] for row in src.tolist()]
        if self.engine:  # tformer's engine takes ids without </s>
            self.conn.send(([row[:-1] for row in ids], beam, length))
        else:
            self.conn.send(([[self.vocab[i] for i in row] for row in ids], beam, length))
        return self.conn.recv()


def ctranslate2_worker(
    path: str, threads: int, compute_type: str, env: dict[str, str], conn: Connection
) -> None:
    """Serve ``translate_batch`` calls from a process of its own (``env``: CTranslate2's
    settings, set before it loads).

    CTranslate2 bundles its own OpenMP runtime; once it has run in the benchmark's process,
    torch's 2-thread ops there were up to 3x slower (measured), so it runs apart. The pipe
    round trip it adds to each timed call is well under a millisecond.
    """

    def load() -> Callable[[list[list[str]], int, int], list[int]]:
        translator = translator_of(path, threads, compute_type, env)

        def run(tokens: list[list[str]], beam: int, length: int) -> list[int]:
            results = translator.translate_batch(
                tokens, beam_size=beam, max_batch_size=0, max_decoding_length=length,
                min_decoding_length=length, return_scores=False,
            )  # fmt: skip
            return [len(r.hypotheses[0]) for r in results]

        return run

    serve_calls(conn, load)


def engine_worker(
    path: str,
    vocab: list[str],
    threads: int,
    compute_type: str,
    env: dict[str, str],
    conn: Connection,
) -> None:
    """``ctranslate2_worker`` through tformer's engine: ``translate_sources`` of ids with a
    ``DecodeConfig`` (``min_len`` = the limit = ``length``), what ``--engine ctranslate2`` runs."""

    def load() -> Callable[[list[list[int]], int, int], list[int]]:
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel

        from tformer_cli.interop import engine

        translator = translator_of(path, threads, compute_type, env)
        ids = {token: i for i, token in enumerate(vocab)}
        model = engine.Ct2Model(translator, vocab, ids, 1 << 16, Path(path))
        tokenizer = Tokenizer(WordLevel(ids, unk_token="<unk>"))

        def run(sources: list[list[int]], beam: int, length: int) -> list[int]:
            cfg = DecodeConfig(beam=beam, max_len_a=0, max_len_b=length, min_len=length)
            out = engine.translate_on_ct2(model, tokenizer, sources, cfg)
            return [len(t.hypotheses[0].tokens) for _, t in out]

        return run

    serve_calls(conn, load)


def translator_of(path: str, threads: int, compute_type: str, env: dict[str, str]) -> Any:
    """CTranslate2's translator of ``path`` on the CPU, its settings ``env`` set first."""
    os.environ.update(env)
    import ctranslate2

    return ctranslate2.Translator(
        path, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads
    )


def serve_calls(conn: Connection, load: Callable[[], Callable[[Any, int, int], list[int]]]) -> None:
    """In a worker: ``load()`` (its failure told to the benchmark, rather than leave it
    waiting), then answer each ``(inputs, beam, length)`` with the generated lengths until the
    pipe closes (this precision is measured, or the benchmark ended)."""
    try:
        run = load()
    except Exception as e:  # any failure is the reason to report
        conn.send(f"{type(e).__name__}: {e}")
        return
    conn.send("ready")
    while True:
        try:
            inputs, beam, length = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(run(inputs, beam, length))


# The matrix and attention kernels: what a leaner loop around them could not make faster.
KERNELS = (
    "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
)  # fmt: skip


def step_profile(run: Run, src: Tensor, length: int) -> tuple[float, float, float]:
    """Milliseconds per greedy step: wall time (one run, no profiler), then under the profiler
    the self time of the matrix/attention kernels and of every other aten op. What the wall
    time holds beyond the two is Python and dispatch overhead (the profiler adds some)."""
    from torch.profiler import profile

    t = time.perf_counter()
    run(src, 1, length)
    wall = time.perf_counter() - t
    with profile() as prof:
        run(src, 1, length)
    events = prof.key_averages()
    kernels = sum(e.self_cpu_time_total for e in events if e.key in KERNELS)
    ops = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    per_step = 1e3 / length  # s -> ms per step; the profiler counts microseconds
    return wall * per_step, kernels * per_step / 1e6, (ops - kernels) * per_step / 1e6


@dataclass
class Precision:
    """One precision's systems: ``name``, our autocast dtype, and the models it runs."""

    name: str
    dtype: torch.dtype | None
    systems: list[System]


def precisions(args: argparse.Namespace, cfg: ModelConfig, device: torch.device) -> list[str]:
    """fp32 everywhere; int8 on CPU; bf16 on CUDA and on CPUs that compute it fast."""
    if args.precisions:
        return args.precisions.split(",")
    fast_bf16 = device.type == "cuda" or cpu_has_fast_bf16()
    return ["fp32", *(["int8"] if device.type == "cpu" else []), *(["bf16"] if fast_bf16 else [])]


def compile_modes(args: argparse.Namespace, device: torch.device, precision: str) -> list[str]:
    """Our step's ``--compile`` modes to measure: by default ``on`` (compiled ahead of time, fp32
    and bf16 autocast) and ``off`` (eager) on the CPU, ``auto`` (CUDA graphs) on a GPU."""
    default = "on,off" if device.type == "cpu" else "auto"
    modes = (args.compile or default).split(",")
    if device.type == "cpu" and precision == "int8":  # int8's packed weights run eagerly
        modes = [m for m in modes if m == "off"] or ["off"]
    return modes


def engine_system(
    args: argparse.Namespace, cfg: ModelConfig, name: str, threads: int, workdir: str,
    notes: list[str], label: str = "tformer",
) -> list[System]:  # fmt: skip
    """``tformer --engine ctranslate2`` at precision ``name``: our model (the weights of our own
    rows; ``label`` names it) exported by tformer and run by its engine in a worker process; or
    a note why not."""
    kind = {"fp32": "float32"}.get(name, name)
    torch.manual_seed(0)
    try:
        path = tformer_ctranslate2(
            Transformer(cfg).eval(), os.path.join(workdir, f"{label}-{name}"), kind
        )
    except ModuleNotFoundError as e:
        if e.name != "ctranslate2":
            raise
        return []  # CTranslate2's own row says it is not installed
    except Exception as e:  # any converter failure is the reason to report
        notes.append(f"tformer --engine ctranslate2 {name}: not measured ({type(e).__name__}: {e})")
        return []
    env = dict(kv.split("=", 1) for kv in args.ct2_env)
    worker = Worker(path, vocab_of(cfg.vocab_size), threads, kind, env, engine=True)
    return [System(f"{label} --engine ctranslate2", worker, worker=worker)]


def student_systems(
    args: argparse.Namespace, name: str, device: torch.device, threads: int, workdir: str,
    notes: list[str],
) -> list[System]:  # fmt: skip
    """A second shape beside the model, at precision ``name``: ``--student E+D:V`` (say a
    distilled student's 6+1 layers and vocabulary), through our search in each ``--compile``
    mode and through ``tformer --engine ctranslate2``, timed in the same rounds."""
    layers, _, vocab = args.student.partition(":")
    cfg = model_config(int(vocab or args.vocab), layers)
    torch.manual_seed(0)
    weights = {"bf16": torch.bfloat16, "int8": torch.qint8}.get(name)
    model = for_inference(Transformer(cfg).eval().to(device), device, weights)
    dtype = torch.bfloat16 if name == "bf16" else None
    label = f"student {layers} V{cfg.vocab_size}"
    systems = [
        System(f"{label}, {mode}", tformer_run(model, True, mode, dtype))
        for mode in compile_modes(args, device, name)
    ]
    if not args.no_ct2 and device.type == "cpu" and name != "bf16":
        systems += engine_system(args, cfg, name, threads, workdir, notes, label)
    return systems


def build(
    args: argparse.Namespace, cfg: ModelConfig, device: torch.device, threads: int, workdir: str
) -> tuple[list[Precision], list[str], list[str]]:
    """Every precision's systems, the package versions and the notes on what was not measured."""
    versions, notes, out = [f"torch {torch.__version__}"], [], []
    sample = pad(random_sources(1, args.vocab, seed=1)).to(device)
    for name in precisions(args, cfg, device):
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
        weights = {"bf16": torch.bfloat16, "int8": torch.qint8}.get(name)
        model = for_inference(model.to(device), device, weights)  # as `tformer translate` runs
        dtype = torch.bfloat16 if name == "bf16" else None  # autocast
        systems = []
        for mode in compile_modes(args, device, name):
            systems.append(System(f"tformer, {mode}", tformer_run(model, True, mode, dtype)))
            systems.append(System(f"floor, {mode}", floor_run(model, mode, dtype)))
        if name == "fp32" and not args.no_cache_row:
            systems.append(
                System("tformer, no cache", tformer_run(model, False, "off", dtype), True)
            )
        if not args.no_ct2 and device.type == "cpu" and name != "bf16":
            systems += engine_system(args, cfg, name, threads, workdir, notes)
        if args.student:
            systems += student_systems(args, name, device, threads, workdir, notes)
        hf = None if args.no_hf and args.no_ct2 else marian(cfg)  # CTranslate2 converts it
        if hf is None and not (args.no_hf and args.no_ct2):
            notes.append("Hugging Face and CTranslate2: not measured (transformers not installed)")
        if hf is not None and not args.no_ct2 and device.type == "cpu" and name != "bf16":
            converted = ctranslate2_model(hf, os.path.join(workdir, name))
            if isinstance(converted, str):
                notes.append(f"CTranslate2 {name}: not measured ({converted})")
            else:
                env = dict(kv.split("=", 1) for kv in args.ct2_env)
                worker = Worker(*converted, threads, {"fp32": "float32"}.get(name, name), env)
                systems.append(System("CTranslate2", worker, worker=worker))
        if hf is not None and not args.no_hf:
            if name == "int8":
                hf = quantize_int8(hf)
            hf = hf.to(device, torch.bfloat16 if name == "bf16" else None)
            systems.append(System("HF generate()", hf_run(hf)))
            if not args.no_hf_best and name != "int8":
                best = hf_best(marian(cfg).to(device, dtype), sample, args.hf_compile_mode)
                if isinstance(best, str):
                    notes.append(f"HF static cache + compile, {name}: not measured ({best})")
                else:
                    systems.append(System("HF static cache, compiled", best))
        out.append(Precision(name, dtype, systems))
    if any(s.name.startswith("HF") for p in out for s in p.systems):
        import transformers

        versions.append(f"transformers {transformers.__version__}")
    if any("ctranslate2" in s.name.lower() for p in out for s in p.systems):
        import ctranslate2

        versions.append(f"ctranslate2 {ctranslate2.__version__}")
    return out, versions, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 sentences at batch 1")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--sentences", type=int, default=4, help="sentences timed at batch 1")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--length", type=int, default=64, help="tokens generated per sentence")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--layers", default="3+3", help="encoder+decoder layers, e.g. 3+2")
    parser.add_argument(
        "--student", default="", metavar="E+D:V",
        help="also time this shape beside the model (e.g. 6+1:4000, a student's layers and vocab)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precisions", default="", help="e.g. fp32,int8,bf16 (default: by device)")
    parser.add_argument(
        "--compile", default="", help="our step's modes, e.g. on,off (default: on,off on CPU)"
    )
    parser.add_argument("--threads", type=int, default=0, help="0: every core (tformer_cli.setup)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate()")
    parser.add_argument("--no-hf-best", action="store_true", help="skip HF's static+compiled row")
    parser.add_argument(
        "--hf-compile-mode", default="reduce-overhead", help="torch.compile mode of HF's best row"
    )
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    parser.add_argument(
        "--ct2-env", action="append", default=[], metavar="KEY=VALUE",
        help="CTranslate2 setting, e.g. CT2_USE_MKL=1 or CT2_FORCE_CPU_ISA=AVX512 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-cache-row", action="store_true", help="skip our uncached search")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    parser.add_argument(
        "--profile", action="store_true", help="also: where a greedy step's time goes, vs HF"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.sentences = 1, 2
    setup()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    device = torch.device(args.device)
    busy_before, started = busy_cores(), time.perf_counter()

    cfg = model_config(args.vocab, args.layers)
    workdir = tempfile.TemporaryDirectory()
    variants, versions, notes = build(args, cfg, device, threads, workdir.name)
    if args.ct2_env:
        notes.append("CTranslate2 settings: " + " ".join(args.ct2_env))

    student_vocab = args.student.partition(":")[2]  # the sources fit both vocabularies
    vocab = min(args.vocab, int(student_vocab or args.vocab))
    sources = random_sources(max(args.batch, args.sentences), vocab, seed=0)
    settings = [Setting(b, n) for b in (1, args.beam) for n in (1, args.batch)]
    work = {  # each setting's batches (B, S): sentences one at a time, or one padded batch
        s: [pad([x]).to(device) for x in sources[: args.sentences]]
        if s.batch == 1
        else [pad(sources[: args.batch]).to(device)]
        for s in settings
    }
    n_sent = {s: sum(b.size(0) for b in work[s]) for s in settings}
    jobs = [  # (precision, setting, system)
        (p, s, m) for p in variants for s in settings for m in p.systems
        if s.beam == 1 or not m.greedy_only
    ]  # fmt: skip
    seconds: dict[tuple[str, Setting, str], list[float]] = {}
    for p in variants:  # one precision at a time: its CTranslate2 worker alone is alive
        measure(p, [(s, m) for q, s, m in jobs if q is p], work, args, notes, seconds)

    seconds_all, busy_after = time.perf_counter() - started, busy_cores()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    where = cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device)
    header = [
        f"{where}; CPU {cpu_model()}, {cores} cores, torch and CTranslate2 threads: {threads};"
        f" other jobs kept {busy_before:.2f} cores busy before, {busy_after:.2f} after",
        ", ".join(versions) + f"; {time.strftime('%Y-%m-%d')}",
        f"model {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, d={cfg.d_model}, h={cfg.h},"
        f" FFN {cfg.d_ff}, vocab {cfg.vocab_size}, random weights; sources 16-24 tokens + </s>"
        f" (ids below {vocab});"
        " our step: --compile on = compiled ahead of time (AOTInductor), off = eager",
        f"{args.length} tokens generated per sentence by every system; batch 1:"
        f" {args.sentences} sentences one at a time; rounds: {args.rounds} (median)",
        *notes,
    ]
    for line in header:
        print(f"# {line}")
    print()
    print("| precision | setting | system | tok/s | vs CTranslate2 | vs HF generate | vs floor |")
    print("|---|---|---|---:|---:|---:|---:|")
    median = {key: statistics.median(v) for key, v in seconds.items()}
    rows = []
    for p in variants:
        for s in settings:
            hf_t = median.get((p.name, s, "HF generate()"))
            ct2_t = median.get((p.name, s, "CTranslate2"))
            for m in p.systems:
                if (p.name, s, m.name) not in median:
                    continue
                t = median[(p.name, s, m.name)]
                floor_t = median.get((p.name, s, m.name.replace("tformer, ", "floor, ")))
                row = {
                    "precision": p.name, "setting": s.label, "beam": s.beam, "batch": s.batch,
                    "system": m.name, "tok_per_s": n_sent[s] * args.length / t,
                    "sent_per_s": n_sent[s] / t, "vs_hf": hf_t / t if hf_t else None,
                    "vs_ct2": ct2_t / t if ct2_t else None,
                    "vs_floor": floor_t / t if floor_t and m.name.startswith("tformer,") else None,
                }  # fmt: skip
                rows.append(row)
                vs = [f"{row[k]:.2f}x" if row[k] else "-" for k in ("vs_ct2", "vs_hf", "vs_floor")]
                print(f"| {p.name} | {s.label} | {m.name} | {row['tok_per_s']:,.0f} | "
                      + " | ".join(vs) + " |")  # fmt: skip
    if args.student:
        print_student(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    if args.profile:
        print_profile(variants[0].systems, work, settings, args.length)
    print(f"\n# {seconds_all:.0f} s in all")
    workdir.cleanup()


def measure(
    p: Precision,
    jobs: list[tuple[Setting, System]],
    work: dict[Setting, list[Tensor]],
    args: argparse.Namespace,
    notes: list[str],
    seconds: dict[tuple[str, Setting, str], list[float]],
) -> None:
    """Time ``jobs`` of precision ``p`` into ``seconds``: its workers opened, a warm-up of every
    batch shape (graphs, compiles, builds), interleaved rounds, its workers closed."""
    for m in {m.name: m for _, m in jobs if m.worker}.values():
        if (why := m.worker.open()) is not None:
            notes.append(f"{m.name} {p.name}: not measured ({why})")
            jobs = [(s, n) for s, n in jobs if n is not m]
    for s, m in list(jobs):
        try:
            m.run(work[s][0], s.beam, 4)
            m.run(work[s][0], s.beam, args.length)
        except Exception as e:  # a peer's path that breaks on some shape: say so, go on
            notes.append(f"{m.name}, {p.name}, {s.label}: not measured ({type(e).__name__})")
            jobs.remove((s, m))
    n_sent = {s: sum(b.size(0) for b in work[s]) for s in work}
    for r in range(args.rounds):
        for s in work:
            here = [m for t, m in jobs if t == s]
            for m in here[r % len(here) :] + here[: r % len(here)] if here else []:
                t = time.perf_counter()
                lengths = [n for src in work[s] for n in m.run(src, s.beam, args.length)]
                if work[s][0].device.type == "cuda":
                    torch.cuda.synchronize()
                seconds.setdefault((p.name, s, m.name), []).append(time.perf_counter() - t)
                if lengths != [args.length] * n_sent[s]:
                    raise SystemExit(f"{m.name} ({s.label}) generated lengths {set(lengths)}")
    for m in {m.name: m for _, m in jobs if m.worker}.values():
        m.worker.close()


def print_student(rows: list[dict[str, Any]]) -> None:
    """The ``--student`` shape's tok/s over the model's, system by system, from the same rounds."""
    print("\n| precision | setting | system | model tok/s | student tok/s | student / model |")
    print("|---|---|---|---:|---:|---:|")
    tok = {(r["precision"], r["setting"], r["system"]): r["tok_per_s"] for r in rows}
    for (precision, setting, system), student in tok.items():
        if not system.startswith("student "):
            continue
        label, _, rest = system.partition(",")  # "student 6+1 V4000, on" or "... --engine ..."
        ours = f"tformer,{rest}" if rest else system.replace(label.rsplit(" --", 1)[0], "tformer")
        if (model := tok.get((precision, setting, ours))) is not None:
            print(f"| {precision} | {setting} | {ours} | {model:,.0f} | {student:,.0f}"
                  f" | {student / model:.2f}x |")  # fmt: skip


def print_profile(
    systems: list[System], work: dict[Setting, list[Tensor]], settings: list[Setting], length: int
) -> None:
    """A table of ``step_profile`` for tformer and HF, greedy at each batch size."""
    print("\nWhere a greedy step's time goes (ms per step; kernels: matmuls and attention):\n")
    print("| setting | system | step (wall) | kernels | other ops | Python and dispatch |")
    print("|---|---|---:|---:|---:|---:|")
    for s in (s for s in settings if s.beam == 1):
        for m in systems:
            if m.name.startswith("tformer,") or m.name == "HF generate()":
                wall, kernels, ops = step_profile(m.run, work[s][0], length)
                rest = max(0.0, wall - kernels - ops)
                print(f"| {s.label} | {m.name} | {wall:.2f} | {kernels:.2f} | {ops:.2f}"
                      f" | {rest:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
