"""What a run keeps on disk and between processes: its progress (``TrainState``, saved in
``last.pt`` with the weights and the optimizer), the trimming of what a killed run wrote past
its last save, the signals that stop it cleanly, the kill points of the crash-safety tests, and
the peak memory (and its anonymous part) its last log record keeps.

Crash safety: ``last.pt`` is saved at every validation and at least every ``--save-every``
minutes, atomically, so a kill at any moment loses at most the work since the last save, and
``--resume`` replays the lost updates bit for bit on CPU: the batches are a function of (seed,
epoch) and the random numbers of each micro-batch (dropout, scheduled sampling) of (seed, update,
micro-batch), so no generator state has to be saved, and the same holds under DDP with any
number of processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tformer_cli.checkpoint import CHECKPOINTS, checkpoint_paths, load_state, torch_save
from tformer_cli.device import anonymous_memory_mib
from tformer_cli.files import atomic_write, atomic_write_text
from tformer_cli.training.budget import Budget

KILL_AT = "TFORMER_TEST_KILL_AT"  # tests: EVENT:N, see KillPoints


@dataclass
class TrainState:
    """Where training stands; saved in ``last.pt`` so ``--resume`` continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_bleu: float = -1.0
    best_step: int = 0
    stale_validations: int = 0
    elapsed: float = 0.0
    tgt_tokens: int = 0
    skipped: int = 0  # updates skipped for a non-finite loss or gradient
    skipped_in_a_row: int = 0
    budget: Budget = field(default_factory=Budget)  # --max-minutes as a number of updates

    def as_saved(self) -> dict[str, Any]:
        """The state as last.pt keeps it: one flat record, the budget's fields last."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        budget = values.pop("budget")
        return {**values, **budget.as_saved()}

    @classmethod
    def saved(cls, values: dict[str, Any]) -> TrainState:
        """The state saved in a last.pt, less what older versions kept and this one does not."""
        known = {f.name for f in dataclasses.fields(cls)} - {"budget"}
        mine = {k: v for k, v in values.items() if k in known}
        return cls(**mine, budget=Budget.saved(values))


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    state: TrainState
    test_bleu: float | None
    stopped_by: str
    interrupted: bool = False  # by Ctrl-C: last.pt holds where to resume


def save_last(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    device: torch.device,
    on_event: Callable[[str], None],
) -> None:
    """Write ``last.pt`` atomically: weights, optimizer and progress. No random state: each
    micro-batch seeds its own. ``on_event("save")`` runs with the new file written but not yet
    in place."""
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": state.as_saved(),
        "device": device.type,
    }

    def write(tmp: Path) -> None:
        torch_save(payload, tmp)
        on_event("save")

    atomic_write(run_dir / "last.pt", write)


def load_last(
    run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[TrainState, str | None]:
    """Load ``last.pt`` into ``model`` and ``optimizer``: (its progress, the device type it was
    saved on, if it says)."""
    ckpt = load_state(run_dir / "last.pt")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return TrainState.saved(ckpt["state"]), ckpt.get("device")


def micro_seeds(seed: int, step: int, n: int) -> list[int]:
    """The seeds of the ``n`` micro-batches of update ``step`` + 1: a function of (seed, update,
    index) alone, whichever process takes the micro-batch and whether or not the run resumed."""
    return [
        int.from_bytes(
            hashlib.blake2b(f"{seed}:{step}:{i}".encode(), digest_size=8).digest()[:7], "little"
        )
        for i in range(n)
    ]


def ended_with_test(run_dir: Path) -> bool:
    """Whether log.jsonl ends with the test score: the run finished all it had to do."""
    log = run_dir / "log.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    try:
        last = json.loads(lines[-1]) if lines else {}
    except ValueError:  # a half-written line: killed mid-write, so not finished
        return False
    return isinstance(last, dict) and "test_bleu" in last


def forget_after(run_dir: Path, step: int) -> None:
    """Drop what a killed run wrote past the step it resumes from: log.jsonl records (so a
    curve never shows a step twice; a half-written last line goes too), checkpoints, and the
    temporary files of saves cut short."""
    for tmp in [*run_dir.glob(".*.tmp"), *(run_dir / CHECKPOINTS).glob(".*.tmp")]:
        tmp.unlink()
    log = run_dir / "log.jsonl"
    if log.exists():
        kept = []
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line + "\n")
        atomic_write_text(log, "".join(kept))
    for path in checkpoint_paths(run_dir):
        if int(path.stem.removeprefix("step-")) > step:
            path.unlink()


@contextmanager
def stop_on_interrupt() -> Iterator[list[bool]]:
    """A first Ctrl-C (SIGINT) or SIGTERM sets a flag, so the loop finishes its update and
    saves; a second one aborts. SIGTERM is how a cluster scheduler preempts a job and how
    torchrun stops its workers when Ctrl-C reaches it."""
    flag = [False]

    def handler(signum: int, frame: Any) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    stops = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {s: signal.signal(s, handler) for s in stops}
    except ValueError:  # not the main thread: leave signals alone
        yield flag
        return
    try:
        yield flag
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


class KillPoints:
    """The hook a trainer calls at its named events: ``update`` (an update made, nothing saved
    since) and ``save`` (inside a save of last.pt, the new file written but not yet in place).

    Tests only: with ``TFORMER_TEST_KILL_AT=EVENT:N`` in the environment (read at set-up, so
    torchrun's workers get it too) the process SIGKILLs itself at the N-th ``event``, as a
    power cut or the OOM killer would; without it every event is a no-op."""

    def __init__(self, at: str | None = None) -> None:
        self.at = at
        self.seen: Counter[str] = Counter()

    @classmethod
    def from_env(cls) -> KillPoints:
        return cls(os.environ.get(KILL_AT) or None)

    def __call__(self, event: str) -> None:
        if self.at:
            self.seen[event] += 1
            if self.at == f"{event}:{self.seen[event]}":
                os.kill(os.getpid(), signal.SIGKILL)


def peak_memory_mib(device: torch.device) -> float:
    """The process's peak resident memory in MiB (CUDA: the device's peak allocation)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class MemoryPeak:
    """The peak resident memory (``peak_memory_mib``) and the peak of its anonymous part, which
    the kernel does not keep: the largest ``anonymous_memory_mib`` of the moments ``note`` is
    called (each log record: after updates, validations)."""

    def __init__(self) -> None:
        self.anonymous: float | None = None

    def note(self) -> None:
        now = anonymous_memory_mib()
        if now is not None:
            self.anonymous = max(self.anonymous or 0.0, now)

    def line(self, device: torch.device) -> tuple[str, dict[str, float]]:
        """``peak memory N MiB (anonymous M MiB)`` and the log record's fields."""
        self.note()
        peak = peak_memory_mib(device)
        where = " on the GPU" if device.type == "cuda" else ""
        record = {"peak_memory_mib": peak}
        text = f"peak memory {peak:,.0f} MiB{where}"
        if self.anonymous is not None:
            record["peak_anonymous_mib"] = self.anonymous
            host = "host " if device.type == "cuda" else ""
            text += f" ({host}anonymous {self.anonymous:,.0f} MiB)"
        return text, record


class TokenRate:
    """Target tokens per second of training; validations and saves are left out."""

    def __init__(self) -> None:
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def pause(self, seconds: float) -> None:
        """Leave out ``seconds`` spent on something else."""
        self.start += seconds

    def take(self) -> float:
        """The rate since the last take; counting starts again."""
        now = time.perf_counter()
        rate = self.tokens / (now - self.start)
        self.tokens, self.start = 0, now
        return rate
