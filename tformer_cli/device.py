"""Device and precision selection: CUDA > MPS > CPU, bf16 autocast where the hardware is fast
at it, the name of the precision in effect, a hint on running out of GPU memory, and the number
of CPU threads (all cores, or those other processes leave idle)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import time
from collections.abc import Iterator
from functools import cache

import torch

from tformer_cli.compile import cache_root
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


def cpuinfo() -> str:
    """Linux's ``/proc/cpuinfo``; empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


@cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX512-BF16)."""
    flags = cpuinfo()
    return "amx_bf16" in flags or "avx512_bf16" in flags


# The narrowest model that ``auto`` trains in bf16: below it the GEMMs are too small for bf16 to
# repay its casts (docs/speed.md), and the toy default stays fp32.
BF16_MIN_WIDTH = 256


def cuda_native_bf16(device: torch.device | None = None) -> bool:
    """True where the GPU computes bf16 and TF32 in hardware (Ampere or newer); older cards
    only emulate bf16, though ``torch.cuda.is_bf16_supported()`` says True there too."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_precision(
    precision: str, device: torch.device, d_model: int = 512, inference: bool = False
) -> torch.dtype | None:
    """The compute dtype: ``None`` = fp32, bf16 (autocast), or ``torch.qint8`` (int8 Linear
    weights, CPU ``inference`` only). ``auto``: bf16 on GPUs with bf16 hardware and on CPUs
    with bf16 matrix units for models ``BF16_MIN_WIDTH`` wide or more."""
    if precision == "fp32":
        return None
    if precision == "int8" and inference:
        if device.type != "cpu":
            raise TformerError("int8 runs on the CPU; on a GPU use --precision bf16")
        return torch.qint8
    if precision not in ("bf16", "auto"):
        named = "fp32, bf16, int8 (CPU) or auto" if inference else "fp32, bf16 or auto"
        raise TformerError(f"unknown precision {precision!r}: use {named}")
    if device.type == "cuda":
        if cuda_native_bf16(device) or (precision == "bf16" and torch.cuda.is_bf16_supported()):
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


DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.qint8: "int8"}


def precision_name(device: torch.device, dtype: torch.dtype | None) -> str:
    """The precision matrix products run in, for logs: ``<dtype> autocast``, ``int8``, ``tf32``
    (fp32 tensors, CUDA matmuls on TF32 tensor cores) or ``fp32``."""
    if dtype == torch.qint8:
        return "int8"
    if dtype is not None:
        return f"{DTYPE_NAMES.get(dtype, str(dtype))} autocast"
    tf32 = (
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    )
    if device.type == "cuda" and tf32 and cuda_native_bf16(device):
        return "tf32"
    return "fp32"


@contextlib.contextmanager
def oom_hint(max_tokens: int | None = None) -> Iterator[None]:
    """Running out of memory as a one-line error that suggests a smaller ``--max-tokens``."""
    try:
        yield
    except (torch.cuda.OutOfMemoryError, MemoryError, RuntimeError) as e:
        gpu = isinstance(e, torch.cuda.OutOfMemoryError)
        if not (gpu or isinstance(e, MemoryError) or "can't allocate memory" in str(e)):
            raise  # torch's CPU allocator raises a plain RuntimeError
        asked = re.search(r"[Tt]ried to allocate ([\d.]+ \w+)", str(e))
        detail = f" (tried to allocate {asked.group(1)})" if asked else ""
        now = f" (now {max_tokens})" if max_tokens is not None else ""
        where = "GPU memory" if gpu else "memory"
        raise TformerError(f"out of {where}{detail}: try a smaller --max-tokens{now}") from None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; none for fp32 and int8."""
    if dtype is None or dtype == torch.qint8:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def c_library() -> ctypes.CDLL | None:
    """The C library, where it is glibc's ``libc.so.6``; else None."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def reuse_freed_memory() -> None:
    """Make glibc keep freed memory for the next allocation: else each large block (a batch's
    logits) is mmap'ed afresh and its pages faulted in on first touch (docs/speed.md)."""
    libc = c_library()
    if libc is None:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)  # heap-allocate blocks up to 1 GiB
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # and keep up to 1 GiB of free heap


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33+): the heap's totals, in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc with ``malloc_trim`` and ``mallinfo2``, else None."""
    libc = c_library()
    usable = libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallinfo2")
    return libc if usable else None


PROC_STATUS = "/proc/self/status"


def anonymous_memory_mib() -> float | None:
    """The anonymous part of the resident memory now in MiB (Linux's ``RssAnon``: the heap,
    tensors; not the mapped files other processes share); None where ``/proc`` does not say."""
    try:
        with open(PROC_STATUS, encoding="ascii") as f:
            line = next((x for x in f if x.startswith("RssAnon:")), "")
    except OSError:
        return None
    fields = line.split()
    return int(fields[1]) / 2**10 if len(fields) == 3 and fields[1].isdigit() else None


# Free heap memory (MiB) that ``release_freed_memory`` leaves resident for the next updates.
KEEP_FREE = 768


def release_freed_memory(keep: float = 0.0) -> bool:
    """Give the pages of glibc's free heap blocks back to the OS (``malloc_trim``) where the
    anonymous memory exceeds what is allocated by more than ``keep`` MiB; whether it did. Else
    blocks that varying batch shapes leave unused would stay resident for good."""
    libc, anonymous = glibc(), anonymous_memory_mib()
    if libc is None or anonymous is None:
        return False
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    if anonymous - (info.uordblks + info.hblkhd) / 2**20 <= keep:
        return False
    libc.malloc_trim(0)
    return True


_process_wide = False  # set by setup(): the process asked for tformer's process-wide settings
TRAINING_KERNEL_CACHE = 32  # oneDNN kernels (matmul shapes) kept while training


def bound_kernel_cache() -> None:
    """Training's oneDNN kernel cache: ``TRAINING_KERNEL_CACHE`` shapes unless
    ``$ONEDNN_PRIMITIVE_CACHE_CAPACITY`` says otherwise; the default's churn of kernels for
    ever-changing batch shapes fragmented glibc's heap (docs/training.md, "Memory"). oneDNN
    reads it at its first kernel. Nothing unless ``setup()`` was called."""
    if _process_wide:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(TRAINING_KERNEL_CACHE))


def setup() -> None:
    """Apply the process-wide settings the ``tformer`` command runs with (``setup_threads``,
    ``bound_kernel_cache`` in training, Inductor's cache kept). Until it is called, importing,
    loading, training or evaluating changes none of them: a library user calls it once, first."""
    global _process_wide
    _process_wide = True
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    setup_threads()


def setup_threads() -> None:
    """One torch thread per core the process may run on, or ``$TFORMER_THREADS``; glibc's
    ``reuse_freed_memory``; TF32 matmuls on GPUs with TF32 units. Nothing before ``setup()``."""
    if not _process_wide:
        return
    cores = len(allowed_cpus())
    wanted = os.environ.get("TFORMER_THREADS", "")
    if wanted and not wanted.isdigit():
        raise TformerError(f"TFORMER_THREADS must be a whole number, not {wanted!r}")
    torch.set_num_threads(max(1, int(wanted) if wanted else cores))
    reuse_freed_memory()
    if torch.cuda.is_available() and cuda_native_bf16():  # no TF32 units before Ampere
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def allowed_cpus() -> set[int]:
    """The ids of the CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


PROC_STAT = "/proc/stat"


def cpu_ticks() -> dict[int, tuple[int, int]] | None:
    """Per CPU id, its (busy, total) ticks since boot (``/proc/stat``); ``None`` off Linux."""
    try:
        with open(PROC_STAT, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks: dict[int, tuple[int, int]] = {}
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
            t = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            ticks[int(name[3:])] = (sum(t) - t[3] - t[4], sum(t))
    return ticks or None


def busy_cores(seconds: float = 0.15) -> float | None:
    """How many of this process's CPUs other processes keep busy over ``seconds`` (``cpu_ticks``
    less this process's own CPU time); ``None`` where ``cpu_ticks`` has nothing to say."""
    before, own_before = cpu_ticks(), os.times()
    if before is None:
        return None
    time.sleep(seconds)
    after, own_after = cpu_ticks(), os.times()
    if after is None:
        return None
    cpus = [c for c in allowed_cpus() if c in before and c in after]
    cpus = cpus or sorted(set(before) & set(after))
    busy = sum(after[c][0] - before[c][0] for c in cpus)
    total = sum(after[c][1] - before[c][1] for c in cpus)
    own_seconds = own_after.user + own_after.system - own_before.user - own_before.system
    own = own_seconds * os.sysconf("SC_CLK_TCK")  # in ticks, as /proc/stat counts
    return max(0.0, (busy - own) / max(1, total) * len(cpus))


def free_cores() -> int:
    """The cores of this process not busy with other work now (``busy_cores``; else the load
    average, else none), at least 1: a thread waiting for a busy core stalls decoding's loop."""
    cores = len(allowed_cpus())
    busy = busy_cores()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average on this platform
            busy = 0.0
    return max(1, min(cores, round(cores - busy)))


@contextlib.contextmanager
def inference(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """No autograd, optional autocast."""
    with torch.inference_mode(), autocast(device, dtype):
        yield


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows (for benchmarks)."""
    for line in cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
