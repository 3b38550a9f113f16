"""What a run keeps between processes: the progress saved in ``last.pt`` (``TrainState``), the
signals that stop it cleanly, and the kill points of the crash-safety tests."""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


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
    # --max-minutes as a number of updates, estimated at the end of warm-up and again after
    # every validation
    budget_updates: int = 0  # the update at which the learning rate reaches 0 (0: no estimate)
    budget_minutes: float = 0.0  # the --max-minutes it was estimated for
    update_seconds: float = 0.0  # measured seconds per update, validations spread over them
    mark_step: int = 0  # (update, elapsed) where the measuring for the next estimate began
    mark_elapsed: float = 0.0
    valid_seconds: float = 0.0  # seconds spent validating since then (rank 0)
    decay_from: int = 0  # the update where the latest estimate took over the decay (0: none)
    decay_progress: float = 0.0  # the decay's progress (0 to 1) at that update

    @classmethod
    def saved(cls, values: dict[str, Any]) -> TrainState:
        """The state saved in a last.pt, less what older versions kept and this one does not."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    state: TrainState
    test_bleu: float | None
    stopped_by: str
    interrupted: bool = False  # by Ctrl-C: last.pt holds where to resume


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


def kill_point(event: str) -> None:
    """Tests only: ``TFORMER_TEST_KILL_AT=EVENT:N`` SIGKILLs this process at the N-th ``event``
    (``update``: an update made, nothing saved since; ``save``: inside a save of last.pt, the
    new file written but not yet in place), as a power cut or the OOM killer would."""
    at = os.environ.get("TFORMER_TEST_KILL_AT")
    if at:
        _events[event] += 1
        if at == f"{event}:{_events[event]}":
            os.kill(os.getpid(), signal.SIGKILL)


_events: Counter[str] = Counter()


def peak_memory_mib(device: torch.device) -> float:
    """The process's peak resident memory in MiB (CUDA: the device's peak allocation)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
