"""Tests for tformer_cli.device: the CUDA precision decisions (on CPU, with the CUDA queries
monkeypatched), the name of the precision in effect, oneDNN's kernel cache, the out-of-memory
hint, and the thread count from a sample of /proc/stat (simulated idle and busy machines)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import checkout_first_env
from tformer_cli import device
from tformer_cli.device import (
    busy_cores,
    cpu_ticks,
    free_cores,
    oom_hint,
    precision_name,
    resolve_precision,
    setup_threads,
)
from tformer_cli.errors import TformerError

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``gpu(capability, emulated_bf16=True)``: pretend a CUDA GPU of that compute capability;
    ``torch.cuda.is_bf16_supported()`` says True on it by default, as it does (emulation) on
    V100 and T4."""

    def make(capability: tuple[int, int], emulated_bf16: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True: capability >= (8, 0) or emulated_bf16,
        )

    return make


@pytest.fixture
def matmul_precision() -> Iterator[None]:
    """Restore torch's global fp32 matmul precision (TF32 switch) after the test."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


# ---------------------------------------------------------------------------- precision
@pytest.mark.parametrize(
    ("capability", "auto"),
    [((7, 0), None), ((7, 5), None), ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)],
)
def test_auto_takes_bf16_only_on_gpus_with_bf16_hardware(gpu, capability, auto):
    """V100 (7.0) and T4 (7.5) only emulate bf16, slower than fp32: auto stays fp32 there."""
    gpu(capability)
    assert resolve_precision("auto", CUDA) is auto
    assert resolve_precision("fp32", CUDA) is None


def test_bf16_asked_for_by_name_runs_where_the_gpu_can_at_all(gpu):
    gpu((7, 0), emulated_bf16=True)
    assert resolve_precision("bf16", CUDA) is torch.bfloat16
    gpu((6, 1), emulated_bf16=False)
    with pytest.raises(TformerError, match="does not support bf16; use --precision fp32"):
        resolve_precision("bf16", CUDA)
    assert resolve_precision("auto", CUDA) is None


@pytest.mark.usefixtures("matmul_precision")
@pytest.mark.parametrize(("capability", "tf32"), [((7, 0), False), ((8, 0), True)])
def test_tf32_is_switched_on_only_where_the_gpu_has_it(gpu, monkeypatch, capability, tf32):
    gpu(capability)
    monkeypatch.setattr(device, "reuse_freed_memory", lambda: None)
    monkeypatch.setattr(device, "_process_wide", True)  # as after setup()
    torch.set_float32_matmul_precision("highest")
    setup_threads()
    assert (torch.get_float32_matmul_precision() != "highest") is tf32
    assert precision_name(CUDA, None) == ("tf32" if tf32 else "fp32")


@pytest.mark.usefixtures("matmul_precision")
def test_precision_name_says_what_matmuls_run_in(gpu):
    torch.set_float32_matmul_precision("highest")
    assert precision_name(CPU, None) == "fp32"
    assert precision_name(CPU, torch.bfloat16) == "bf16 autocast"
    gpu((8, 0))
    assert precision_name(CUDA, None) == "fp32"
    assert precision_name(CUDA, torch.bfloat16) == "bf16 autocast"
    torch.backends.cuda.matmul.allow_tf32 = True
    assert precision_name(CUDA, None) == "tf32"
    assert precision_name(CPU, None) == "fp32"  # TF32 is a CUDA matmul setting
    gpu((7, 5))
    assert precision_name(CUDA, None) == "fp32"  # no TF32 units before Ampere


# ---------------------------------------------------------------------------- out of memory
OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of"
    " which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.03 GiB memory in"
    " use. If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_out_of_gpu_memory_becomes_a_one_line_hint():
    with pytest.raises(TformerError) as info, oom_hint(max_tokens=4096):
        raise torch.cuda.OutOfMemoryError(OOM)
    assert str(info.value) == (
        "out of GPU memory (tried to allocate 2.00 GiB): try a smaller --max-tokens (now 4096)"
    )
    bare = r"^out of GPU memory: try a smaller --max-tokens$"
    with pytest.raises(TformerError, match=bare), oom_hint():
        raise torch.cuda.OutOfMemoryError("out of memory")


def test_other_errors_pass_through_oom_hint():
    with pytest.raises(RuntimeError, match="shape mismatch"), oom_hint(4096):
        raise RuntimeError("shape mismatch")
    with oom_hint(4096):
        pass


# ---------------------------------------------------------------------------- threads
def stat_text(ticks: dict[int, list[int]]) -> str:
    """A /proc/stat with the given per-CPU fields (user nice system idle iowait irq softirq
    steal guest guest_nice) and the aggregate line."""
    total = [sum(col) for col in zip(*ticks.values(), strict=True)]
    lines = ["cpu  " + " ".join(map(str, total))]
    lines += [f"cpu{c} " + " ".join(map(str, t)) for c, t in ticks.items()]
    return "\n".join([*lines, "intr 12345 0 0", "ctxt 999", "btime 1700000000", ""])


def test_cpu_ticks_reads_busy_and_total_per_cpu(monkeypatch, tmp_path):
    path = tmp_path / "stat"
    path.write_text(
        stat_text({0: [10, 1, 5, 80, 4, 0, 0, 0, 7, 0], 3: [0, 0, 0, 100, 0, 0, 0, 2, 0, 0]})
    )
    monkeypatch.setattr(device, "PROC_STAT", str(path))
    # busy: user + nice + system + irq + softirq + steal (guest is inside user)
    assert cpu_ticks() == {0: (16, 100), 3: (2, 102)}
    monkeypatch.setattr(device, "PROC_STAT", str(tmp_path / "missing"))  # macOS, Windows
    assert cpu_ticks() is None


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``machine(busy, own=0.0, cpus=(0, 1))``: over one sample of 100 ticks per CPU, CPU c is
    busy ``busy[c]`` of them, this process used ``own`` CPU-seconds of them (the clock ticks
    100 times a second); the sleep between the two samples takes no time."""

    def make(busy: list[int], own: float = 0.0, cpus: tuple[int, ...] = (0, 1)) -> None:
        before = {c: (1000, 5000) for c in range(len(busy))}
        samples = iter([before, {c: (1000 + b, 5100) for c, b in enumerate(busy)}])
        times = iter(
            [SimpleNamespace(user=1.0, system=0.5), SimpleNamespace(user=1.0 + own, system=0.5)]
        )
        monkeypatch.setattr(device, "cpu_ticks", lambda: next(samples))
        monkeypatch.setattr(device.os, "times", lambda: next(times))
        monkeypatch.setattr(device.os, "sysconf", lambda name: 100)
        monkeypatch.setattr(device, "allowed_cpus", lambda: set(cpus))
        monkeypatch.setattr(device, "time", SimpleNamespace(sleep=lambda s: None))
        monkeypatch.setattr(device.os, "getloadavg", lambda: (2.0, 2.0, 2.0), raising=False)

    return make


@pytest.mark.parametrize(
    ("busy", "own", "threads"),
    [
        ([0, 0], 0.0, 2),  # idle: a training run that ended seconds ago is not counted
        ([30, 10], 0.0, 2),  # 0.4 cores busy: not worth giving up a thread
        ([100, 5], 0.0, 1),  # another job holds a core: leave it alone
        ([100, 100], 0.0, 1),  # both busy: still one thread
        ([100, 40], 1.2, 2),  # only this process was busy (its own 1.2 cores of 1.4)
    ],
)
def test_free_cores_counts_what_other_processes_keep_busy_now(machine, busy, own, threads):
    machine(busy, own)  # the 1-minute load average says 2.0: both cores busy, a while ago
    assert free_cores() == threads


def test_busy_cores_counts_only_the_cpus_this_process_may_use(machine):
    machine([100, 100, 0, 0], cpus=(2, 3))
    assert busy_cores() == 0.0
    machine([100, 100, 50, 0], cpus=(1, 2))
    assert busy_cores() == pytest.approx(1.5)


def test_without_proc_stat_the_load_average_decides(monkeypatch):
    monkeypatch.setattr(device, "cpu_ticks", lambda: None)
    monkeypatch.setattr(device, "allowed_cpus", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(device.os, "getloadavg", lambda: (1.2, 0.5, 0.1), raising=False)
    assert busy_cores() is None
    assert free_cores() == 3

    def no_load_average() -> tuple[float, float, float]:
        raise OSError("no load average")

    monkeypatch.setattr(device.os, "getloadavg", no_load_average)
    assert free_cores() == 4


def test_int8_is_an_inference_precision_on_the_cpu_only():
    assert resolve_precision("int8", CPU, inference=True) == torch.qint8
    assert precision_name(CPU, torch.qint8) == "int8"
    with pytest.raises(TformerError, match="int8 runs on the CPU; on a GPU use --precision bf16"):
        resolve_precision("int8", CUDA, inference=True)
    with pytest.raises(TformerError, match=r"use fp32, bf16 or auto$"):  # training: no int8
        resolve_precision("int8", CPU)
    with pytest.raises(TformerError, match=r"use fp32, bf16, int8 \(CPU\) or auto$"):
        resolve_precision("int4", CPU, inference=True)


def test_setup_threads_changes_nothing_until_setup_is_called(monkeypatch):
    monkeypatch.setenv("TFORMER_THREADS", "3")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(device, "reuse_freed_memory", lambda: None)
    setup_threads()  # a library's process: left as it is
    assert torch.get_num_threads() == 1 and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setattr(device, "_process_wide", False)  # undone after the test
    device.setup()
    assert torch.get_num_threads() == 3
    # oneDNN's kernel cache keeps its bounded default: a larger one grew by GBs in long runs
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")


def test_the_command_line_reports_an_unreadable_tformer_threads_where_it_did(tmp_path, make_run):
    """``setup()`` at the entry point: --version still works; loading a run says why not."""
    run_dir, _ = make_run(tmp_path / "run")
    env = checkout_first_env(TFORMER_THREADS="many")

    def tformer(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tformer_cli", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert tformer("--version").returncode == 0
    failed = tformer("translate", "-m", str(run_dir), "red")
    assert failed.returncode == 1
    assert failed.stderr.strip() == "Error: TFORMER_THREADS must be a whole number, not 'many'"


RELEASE_PROBE = """
import ctypes
from tformer_cli.device import anonymous_memory_mib, release_freed_memory, reuse_freed_memory
reuse_freed_memory()  # freed blocks stay resident for reuse
block = ctypes.create_string_buffer(256 << 20)  # touched: resident
del block
kept = anonymous_memory_mib()
print(release_freed_memory(keep=1024), kept - anonymous_memory_mib())  # under what it may keep
print(release_freed_memory(keep=64), kept - anonymous_memory_mib())
"""


def test_release_freed_memory_gives_back_what_is_kept_over_its_bound():
    if device.glibc() is None or device.anonymous_memory_mib() is None:
        pytest.skip("glibc and /proc: Linux")
    out = subprocess.run(
        [sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "False" and float(out[1]) < 32
    assert out[2] == "True" and float(out[3]) > 200  # MiB of the 256 freed


def test_training_bounds_onednns_kernel_cache_unless_told_or_a_library(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # restored after the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setattr(device, "_process_wide", False)
    device.bound_kernel_cache()  # a library's process: left as it is
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    monkeypatch.setattr(device, "_process_wide", True)
    device.bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(device.TRAINING_KERNEL_CACHE)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "4096")  # the user's own wins
    device.bound_kernel_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "4096"
