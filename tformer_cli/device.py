"""Device and precision selection: CUDA > MPS > CPU, bf16 autocast where it is fast."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from functools import cache

import torch

from tformer_cli.errors import TformerError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then the CPU; an explicit name must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TformerError("--device cuda asked for, but no CUDA GPU is available")
    if name == "mps" and not torch.backends.mps.is_available():
        raise TformerError("--device mps asked for, but Apple MPS is not available")
    if name not in ("cpu", "cuda", "mps"):
        raise TformerError(f"unknown device {name!r}: use auto, cpu, cuda or mps")
    return torch.device(name)


@cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX512-BF16), ~5x fp32 here."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


# bench_train.py on this project's CPU: bf16 autocast trains 2x faster than fp32 at d_model 256
# and 1.6x at 128; auto stays fp32 below 256, the precision the toy default was tuned in.
BF16_MIN_WIDTH = 256


def resolve_precision(
    precision: str, device: torch.device, d_model: int = 512
) -> torch.dtype | None:
    """The autocast dtype (``None`` = fp32). ``auto``: bf16 where it is fast: on CUDA GPUs
    that support it, and on CPUs with bf16 matrix units for models at least ``BF16_MIN_WIDTH``
    wide."""
    if precision == "fp32":
        return None
    if precision not in ("bf16", "auto"):
        raise TformerError(f"unknown precision {precision!r}: use fp32, bf16 or auto")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if precision == "bf16":
            raise TformerError("this GPU does not support bf16; use --precision fp32")
        return None
    fast = cpu_has_fast_bf16() and d_model >= BF16_MIN_WIDTH
    if device.type == "cpu" and (precision == "bf16" or fast):
        return torch.bfloat16
    if precision == "bf16":
        raise TformerError(f"bf16 autocast is not supported on {device.type}; use --precision fp32")
    return None  # auto on a small model, or a device without fast bf16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; weights and optimizer state stay fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def reuse_freed_memory() -> None:
    """Make glibc keep freed memory for the next allocation instead of returning it to the OS.

    By default each block over 32 MB (a batch's logits: tokens x V floats) is mmap'ed afresh
    and its pages faulted in on first touch; on this project's 2-core CPU that made every pass
    over such a tensor 2-3x slower (training 10-15% slower). A no-op off glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)  # heap-allocate blocks up to 1 GiB
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # and keep up to 1 GiB of free heap


def setup_threads() -> None:
    """One thread per core the process may run on, or ``$TFORMER_THREADS``: on a machine busy
    with other work, fewer threads than cores avoid OpenMP threads spinning against each other.
    Also ``reuse_freed_memory()``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    wanted = os.environ.get("TFORMER_THREADS", "")
    if wanted and not wanted.isdigit():
        raise TformerError(f"TFORMER_THREADS must be a whole number, not {wanted!r}")
    torch.set_num_threads(max(1, int(wanted) if wanted else cores or 1))
    reuse_freed_memory()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


@contextlib.contextmanager
def inference(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """No autograd, optional autocast."""
    with torch.inference_mode(), autocast(device, dtype):
        yield
