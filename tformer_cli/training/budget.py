"""``--max-minutes`` as a number of updates (``Budget``), for the learning rate of ``schedule.py``
to decay to 0 when the time runs out, estimated as the run goes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from tformer_cli.config import TrainConfig
from tformer_cli.training.distributed import World, from_main
from tformer_cli.training.schedule import decay_progress, lr_at


def budget_updates(step: int, elapsed: float, update_seconds: float, minutes: float) -> int:
    """The update at which ``minutes`` of training run out, from update ``step`` at ``elapsed``
    seconds on at ``update_seconds`` per update; at least ``step + 1``."""
    left = max(0.0, minutes * 60 - elapsed)
    return step + max(1, round(left / max(update_seconds, 1e-9)))


# The names last.pt keeps the budget's fields under, where they differ from the fields'
SAVED_NAMES = {"updates": "budget_updates", "minutes": "budget_minutes"}


@dataclass
class Budget:
    """``--max-minutes`` as a number of updates, for the decay to reach 0 when the time runs out.

    Estimated at the end of warm-up and again after every validation (``plan``), since updates
    slow down as a run goes on and one early estimate leaves the learning rate well above 0 when
    the time is up. Each new estimate takes the decay over where it stands, so the learning rate
    never jumps. Saved in last.pt: a resume keeps the estimate until the next validation.
    """

    updates: int = 0  # the update at which the learning rate reaches 0 (0: no estimate)
    minutes: float = 0.0  # the --max-minutes it was estimated for
    update_seconds: float = 0.0  # seconds per update as timed, validations spread over them
    mark_step: int = 0  # (update, elapsed) where the measuring for the next estimate began
    mark_elapsed: float = 0.0
    valid_seconds: float = 0.0  # seconds spent validating since then (rank 0)
    decay_from: int = 0  # the update where the latest estimate took over the decay (0: none)
    decay_progress: float = 0.0  # the decay's progress (0 to 1) at that update

    def as_saved(self) -> dict[str, Any]:
        """The fields under the names last.pt keeps them by."""
        return {SAVED_NAMES.get(k, k): v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def saved(cls, values: dict[str, Any]) -> Budget:
        """The budget in a last.pt's state (whose other keys it ignores)."""
        fields = {SAVED_NAMES.get(f.name, f.name): f.name for f in dataclasses.fields(cls)}
        return cls(**{fields[k]: v for k, v in values.items() if k in fields})

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
        """Before update ``step + 1``, ``elapsed`` seconds in: where an estimate is due, turn
        --max-minutes into a number of updates, the seconds left divided by the seconds per
        update timed since the previous estimate (from halfway through warm-up for the
        first), a validation's seconds spread over the --valid-every updates it follows. Rank
        0's clock decides and every rank gets its numbers, so that DDP ranks keep one schedule.
        Returns what to say about it."""
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
        """On a resume at update ``step`` that changes --max-minutes: the update at which the
        learning rate reaches 0 again, from the saved seconds per update (every rank alike).
        Returns what to say about it."""
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
