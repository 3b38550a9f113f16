"""The learning-rate schedule: the paper's warm-up and inverse-sqrt decay (section 5.3), or a
decay to 0 at the last update of a budget ("Budgeted Training", Li et al. 2020)."""

from __future__ import annotations

import math

from tformer_cli.config import TrainConfig


def lr_at(
    step: int, cfg: TrainConfig, total: int | None = None, start: tuple[int, float] | None = None
) -> float:
    """Linear warm-up to ``cfg.lr`` over ``warmup`` steps, then 1/sqrt(step) decay (paper 5.3);
    or, given the ``total`` updates of a budget, ``cfg.budget_decay`` to 0 at update ``total``
    ("Budgeted Training", Li et al. 2020): linear lr * (1 - u), or cosine lr * (1 + cos(pi u))
    / 2, with progress u from ``decay_progress``; 0 from ``total`` on."""
    step = max(step, 1)
    if step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    if cfg.budget_decay is None or total is None:
        return cfg.lr * math.sqrt(cfg.warmup / step)
    u = decay_progress(step, total, start or (cfg.warmup, 0.0))
    if cfg.budget_decay == "linear":
        return cfg.lr * (1.0 - u)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * u))


def decay_progress(step: int, total: int, start: tuple[int, float]) -> float:
    """The decay's progress at ``step``: linear from ``start`` = (update, progress), the end of
    warm-up at 0 or where a later estimate of ``total`` took over, to 1 at update ``total``."""
    at, u = start
    return min(1.0, max(0.0, u + (1.0 - u) * (step - at) / max(total - at, 1)))


def budget_updates(step: int, elapsed: float, update_seconds: float, minutes: float) -> int:
    """The update at which ``minutes`` of training run out, from update ``step`` at ``elapsed``
    seconds on at ``update_seconds`` per update; at least ``step + 1``."""
    left = max(0.0, minutes * 60 - elapsed)
    return step + max(1, round(left / max(update_seconds, 1e-9)))
