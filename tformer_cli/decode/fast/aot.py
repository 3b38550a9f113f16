"""The decode step compiled ahead of time for the CPU (AOTInductor): ``torch.export`` of the eager
step, then a shared library that runs it with no Python between its kernels.

One artifact serves a model, a number of beams and a precision (fp32, or bf16 autocast as the
eager step runs it, the weights' casts folded into bf16 constants): rows, lengths and the
attended ``span`` are dynamic dimensions; for one beam it also makes greedy's choice
(``greedy.advance``). Each comes in two builds: for few rows (Inductor's own matrix kernels) or
``many`` (MKL's, explicit attention). Artifacts are kept in ``cache_root()/steps``
(``~/.cache/tformer/steps``), named by a key of the weights' bytes, the build, the precision,
torch, the CPU's flags and the thread count, so that a stale one is never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
from torch.export import Dim

from tformer_cli.compile import cache_root
from tformer_cli.decode.fast.buckets import Eager
from tformer_cli.decode.greedy import advance, ban_eos
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.model import DecoderCache, Transformer

STEP_FORMAT = 3  # bump when the exported step's inputs or outputs change
BUILDS = "builds.json"  # the last build's seconds by step shape, for ``auto``
# Inductor's options by ``many``: weights folded in as constants; for few rows, its own tuned
# matrix kernels (``max_autotune``), which lose to MKL's at many
INDUCTOR = {False: {"freezing": True, "max_autotune": True}, True: {"freezing": True}}  # by many
QUIET = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor would call (``$CXX`` or g++), if it is installed."""
    return shutil.which(torch._inductor.config.cpp.cxx[-1])


def cpu_flags() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``), else its architecture's name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), platform.machine())
    except OSError:
        return platform.machine()


def autocast_dtype() -> torch.dtype | None:
    """The CPU's autocast dtype where autocast is on (the step is built to compute in it), else
    None (fp32)."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def supported(model: Transformer) -> bool:
    """Whether the step of ``model`` can be built: fp32 weights on the CPU, in fp32 or under
    bf16 autocast (int8's packed weights run eagerly)."""
    fp32 = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    int8 = any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
    return fp32 and not int8 and autocast_dtype() in (None, torch.bfloat16)


def step_key(model: Transformer, beams: int, weights: bool = True, many: bool = False) -> str:
    """What an artifact is built from: weights, beams, build, autocast dtype, threads, torch and
    CPU flags; ``weights=False``: all but the weights' bytes (``build_seconds``)."""
    h = hashlib.sha256()
    build = (INDUCTOR[many], many, str(autocast_dtype()))
    meta = (STEP_FORMAT, *build, beams, torch.get_num_threads(), torch.__version__, cpu_flags())
    h.update(repr(meta).encode())
    for name, t in model.state_dict().items():
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        if weights:
            h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def build_times() -> dict:
    """``steps/builds.json``: the last build's seconds by ``step_key`` without the weights."""
    try:
        times = json.loads((cache_root() / "steps" / BUILDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return times if isinstance(times, dict) else {}


def build_seconds(model: Transformer, beams: int, many: bool = False) -> float | None:
    """How long the last build of a step of this shape took here; None if none was timed."""
    try:
        return float(build_times()[step_key(model, beams, weights=False, many=many)])
    except (ValueError, KeyError, TypeError):
        return None


def record_build(model: Transformer, beams: int, seconds: float, many: bool = False) -> None:
    """Keep a build's time for ``build_seconds`` (a lost race between processes loses a time)."""
    times = {**build_times(), step_key(model, beams, weights=False, many=many): round(seconds, 1)}
    path = cache_root() / "steps" / BUILDS
    with contextlib.suppress(OSError, TformerError):  # a full disk loses the time, no more
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(times, indent=1), durable=False)


class _Layers(tuple):
    """The decoder layers' K, V buffers, each its own input of the exported step (export fixes
    the sizes of a mutated view): ``self_kv.unbind(0)`` gives them back as they are."""

    def unbind(self, dim: int) -> tuple[Tensor, ...]:
        assert dim == 0
        return tuple(self)


class StepModule(nn.Module):
    """The ``eager`` step as a module to export: tokens (R,) and the cache's tensors -> log-probs
    (R, V), the buffers and ``pos`` written in place; ``span``'s length is the slots attended to.
    ``greedy``: greedy's row state (alive, logprob, steps, limits (R,), min_len), or () for
    several beams; given, ``advance``'s new state follows the log-probs. ``dtype``: the
    autocast dtype the step computes in (None: fp32), whose casts of the weights the build folds
    into constants."""

    def __init__(self, model: Transformer, eager: Eager, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.eager = model, eager  # the model's weights: the module's parameters
        self.dtype = dtype

    def forward(
        self,
        tokens: Tensor,
        cross_kv: Tensor,
        src_mask: Tensor,
        pos: Tensor,
        span: Tensor,
        greedy: tuple[Tensor, ...],
        *self_kv: Tensor,
    ) -> Tensor | tuple[Tensor, ...]:
        cache = DecoderCache(_Layers(self_kv), cross_kv, src_mask, pos, span.size(0))  # type: ignore[arg-type]
        with torch.autocast("cpu", self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            logp = self.eager(tokens, cache, None)  # (R, V) fp32; pos advanced: the t of y_t
        if not greedy:
            return logp
        alive, logprob, steps, limits, min_len = greedy
        best_logp, best = ban_eos(logp, pos <= min_len).max(dim=-1)  # (R,), (R,)
        return logp, *advance(best, best_logp, alive, logprob, steps, limits, pos)


def greedy_inputs(rows: int) -> tuple[Tensor, ...]:
    """``StepModule``'s greedy state for ``rows`` rows, none alive: for callers of the log-probs
    only."""
    alive = torch.zeros(rows, dtype=torch.bool)
    steps = torch.zeros(rows, dtype=torch.long)
    return alive, torch.zeros(rows), steps, steps, torch.zeros((), dtype=torch.long)


def export_step(
    model: Transformer, eager: Eager, beams: int, many: bool = False
) -> torch.export.ExportedProgram:
    """``StepModule(model, eager)`` exported for ``beams`` rows per sentence, every length
    dynamic, in the autocast dtype in effect (its example cache made in it); ``many``: attention
    as the explicit ops, which beat the fused kernel at many rows."""
    sentences, n = Dim("sentences"), model.cfg.max_positions
    rows = sentences if beams == 1 else beams * sentences
    S, T, span = Dim("S", max=n), Dim("T", max=n), Dim("span", max=n)
    with torch.no_grad():
        src = torch.full((2, 3), 4)  # 2 sentences, 3 slots: sizes export keeps symbolic
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, 3, beams)
    R = cache.self_kv.size(2)
    greedy = greedy_inputs(R) if beams == 1 else ()
    args = (
        torch.zeros(R, dtype=torch.long),
        cache.cross_kv,
        src_mask,
        cache.pos,
        torch.empty(2),
        greedy,
        *cache.self_kv.unbind(0),
    )
    dims = (
        {0: rows},
        {2: sentences, 4: S},
        {0: sentences, 3: S},
        None,
        {0: span},
        tuple({0: rows} for _ in greedy[:4]) + (None,) * len(greedy[4:]),  # min_len: 0-dim
        tuple({1: rows, 3: T} for _ in model.decoder),  # *self_kv, one input a layer
    )
    layers = [m for kind in model.attention_modules().values() for m in kind]
    for m in layers:
        m.explicit = many  # every attention sublayer through the explicit ops, while exported
    module = StepModule(model, eager, autocast_dtype()).eval()
    try:  # autocast inside the module, where export records it, not around it
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            return torch.export.export(module, args, dynamic_shapes=dims)
    finally:
        for m in layers:
            m.explicit = False


def build(model: Transformer, eager: Eager, beams: int, path: Path, many: bool = False) -> None:
    """Export and compile the step into ``path``, whole or not at all, in an Inductor cache of
    the build's own: an interrupted build leaves no half-written kernel for the next one."""
    program = export_step(model, eager, beams, many)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=path.parent) as tmp,
        temporary_cache_dir(str(Path(tmp) / "inductor")),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # Inductor's own deprecation notices
        built = torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(Path(tmp) / path.name),
            inductor_configs={**INDUCTOR[many], **QUIET},
        )
        os.replace(built, path)


class AotStep:
    """The compiled step: ``step(tokens, cache)`` -> log-probs (R, V) as the eager step; for one
    beam, ``step.greedy(tokens, cache, state)`` also returns ``advance``'s new state."""

    def __init__(self, path: Path, beams: int) -> None:
        self.loader = torch._inductor.aoti_load_package(str(path)).loader
        self.slots = torch.empty(0)  # sliced to the span: its length is the span
        self.fuses_greedy = beams == 1
        self.idle: tuple[Tensor, ...] = ()  # greedy_inputs for callers of the log-probs only

    def __call__(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        if self.fuses_greedy and (not self.idle or self.idle[0].numel() != tokens.numel()):
            self.idle = greedy_inputs(tokens.numel())
        return self.greedy(tokens, cache, self.idle)[0]

    def greedy(
        self, tokens: Tensor, cache: DecoderCache, state: tuple[Tensor, ...]
    ) -> list[Tensor]:
        """log-probs (R, V), then (one beam) ``advance``'s token, logprob, steps and alive."""
        if self.slots.numel() < cache.span:
            self.slots = torch.empty(cache.self_kv.size(4))
        span = self.slots[: cache.span]
        # the library reads its inputs with the export's (contiguous) strides: the search's
        # tokens are a column of its outputs; the cache's tensors are contiguous already
        inputs = [tokens.contiguous(), cache.cross_kv, cache.src_mask, cache.pos, span, *state]
        return self.loader.boxed_run([*inputs, *cache.self_kv.unbind(0)])


def artifact(model: Transformer, beams: int, many: bool = False) -> Path:
    """Where the step of ``model`` for ``beams`` (and few rows or ``many``) is kept."""
    name = f"{step_key(model, beams, many=many)}-beams{beams}-{'many' if many else 'few'}.pt2"
    return cache_root() / "steps" / name


def load_step(
    path: Path, model: Transformer, eager: Eager, beams: int, build_missing: bool,
    many: bool = False,
) -> tuple[AotStep | None, float]:  # fmt: skip
    """The step kept at ``path``, built first if missing and ``build_missing`` (else None), and
    the seconds building took (0 if kept)."""
    seconds = 0.0
    if not path.exists():
        if not build_missing:
            return None, 0.0
        start = time.perf_counter()
        build(model, eager, beams, path, many)
        seconds = time.perf_counter() - start
        record_build(model, beams, seconds, many)
    return AotStep(path, beams), seconds
