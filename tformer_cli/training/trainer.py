"""The training loop, in the order of the paper (section 5) and of nanoGPT: for each update the
forward pass and the label-smoothed loss (5.4), backward, gradient clipping and an AdamW step at
the learning rate of the schedule (5.3, ``schedule.py``); around it the log, a validation every
``--valid-every`` updates that keeps the best weights in ``model.pt``, saves and the stopping
rules, which are ``TrainerBase``'s (``bookkeeping.py``). An update whose loss or gradient is not
finite is skipped, so no NaN ever reaches the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import cached_property, partial

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from tformer_cli.compile import maybe_compile
from tformer_cli.config import TrainConfig
from tformer_cli.console import make_progress
from tformer_cli.data.batching import Batch
from tformer_cli.device import autocast, oom_hint
from tformer_cli.model import Transformer
from tformer_cli.training.bookkeeping import TrainerBase
from tformer_cli.training.distributed import ONE_PROCESS, World, agree
from tformer_cli.training.loss import label_smoothed_loss
from tformer_cli.training.state import TokenRate, TrainResult, micro_seeds, stop_on_interrupt

# ``--compile auto`` for the training step: eager. Compiling ``forward_loss`` (dynamic shapes)
# was no faster than eager on CPU or CUDA in ``benchmarks/bench_train.py --compile``: on CPU
# the step is mostly matmuls, and on CUDA it is bound by the host launching kernels.
COMPILE_PAYS = False


def forward_loss(
    model: Transformer | DistributedDataParallel,
    src: torch.Tensor,
    y: torch.Tensor,
    tgt_out: torch.Tensor,
    real: torch.Tensor,
    smoothing: float,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """Teacher-forced label-smoothed loss summed over the N real target positions: src (B, S),
    decoder input y and gold tgt_out (B, T), ``real`` (N,) their flat indices (the output
    layer runs there only). What ``--compile`` compiles, with dynamic shapes (N varies)."""
    with autocast(src.device, dtype):
        logits = model(src, y, at=real)  # (N, V)
    target = tgt_out.flatten().index_select(0, real)  # (N,)
    return label_smoothed_loss(logits, target, smoothing)


def train_step(
    model: Transformer | DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    batches: list[Batch],
    decoder_inputs: list[torch.Tensor],
    loss_scale: float,
    cfg: TrainConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    seeds: list[int] | None = None,
    world: World = ONE_PROCESS,
    forward: Callable[..., torch.Tensor] = forward_loss,
) -> tuple[torch.Tensor, bool]:
    """One update: ``forward`` (``forward_loss``, or it compiled) summed over the accumulated
    batches times ``loss_scale``, backward, clipping, AdamW.

    ``loss_scale`` is 1 / (target tokens of the update); under DDP, which averages the N ranks'
    gradients, N / tokens (0 for a rank with no share: it still joins the all-reduce).
    ``seeds[i]`` seeds micro-batch i. Returns (this rank's mean loss per target token, 0-dim;
    whether the update was made): one ``isfinite`` of the clipping's norm, the update's one host
    sync, skips it where the loss or the gradient is not finite, on every rank alike.
    """
    model.train()
    total = torch.zeros((), device=device)
    for i, (b, y) in enumerate(zip(batches, decoder_inputs, strict=True)):
        if seeds is not None:
            torch.manual_seed(seeds[i])
        accumulate = world.size > 1 and i < len(batches) - 1  # all-reduce after the last only
        with model.no_sync() if accumulate else nullcontext():  # type: ignore[union-attr]
            loss = forward(model, b.src, y, b.tgt_out, b.real, cfg.label_smoothing, dtype)
            loss = loss * loss_scale
            loss.backward()
        total += loss.detach() / world.size
    max_norm = cfg.clip_norm if cfg.clip_norm > 0 else math.inf  # inf: measure, never clip
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    made = bool(torch.isfinite(total + grad_norm))
    if world.size > 1:  # a NaN on one rank: every rank skips
        made = not agree(world, [not made], device)[0]
    if made:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, made


class Trainer(TrainerBase):
    """Trains one run folder: ``run()`` returns when a stopping rule fires or on Ctrl-C."""

    @cached_property
    def forward(self) -> Callable[..., torch.Tensor]:
        """``forward_loss``, compiled where ``--compile`` says so."""
        return maybe_compile(
            forward_loss, self.cfg.compile, COMPILE_PAYS, "training step",
            self.console.log, dynamic=True,
        )  # fmt: skip

    def run(self, quiet: bool = False) -> TrainResult:
        """Train until a stopping rule fires or Ctrl-C/SIGTERM, then score the best weights on
        the test split (rank 0)."""
        cfg, s = self.cfg, self.state
        if self.done:
            return self._already_finished()
        self._say_what_trains()
        per_update = max(cfg.accum, self.world.size)  # batches: --accum, at least one a rank
        progress = make_progress("train", self.console, disable=quiet or not self.world.main)
        self.rate = TokenRate()
        with stop_on_interrupt() as interrupted, progress, oom_hint(cfg.max_tokens):
            stopped_by = self._agree_stop(interrupted)  # a resumed run may be past its limits
            task = progress.add_task("train", total=self._updates(), completed=s.step, info="")
            self.bar = partial(progress.update, task)
            while stopped_by is None:  # an epoch
                batches = self._epoch_batches(s.epoch)
                while s.batch_in_epoch < len(batches) and stopped_by is None:  # an update
                    group = batches[s.batch_in_epoch : s.batch_in_epoch + per_update]
                    # forward, loss, backward, clip, step (train_step)
                    t0 = time.perf_counter()
                    loss, n_tokens, made = self._step(group)
                    s.batch_in_epoch += len(group)
                    s.elapsed += time.perf_counter() - t0
                    # log it; validate every --valid-every updates, else save last.pt on time
                    self._after_update(loss, n_tokens, made)
                    # stop? rank 0's rules or a Ctrl-C on any rank
                    stopped_by = self._agree_stop(interrupted)
                if s.batch_in_epoch >= len(batches):  # the epoch is over (or resumed at its end)
                    s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                    stopped_by = stopped_by or self._agree_stop(interrupted)
            if not interrupted[0]:
                self.bar(total=s.step, completed=s.step)  # epochs vary by a batch
        return self._finish(stopped_by or "", interrupted[0])

    def _step(self, batches: list[np.ndarray]) -> tuple[torch.Tensor, int, bool]:
        """One update from ``accum`` batches: (mean loss per target token, target tokens,
        whether it was made)."""
        s = self.state
        self._say(s.budget.plan(s.step, s.elapsed, self.cfg, self.world, self.device))
        lr = self.lr(s.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n_tokens = sum(int(self.tgt_lengths[idx].sum()) + len(idx) for idx in batches)  # + </s>
        w = self.world
        mine, seeds = w.shard(batches), w.shard(micro_seeds(self.cfg.seed, s.step, len(batches)))
        scale = w.size / n_tokens
        if not mine:  # the tail of an epoch left this rank nothing: a weightless pass
            mine, seeds, scale = batches[:1], seeds[:1] or [0], 0.0
        parts = [self._batch(idx) for idx in mine]
        inputs = []
        for b, seed in zip(parts, seeds, strict=True):
            self.ss_generator.manual_seed(seed)
            inputs.append(self._decoder_input(b))
        loss, made = train_step(
            self.ddp or self.model, self.optimizer, parts, inputs, scale, self.cfg,
            self.device, self.dtype, seeds, w, self.forward,
        )  # fmt: skip
        s.step += made
        return loss, n_tokens, made
