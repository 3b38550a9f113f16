"""What a run keeps on disk and between processes: its progress (``TrainState``, in ``last.pt``
with the weights and the optimizer) and ``--max-minutes`` as a number of updates (``Budget``),
the trimming of what a killed run wrote past its last save, the signals that stop it cleanly,
the crash tests' kill points, and the peak memory.

Crash safety: ``last.pt`` is saved atomically at every validation and every ``--save-every``
minutes, and ``--resume`` replays the lost updates bit for bit on CPU, under DDP too: the
batches are a function of (seed, epoch), each micro-batch's random numbers of (seed, update,
micro-batch), so no generator state is saved.
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
from tformer_cli.config import TrainConfig
from tformer_cli.device import anonymous_memory_mib
from tformer_cli.files import atomic_write, atomic_write_text
from tformer_cli.training.distributed import World, from_main
from tformer_cli.training.schedule import decay_progress, lr_at

KILL_AT = "TFORMER_TEST_KILL_AT"  # tests: EVENT:N, see KillPoints


def budget_updates(step: int, elapsed: float, update_seconds: float, minutes: float) -> int:
    """The update (past ``step``) at which ``minutes`` run out at ``update_seconds`` each."""
    left = max(0.0, minutes * 60 - elapsed)
    return step + max(1, round(left / max(update_seconds, 1e-9)))


# The names last.pt keeps the budget's fields under, where they differ from the fields'
SAVED_NAMES = {"updates": "budget_updates", "minutes": "budget_minutes"}


@dataclass
class Budget:
    """``--max-minutes`` as a number of updates, for the learning rate to decay to 0 when the
    time runs out: estimated at the end of warm-up and after every validation (``plan``; updates
    slow down as a run goes on), each estimate taking the decay over where it stands. Saved in
    last.pt."""

    updates: int = 0  # the update at which the learning rate reaches 0 (0: no estimate)
    minutes: float = 0.0  # the --max-minutes it was estimated for
    update_seconds: float = 0.0  # seconds per update as timed, validations spread over them
    mark_step: int = 0  # (update, elapsed) where the measuring for the next estimate began
    mark_elapsed: float = 0.0
    valid_seconds: float = 0.0  # seconds spent validating since then (rank 0)
    decay_from: int = 0  # the update where the latest estimate took over the decay (0: none)
    decay_progress: float = 0.0  # the decay's progress (0 to 1) at that update

    def lr(self, step: int, cfg: TrainConfig) -> float:
        """``lr_at`` with the budget's last update, from where the latest estimate took over."""
        return lr_at(step, cfg, self.end(cfg), self.start())

    def end(self, cfg: TrainConfig) -> int | None:
        """The last update: the first of --max-steps and the --max-minutes estimate."""
        ends = [n for n in (cfg.max_steps, self.updates if cfg.max_minutes else 0) if n]
        return min(ends) if ends else None

    def start(self) -> tuple[int, float] | None:
        return (self.decay_from, self.decay_progress) if self.decay_from else None

    def progress(self, step: int, cfg: TrainConfig) -> float:
        """The decay's progress at ``step`` under the current estimate (0 before there is one)."""
        end = self.end(cfg)
        if end is None or not self.updates or step <= cfg.warmup:
            return 0.0
        return decay_progress(step, end, self.start() or (cfg.warmup, 0.0))

    def plan(
        self, step: int, elapsed: float, cfg: TrainConfig, world: World, device: torch.device
    ) -> str | None:
        """Before update ``step + 1``, ``elapsed`` seconds in, where an estimate is due: the
        seconds left over the seconds per update timed since the last estimate (the first from
        halfway through warm-up), validations spread over their updates; rank 0's numbers on
        every rank. Returns what to say about it."""
        if not cfg.max_minutes or cfg.budget_decay is None:
            return None
        if step == cfg.warmup // 2 and not self.updates:
            self.mark_step, self.mark_elapsed, self.valid_seconds = step, elapsed, 0.0
        validations = step // cfg.valid_every - self.mark_step // cfg.valid_every  # since the mark
        if step < cfg.warmup or (self.updates and not validations):
            return None
        steps = step - self.mark_step  # >= 1: the mark is before this update
        train = (elapsed - self.mark_elapsed - self.valid_seconds) / steps
        valid = self.valid_seconds / validations if validations else 0.0  # one validation
        seconds = train + valid / cfg.valid_every
        total = budget_updates(step, elapsed, seconds, cfg.max_minutes)
        total, seconds, train, valid = from_main(world, [total, seconds, train, valid], device)
        was, started = self.updates, self.mark_step
        self.decay_from, self.decay_progress = step, self.progress(step, cfg)
        self.updates, self.minutes, self.update_seconds = int(total), cfg.max_minutes, seconds
        self.mark_step, self.mark_elapsed, self.valid_seconds = step, elapsed, 0.0
        rate = f"{train * 1000:.0f} ms/update" + (
            f" and {valid:.1f} s per validation (every {cfg.valid_every})" if validations else ""
        )
        return (
            f"--max-minutes {cfg.max_minutes:g}: {rate} over updates {started}-{step}, so"
            f" the learning rate decays ({cfg.budget_decay}) to 0 at update {self.updates}"
            f"{f' (was {was})' if was else ''}"
        )

    def rebudget(self, step: int, elapsed: float, cfg: TrainConfig) -> str | None:
        """A new end on a resume that changes --max-minutes; returns what to say about it."""
        if not self.updates or cfg.max_minutes == self.minutes:
            return None
        was, old = self.updates, self.minutes
        if cfg.max_minutes and cfg.budget_decay is not None:
            self.decay_from, self.decay_progress = step, self.progress(step, cfg)
            self.updates = budget_updates(step, elapsed, self.update_seconds, cfg.max_minutes)
            self.minutes = cfg.max_minutes
            return (
                f"--max-minutes {old:g} -> {cfg.max_minutes:g}: the learning rate now reaches 0"
                f" at update {self.updates} (was {was}; {self.update_seconds * 1000:.0f}"
                " ms/update so far)"
            )
        self.updates, self.minutes, self.decay_from = 0, 0.0, 0
        return (
            f"no --max-minutes any more (was {old:g}): the learning rate follows 1/sqrt decay"
            f" after update {step}"
        )


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
        budget = dataclasses.asdict(values.pop("budget"))
        return {**values, **{SAVED_NAMES.get(k, k): v for k, v in budget.items()}}

    @classmethod
    def saved(cls, values: dict[str, Any]) -> TrainState:
        """The state saved in a last.pt (keys of older versions ignored)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"budget"}
        names = {SAVED_NAMES.get(f.name, f.name): f.name for f in dataclasses.fields(Budget)}
        mine = {k: v for k, v in values.items() if k in known}
        budget = Budget(**{names[k]: v for k, v in values.items() if k in names})
        return cls(**mine, budget=budget)


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
    """Write ``last.pt`` atomically, calling ``on_event("save")`` before it is in place."""
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
    """Load ``last.pt`` into ``model`` and ``optimizer``: (its progress, its device type)."""
    ckpt = load_state(run_dir / "last.pt")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return TrainState.saved(ckpt["state"]), ckpt.get("device")


def micro_seeds(seed: int, step: int, n: int) -> list[int]:
    """The seeds of the ``n`` micro-batches of update ``step`` + 1, from (seed, update, index)."""
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
    """Drop what a killed run wrote past the step it resumes from: log.jsonl records (a torn
    last line too), checkpoints, and the temporary files of saves cut short."""
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
    """A first Ctrl-C or SIGTERM sets a flag (the loop saves and stops); a second aborts."""
    flag = [False]

    def handler(signum: int, frame: Any) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield flag
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


class KillPoints:
    """The hook a trainer calls at ``update`` (nothing saved since) and ``save`` (last.pt
    written, not yet in place). Tests only: with ``TFORMER_TEST_KILL_AT=EVENT:N`` the process
    SIGKILLs itself at the N-th ``event``, as a power cut would; else a no-op."""

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
    the kernel does not keep: the largest ``anonymous_memory_mib`` seen by ``note``."""

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
