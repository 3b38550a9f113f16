"""The optimizer and its learning-rate schedule (paper section 5.3): AdamW, the paper's warm-up
and inverse-sqrt decay, or a decay to 0 at the last update of a budget ("Budgeted Training", Li
et al. 2020), where the budget of ``--max-minutes`` is a number of updates estimated as the run
goes (``budget.Budget``)."""

from __future__ import annotations

import math

import torch

from tformer_cli.config import TrainConfig
from tformer_cli.model import Transformer


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with the paper's betas (0.9, 0.98), eps 1e-9, no weight decay; PyTorch's fused
    kernel on CPU and CUDA (one pass over all parameters instead of ~10 ops per tensor)."""
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=fused
    )


def lr_at(
    step: int, cfg: TrainConfig, total: int | None = None, start: tuple[int, float] | None = None
) -> float:
    """The learning rate of update ``step``. Paper 5.3: ``d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5)``, a linear warm-up to its peak at ``warmup`` steps, then 1/sqrt(step) decay,
    with the peak ``(d_model * warmup)^-0.5`` replaced by ``cfg.lr``.

    Given the ``total`` updates of a budget, ``cfg.budget_decay`` follows the warm-up instead,
    to 0 at update ``total``: linear lr * (1 - u), or cosine lr * (1 + cos(pi u)) / 2, with
    progress u from ``decay_progress``; 0 from ``total`` on."""
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
