"""Training throughput: target tokens/s and model-FLOPs utilisation (MFU), measured in one run.

The MFU denominator is a matmul ceiling measured in the same run (best of several large
square matmuls per precision), so the ratio is comparable across noisy machines. With the
`bench` extra installed, Hugging Face `MarianMTModel` at equal dimensions is trained on the
same batches with the same loss, in two rows: as a Hugging Face loop sets it up ("as
shipped") and given our shortcuts ("tuned": same optimizer, the faster of its eager and SDPA
attention measured here, no decoding cache, the output layer on real positions only). The
systems are interleaved round by round, their order rotated every round; medians are shown,
and ``--json FILE`` keeps every figure. On CPU a last row replays the step's matrix products
alone (recorded as the step ran them): the floor any implementation of the same products
stands on, so "vs fastest HF" of that row bounds what a faster step could reach. bf16 rows
only where the hardware is fast at bf16.

    python benchmarks/bench_train.py                 # toy default + 3+3 d=256 vocab 8k
    python benchmarks/bench_train.py --steps 20 --rounds 5 --json train.json
    python benchmarks/bench_train.py --compile       # also both steps under torch.compile
    python benchmarks/bench_train.py --device cuda   # on a GPU (bf16 rows where it has bf16)
    python benchmarks/bench_train.py --models d256 --precisions bf16   # one model, one precision
    python benchmarks/bench_train.py --nproc 2       # DDP under torchrun: N processes, gloo/NCCL
    python benchmarks/bench_train.py --profile       # also: our CPU step's time by op

With ``--nproc N`` the script starts itself under ``torchrun``; each process trains a DDP copy
on every N-th batch (the same global batches as one process) and rank 0 reports the global
tokens/s, with MFU against N times its own process's matmul ceiling. HF is left out there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from tformer_cli.compile import maybe_compile
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.batching import Batch, make_batch
from tformer_cli.device import (
    autocast,
    cpu_has_fast_bf16,
    cpu_model,
    cuda_native_bf16,
    setup,
)
from tformer_cli.model import Transformer
from tformer_cli.training.distributed import ONE_PROCESS, World, init_world
from tformer_cli.training.loss import label_smoothed_loss
from tformer_cli.training.schedule import make_optimizer
from tformer_cli.training.trainer import forward_loss, train_step

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


MODELS = {  # --models: the label printed and the configuration
    "toy": ("toy default (2+2, d=128, V=1k)", ModelConfig(vocab_size=1000)),
    "d256": (
        "3+3, d=256, h=4, FFN 1024, V=8k",
        ModelConfig(
            vocab_size=8000, d_model=256, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3
        ),
    ),
}


def chosen(names: str, known: dict[str, Any]) -> list[str]:
    """The comma-separated ``names``, each one of ``known`` (else exit with a one-line error)."""
    picked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in picked if n not in known]
    if unknown or not picked:
        sys.exit(f"error: {names!r}: choose from {', '.join(known)}")
    return picked


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(dtype: torch.dtype, device: torch.device, reps: int = 5) -> float:
    """Best FLOP/s of an (n x n) @ (n x n) matmul (n = 2048 on CPU, 8192 on a GPU)."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def ceiling(precision: str, device: torch.device) -> float:
    """``matmul_ceiling`` in ``precision`` (fp32 or bf16)."""
    return matmul_ceiling(PRECISIONS[precision] or torch.float32, device)


def model_flops(cfg: ModelConfig, batches: list[Batch]) -> float:
    """Training FLOPs of one pass over ``batches``: 3x the forward matmul FLOPs (forward +
    backward), counted on real (non-pad) tokens; attention over the padded lengths S, T."""
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    total = 0.0
    for b in batches:
        S, T = b.src.size(1), b.tgt_in.size(1)
        n_src, n_tgt = int((b.src != 0).sum()), b.n_tgt_tokens
        enc = n_src * cfg.n_encoder_layers * 2 * (4 * d * d + 2 * d * f + 2 * S * d)
        dec = n_tgt * cfg.n_decoder_layers * 2 * (6 * d * d + 2 * d * f + 2 * T * d + 2 * S * d)
        cross_kv = n_src * cfg.n_decoder_layers * 2 * 2 * d * d
        total += enc + dec + cross_kv + n_tgt * 2 * d * V
    return 3 * total


def synthetic_batches(vocab: int, max_tokens: int, n: int, seed: int = 0) -> list[Batch]:
    """Batches like a length-bucketed caption corpus: ~8-30 tokens, budget ``max_tokens``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(8, 30)
        rows = max_tokens // (length + 1)
        src = [[rng.randrange(4, vocab) for _ in range(length)] for _ in range(rows)]
        tgt = [
            [rng.randrange(4, vocab) for _ in range(rng.randint(length - 3, length))] for _ in src
        ]
        out.append(make_batch(src, tgt))
    return out


@dataclass
class System:
    name: str
    step: Callable[[list[Batch], torch.dtype | None], None]  # one update of these batches
    note: str = ""  # how it was set up, for the table's footnotes


def tformer_system(
    cfg: ModelConfig, device: torch.device, world: World = ONE_PROCESS, compiled: bool = False
) -> System:
    """Our training step; under DDP each rank takes its share of every N batches. ``compiled``:
    its forward and loss under ``torch.compile(dynamic=True)``, as ``--compile on`` does."""
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    wrapped = DistributedDataParallel(model) if world.size > 1 else model
    train_cfg = TrainConfig()
    optimizer = make_optimizer(model, train_cfg)
    forward = maybe_compile(forward_loss, "on" if compiled else "off", False, "training step",
                            print_notice, dynamic=True)  # fmt: skip

    def step(group: list[Batch], dtype: torch.dtype | None) -> None:
        mine = world.shard(group)
        scale = world.size / sum(b.n_tgt_tokens for b in group)
        inputs = [b.tgt_in for b in mine]
        train_step(wrapped, optimizer, mine, inputs, scale, train_cfg, device, dtype, None, world,
                   forward)  # fmt: skip

    return System("tformer compiled" if compiled else "tformer", step)


GEMMS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)


class GemmRecorder(TorchDispatchMode):
    """Records every matrix product that reaches ATen (forward and backward, after autocast):
    the op and, per argument, a tensor's (shape, strides, dtype) or the value itself."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket in GEMMS:
            layout = [(a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                      for a in args]  # fmt: skip
            self.calls.append((func, layout, dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def gemm_floor_system(
    step: Callable[[list[Batch], torch.dtype | None], None], updates: list[list[Batch]],
    dtype: torch.dtype | None, device: torch.device,
) -> System:  # fmt: skip
    """The matrix products of ``step`` alone: every mm/addmm/bmm of one pass over ``updates``
    (shapes, strides and dtypes as the step ran them, transposed operands included), replayed
    on random operands. A floor for any implementation that computes the same products: what
    a step adds to it is element-wise work, casts, the optimizer and overhead."""
    tensors: dict[tuple[Any, ...], torch.Tensor] = {}  # one random operand per layout

    def operand(a: Any) -> Any:
        if not isinstance(a, tuple) or not isinstance(a[-1], torch.dtype):
            return a
        if a not in tensors:
            shape, stride, dt = a
            tensors[a] = torch.empty_strided(shape, stride, dtype=dt, device=device).normal_()
        return tensors[a]

    replays = {}
    for group in updates:
        with GemmRecorder() as recorder:
            step(group, dtype)
        replays[id(group)] = [
            (func, [operand(a) for a in args], kwargs) for func, args, kwargs in recorder.calls
        ]

    def replay(group: list[Batch], _dtype: torch.dtype | None) -> None:
        for func, args, kwargs in replays[id(group)]:
            func(*args, **kwargs)

    return System("tformer GEMMs only", replay, "the step's matrix products replayed alone")


def step_profile(system: System, updates: list[list[Batch]], dtype: torch.dtype | None,
                 top: int = 15) -> list[str]:  # fmt: skip
    """Where ``system``'s update goes on the CPU: the ``top`` ops by self time, in ms per
    update (one pass over ``updates`` under the torch profiler, which slows it a little)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for group in updates:
            system.step(group, dtype)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    per_update = 1e3 * len(updates)  # profiler microseconds -> ms per update
    total = sum(e.self_cpu_time_total for e in ops) / per_update
    lines = [f"{system.name}: {total:.0f} ms per update under the profiler; by op (self time):"]
    lines += [f"  {e.key:<40} {e.self_cpu_time_total / per_update:6.1f} ms"
              f" {e.count / len(updates):5.0f} calls" for e in ops[:top]]  # fmt: skip
    return lines


def print_notice(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def marian(cfg: ModelConfig, device: torch.device, attention: str | None = None) -> nn.Module:
    """Hugging Face MarianMTModel with our dimensions (post-LN, ReLU, tied, sinusoidal) and
    its ``attention`` implementation (``eager`` or ``sdpa``; None: its default)."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    extra = {} if attention is None else {"attn_implementation": attention}
    hf_cfg = MarianConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers, encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function="relu", dropout=cfg.dropout, attention_dropout=0.0,
        activation_dropout=0.0, max_position_embeddings=cfg.max_positions, pad_token_id=0,
        eos_token_id=3, decoder_start_token_id=2, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, **extra,
    )  # fmt: skip
    return MarianMTModel(hf_cfg).to(device)


def hf_shipped_system(cfg: ModelConfig, device: torch.device) -> System:
    """MarianMT as a Hugging Face training loop sets it up: ``AdamW`` with its defaults (the
    unfused loop, weight decay 0.01), its default attention kernel, logits over every padded
    position plus ``final_logits_bias`` (fp32: bf16 logits become fp32), and the decoding
    cache built in training (``use_cache`` defaults to True). Our loss on the real positions."""
    model = marian(cfg, device)
    train_cfg = TrainConfig()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(group: list[Batch], dtype: torch.dtype | None) -> None:
        model.train()
        for b in group:
            with autocast(device, dtype):
                logits = model(
                    input_ids=b.src, attention_mask=b.src != 0, decoder_input_ids=b.tgt_in
                ).logits  # (B, T, V)
            real = b.tgt_out != 0
            loss = label_smoothed_loss(logits[real], b.tgt_out[real], train_cfg.label_smoothing)
            loss = loss / b.n_tgt_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return System("HF as shipped", step, f"{model.config._attn_implementation} attention")


def hf_tuned_system(
    cfg: ModelConfig, device: torch.device, attention: str, compiled: bool = False
) -> System:
    """MarianMT given our shortcuts: our optimizer (fused AdamW, no weight decay, betas 0.9/0.98),
    ``use_cache=False``, and the output layer on the real target positions only, without
    ``final_logits_bias`` (a zero buffer that is never trained: adding it would only turn the
    bf16 logits into fp32). ``compiled``: that forward and loss under torch.compile."""
    model = marian(cfg, device, attention)
    train_cfg = TrainConfig()
    optimizer = make_optimizer(model, train_cfg)  # type: ignore[arg-type]

    def forward(
        src: torch.Tensor, y: torch.Tensor, tgt_out: torch.Tensor, real: torch.Tensor,
        dtype: torch.dtype | None,
    ) -> torch.Tensor:  # fmt: skip
        with autocast(device, dtype):
            hidden = model.model(
                input_ids=src, attention_mask=src != 0, decoder_input_ids=y, use_cache=False
            ).last_hidden_state  # (B, T, d)
            logits = model.lm_head(hidden.flatten(0, 1).index_select(0, real))  # (N, V)
        target = tgt_out.flatten().index_select(0, real)  # (N,)
        return label_smoothed_loss(logits, target, train_cfg.label_smoothing)

    fn = maybe_compile(forward, "on" if compiled else "off", False, "HF step", print_notice,
                       dynamic=True)  # fmt: skip

    def step(group: list[Batch], dtype: torch.dtype | None) -> None:
        model.train()
        for b in group:
            loss = fn(b.src, b.tgt_in, b.tgt_out, b.real, dtype) / b.n_tgt_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    name = "HF tuned compiled" if compiled else "HF tuned"
    return System(name, step, f"{attention} attention")


def timed(system: System, updates: list[list[Batch]], dtype: torch.dtype | None,
          device: torch.device, world: World = ONE_PROCESS) -> float:  # fmt: skip
    """Seconds for one pass of ``system`` over ``updates``."""
    sync(device)
    if world.size > 1:
        dist.barrier()
    t = time.perf_counter()
    for group in updates:
        system.step(group, dtype)
    sync(device)
    return time.perf_counter() - t


def faster_attention(
    cfg: ModelConfig, device: torch.device, updates: list[list[Batch]], dtype: torch.dtype | None,
    compiled: bool = False,
) -> tuple[System, dict[str, float]]:  # fmt: skip
    """The tuned MarianMT with the faster of its eager and SDPA attention, measured here
    (interleaved, best of 2 after a warm-up pass), and the seconds each took."""
    candidates = {a: hf_tuned_system(cfg, device, a, compiled) for a in ("eager", "sdpa")}
    seconds: dict[str, float] = {}
    for s in candidates.values():
        s.step(updates[0], dtype)  # warm-up (and compile)
    for _ in range(2):
        for a, s in candidates.items():
            seconds[a] = min(seconds.get(a, math.inf), timed(s, updates, dtype, device))
    best = min(seconds, key=seconds.__getitem__)
    return candidates[best], seconds


def hf_version() -> str | None:
    """The installed ``transformers`` version (the ``bench`` extra), or None."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def relaunch(nproc: int) -> int:
    """This script again under torchrun with ``nproc`` processes (its own ``--nproc`` left out:
    torchrun would take it for its ``--nproc-per-node``); the exit code."""
    args, skip = [], False
    for a in sys.argv[1:]:
        if not skip and not a.startswith("--nproc"):
            args.append(a)
        skip = a == "--nproc"
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    return subprocess.call([*run, str(nproc), __file__, *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--nproc", type=int, default=1, help="DDP processes (torchrun)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face even if installed")
    parser.add_argument(
        "--compile", action="store_true", help="also time both steps under torch.compile"
    )
    parser.add_argument(
        "--models", default="toy,d256", help="which of toy (2+2, d 128) and d256 (3+3, d 256)"
    )
    parser.add_argument(
        "--precisions", default="fp32,bf16", help="which of fp32 and bf16 (bf16 where it is fast)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also: where our CPU step's time goes, by op"
    )
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        sys.exit(relaunch(args.nproc))
    device = torch.device(args.device)
    setup()
    world = init_world(device.type)
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    elif world.size > 1:  # the processes share the cores
        torch.set_num_threads(max(1, torch.get_num_threads() // world.size))
    fast_bf16 = cuda_native_bf16(device) if device.type == "cuda" else cpu_has_fast_bf16()
    precisions = [p for p in chosen(args.precisions, PRECISIONS) if fast_bf16 or p != "bf16"]
    if not precisions:
        sys.exit(f"error: {args.device} is not fast at bf16 here, so no bf16 rows: add fp32")
    ceiling_samples = {p: [ceiling(p, device)] for p in precisions}  # one more after each model
    report = world.main
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{cpu_model()} ({os.cpu_count()} cores)"
    )
    shapes = {MODELS[m][0]: MODELS[m][1] for m in chosen(args.models, MODELS)}
    use_hf = not args.no_hf and world.size == 1 and hf_version() is not None
    rows, notes, profiles, attention_seconds = [], [], [], {}
    if args.profile and (device.type != "cpu" or world.size > 1):
        notes.append("--profile: not run (it profiles the CPU step of one process)")
    for label, cfg in shapes.items():
        batches = synthetic_batches(cfg.vocab_size, args.max_tokens, args.steps * world.size)
        batches = [b.to(device) for b in batches]
        updates = [batches[i : i + world.size] for i in range(0, len(batches), world.size)]
        flops = model_flops(cfg, batches)
        tokens = sum(b.n_tgt_tokens for b in batches)
        seconds: dict[tuple[str, str], list[float]] = {}
        for p in precisions:
            dtype = PRECISIONS[p]
            systems = [tformer_system(cfg, device, world)]
            if args.compile:
                systems.append(tformer_system(cfg, device, world, compiled=True))
            if use_hf:
                systems.append(hf_shipped_system(cfg, device))
                for compiled in (False, True) if args.compile else (False,):
                    tuned, measured = faster_attention(cfg, device, updates, dtype, compiled)
                    systems.append(tuned)
                    attention_seconds[f"{label} | {tuned.name} | {p}"] = measured
                    notes.append(f"{label}, {p}: {tuned.name} with {tuned.note} (eager"
                                 f" {measured['eager']:.2f} s, sdpa {measured['sdpa']:.2f} s"
                                 " per pass)")  # fmt: skip
            for s in systems:
                s.step(updates[0], dtype)  # warm-up (and compile)
            if device.type == "cpu" and world.size == 1:
                systems.append(gemm_floor_system(systems[0].step, updates, dtype, device))
            for r in range(args.rounds):  # interleaved, the order rotated every round
                for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
                    seconds.setdefault((s.name, p), []).append(
                        timed(s, updates, dtype, device, world)
                    )
            if args.profile and device.type == "cpu" and world.size == 1:
                profiles.append(f"{label}, {p}")
                profiles += step_profile(systems[0], updates, dtype)
            ceiling_samples[p].append(ceiling(p, device))
            median = {s.name: statistics.median(seconds[(s.name, p)]) for s in systems}
            hf_best = min((t for n, t in median.items() if n.startswith("HF")), default=None)
            order = [s for s in systems if s.name != "tformer GEMMs only"]
            systems = order + [s for s in systems if s not in order]  # the floor printed last
            for s in systems:
                t = median[s.name]
                rows.append({"model": label, "system": s.name, "setup": s.note, "precision": p,
                             "processes": world.size, "tokens_per_s": tokens / t,
                             "ms_per_update": 1000 * t / len(updates), "flops": flops / t,
                             "vs_fastest_hf": hf_best / t if hf_best else None,
                             "seconds_per_round": seconds[(s.name, p)]})  # fmt: skip
                if report:
                    print_notice(f"{label}, {p}: {s.name} {1000 * t / len(updates):.0f} ms/update")
    # MFU against the best ceiling of the run: a slow measurement is the machine's noise
    ceilings = {p: max(c) for p, c in ceiling_samples.items()}
    for row in rows:
        row["mfu"] = row.pop("flops") / (ceilings[row["precision"]] * world.size)
    if report:
        print(f"# {machine}, {world.size} process(es) x {torch.get_num_threads()} threads,"
              f" torch {torch.__version__}, transformers {hf_version() or '-'},"
              f" {time.strftime('%Y-%m-%d')}")  # fmt: skip
        for p, c in ceiling_samples.items():
            print(
                f"# matmul ceiling {p} (one process): {max(c) / 1e9:,.0f} GFLOP/s, the best of"
                f" {len(c)} measurements through the run ({min(c) / 1e9:,.0f} the lowest)"
            )
        print("| model | system | precision | target tok/s | ms/update | MFU | vs fastest HF |")
        print("|---|---|---|---:|---:|---:|---:|")
        for row in rows:
            ratio = f"{row['vs_fastest_hf']:.2f}x" if row["vs_fastest_hf"] else "-"
            print(f"| {row['model']} | {row['system']} | {row['precision']}"
                  f" | {row['tokens_per_s']:,.0f} | {row['ms_per_update']:.0f} | {row['mfu']:.1%}"
                  f" | {ratio} |")  # fmt: skip
        for n in notes + profiles:
            print(f"# {n}")
    if report and args.json:
        meta = {"machine": machine, "cpu": cpu_model(), "cores": os.cpu_count(),
                "torch": torch.__version__, "transformers": hf_version(),
                "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(),
                "device": device.type, "processes": world.size, "steps": args.steps,
                "rounds": args.rounds, "max_tokens": args.max_tokens,
                "matmul_ceiling_flops": ceilings, "matmul_ceiling_samples": ceiling_samples,
                "hf_attention_seconds": attention_seconds}  # fmt: skip
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    if world.size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
