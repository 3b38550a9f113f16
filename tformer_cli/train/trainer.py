"""The training loop: label-smoothed teacher forcing, AdamW with warm-up and inverse-sqrt decay,
periodic validation (loss, perplexity, greedy BLEU), best/last checkpoints, resume, Ctrl-C.

Crash safety: ``last.pt`` is saved at every validation and at least every ``--save-every``
minutes, atomically, so a kill at any moment loses at most the work since the last save, and
``--resume`` replays the lost updates bit for bit on CPU: the batches are a function of (seed,
epoch) and the random numbers of each micro-batch (dropout, scheduled sampling) of (seed, update,
micro-batch), so no generator state has to be saved, and the same holds under DDP with any
number of processes. An update whose loss or gradient is not finite is skipped, so no NaN ever
reaches the weights.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch.nn.parallel import DistributedDataParallel

from tformer_cli.checkpoint import (
    CHECKPOINTS,
    RunConfig,
    atomic_torch_save,
    average_state_dicts,
    checkpoint_paths,
    load_state,
    load_weights,
    save_checkpoint,
)
from tformer_cli.compile import maybe_compile
from tformer_cli.config import DecodeConfig, ModelConfig, TrainConfig
from tformer_cli.console import make_progress
from tformer_cli.data.batching import Batch, make_batch, padding_waste, token_batches
from tformer_cli.data.tokenizer import decode
from tformer_cli.decode.search import translate_ids
from tformer_cli.device import (
    autocast,
    oom_hint,
    precision_name,
    resolve_device,
    resolve_precision,
    setup_threads,
)
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write, atomic_write_text
from tformer_cli.model import Transformer
from tformer_cli.report.evaluation import bleu, teacher_forced
from tformer_cli.report.runs import lock_run
from tformer_cli.train.distributed import (
    ONE_PROCESS,
    World,
    agree,
    barrier,
    from_main,
    init_world,
    leave_world,
)
from tformer_cli.train.loss import label_smoothed_loss
from tformer_cli.train.schedule import budget_updates, decay_progress, lr_at
from tformer_cli.train.scheduled_sampling import (
    check_schedule,
    mix_inputs,
    model_predictions,
    teacher_forcing_prob,
)
from tformer_cli.train.setup import (
    _overrides,
    prepare,
    removed_on_failure,
    tensorboard_writer,
)
from tformer_cli.train.state import (
    TrainResult,
    TrainState,
    kill_point,
    peak_memory_mib,
    stop_on_interrupt,
)

LOG_EVERY = 25  # steps between log.jsonl lines
MAX_NONFINITE = 5  # updates in a row with a non-finite loss or gradient that stop the run


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
    layer runs there only). The part of a step that ``--compile`` hands to ``torch.compile``:
    N is data-dependent, so it is compiled with dynamic shapes."""
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
    """One update: ``forward`` (``forward_loss``, or it compiled), label-smoothed loss summed
    over the accumulated batches times ``loss_scale``, backward, clipping, AdamW.

    ``loss_scale`` is 1 / (target tokens of the whole update) in one process. Under DDP,
    ``batches`` are this rank's share and DDP averages the gradients over the N ranks, so the
    scale is N / tokens, which makes the result the gradient of the global mean (0 for a rank
    whose share is empty: it still joins the all-reduce). ``seeds[i]`` seeds micro-batch i's
    random numbers. Returns (the update's mean loss per target token from this rank, a 0-dim
    tensor on the device; whether the update was made): an update whose loss or gradient norm
    is not finite is skipped, found by one ``isfinite`` of the norm that clipping computes
    anyway (the update's one host sync; under DDP one tiny all-reduce more, so that every
    rank decides alike).
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


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with the paper's betas (0.9, 0.98), eps 1e-9, no weight decay; PyTorch's fused
    kernel on CPU and CUDA (one pass over all parameters instead of ~10 ops per tensor)."""
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=fused
    )


class Trainer:
    """Trains one run folder; ``run()`` returns when a stopping rule fires or on Ctrl-C."""

    def __init__(
        self,
        run_dir: Path,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        *,
        resume: bool,
        console: Console,
        tensorboard: Path | None = None,
    ) -> None:
        self.run_dir, self.cfg = run_dir, cfg
        setup_threads()
        torch.manual_seed(cfg.seed)
        if resume:
            saved = RunConfig.load(run_dir)
            model_cfg, self.cfg = saved.model, dataclasses.replace(saved.train, **_overrides(cfg))
            cfg = self.cfg
            if not (run_dir / "last.pt").exists() and (run_dir / "model.pt").exists():
                raise TformerError(
                    f"{run_dir} has a model.pt but no last.pt (the optimizer state and progress"
                    f" a resume needs), so it cannot be resumed; to train its weights on, start"
                    f" a new run: tformer train --init-from {run_dir} --name NEW"
                )
        if cfg.max_len > model_cfg.max_positions:
            raise TformerError(
                f"--max-len {cfg.max_len} is more than the model's {model_cfg.max_positions}"
                " positions"
            )
        device = resolve_device(cfg.device)
        self.world = init_world(device.type)
        w = self.world
        if w.size > 1 and device.type == "cuda":
            device = torch.device("cuda", w.local_rank)
            torch.cuda.set_device(device)
        elif w.size > 1:  # N processes share the cores
            local = int(os.environ.get("LOCAL_WORLD_SIZE", w.size))
            torch.set_num_threads(max(1, torch.get_num_threads() // local))
        self.device = device
        self.console = console if w.main else Console(quiet=True)
        # --tensorboard: every rank checks for the package (a one-line error), rank 0 writes
        make_board = tensorboard_writer(tensorboard) if tensorboard is not None else None
        self.board = make_board() if make_board is not None and w.main else None
        self.dtype = resolve_precision(cfg.precision, self.device, model_cfg.d_model)
        check_schedule(cfg.scheduled_sampling, cfg.ss_k, cfg.ss_mix)
        if w.main:  # rank 0 builds the tokenizer and the data cache; the others read them
            with removed_on_failure(run_dir, made=not resume and not run_dir.exists()):
                self.tokenizer, self.data = prepare(
                    run_dir, cfg, console, resume, model_cfg.max_positions
                )
        barrier(w)
        if not w.main:
            self.tokenizer, self.data = prepare(
                run_dir, cfg, self.console, True, model_cfg.max_positions
            )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=self.tokenizer.get_vocab_size())
        self.model = Transformer(model_cfg).to(self.device)
        if cfg.init_from is not None and not resume:  # fine-tuning: new optimizer and schedule
            load_weights(self.model, Path(cfg.init_from))
            self.console.log(f"weights from {cfg.init_from}/model.pt")
        self.optimizer = make_optimizer(self.model, cfg)
        self.forward = maybe_compile(
            forward_loss, cfg.compile, COMPILE_PAYS, "training step",
            self.console.log, dynamic=True,
        )  # fmt: skip
        self.state = TrainState()
        # scheduled sampling's own random numbers, drawn on the device the batches live on
        self.ss_generator = torch.Generator(self.device)
        if resume and (run_dir / "last.pt").exists():
            self._load_last()
        # a finished run resumed with no later stopping rule: nothing to do, nothing rewritten
        self.done = resume and self._stop_reason() is not None and self._ended_with_test()
        if w.main:
            self.run_lock = lock_run(run_dir)  # `tformer runs`: running while this process lives
            if resume and not (run_dir / "last.pt").exists():  # said once the run is ours
                self.console.log(f"{run_dir} has no last.pt (stopped before its first save):"
                                 " starting from step 0 with its saved settings")  # fmt: skip
            if not self.done:
                RunConfig(model_cfg, cfg).save(run_dir)
            if resume and not self.done:
                self._forget_after(self.state.step)
        self.ddp = (
            DistributedDataParallel(
                self.model, device_ids=[device.index] if device.index is not None else None
            )
            if w.size > 1
            else None
        )
        self.last_save = time.perf_counter()
        self.lengths = [
            max(len(s), len(t)) + 1
            for s, t in zip(self.data["train"].src, self.data["train"].tgt, strict=True)
        ]

    # ----------------------------------------------------------------- checkpoints
    def _save_last(self) -> None:
        """Write ``last.pt`` atomically (rank 0): weights, optimizer and progress. No random
        state: each micro-batch seeds its own (``micro_seeds``)."""
        if not self.world.main:
            return
        payload = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "state": dataclasses.asdict(self.state),
            "device": self.device.type,
        }

        def write(tmp: Path) -> None:
            torch.save(payload, tmp)
            kill_point("save")  # tests: die with the new last.pt written but not in place

        atomic_write(self.run_dir / "last.pt", write)
        self.last_save = time.perf_counter()

    def _load_last(self) -> None:
        ckpt = load_state(self.run_dir / "last.pt")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.state = TrainState.saved(ckpt["state"])
        self._rebudget()
        saved_on = ckpt.get("device", self.device.type)
        if saved_on != self.device.type:  # other kernels, other random number generators
            self.console.log(f"note: saved on {saved_on}, resumed on {self.device.type}: training"
                             " continues, but not bit for bit")  # fmt: skip
        self.console.log(
            f"resumed {self.run_dir} at step {self.state.step}, epoch {self.state.epoch + 1}"
        )

    def _rebudget(self) -> None:
        """On a resume that changes --max-minutes: the update at which the learning rate
        reaches 0 again, from the saved seconds per update (every rank alike)."""
        c, s = self.cfg, self.state
        if not s.budget_updates or c.max_minutes == s.budget_minutes:
            return
        was, old = s.budget_updates, s.budget_minutes
        if c.max_minutes and c.budget_decay is not None:
            s.decay_from, s.decay_progress = s.step, self._progress(s.step)
            s.budget_updates = budget_updates(s.step, s.elapsed, s.update_seconds, c.max_minutes)
            s.budget_minutes = c.max_minutes
            self.console.log(
                f"--max-minutes {old:g} -> {c.max_minutes:g}: the learning rate now reaches 0 at"
                f" update {s.budget_updates} (was {was}; {s.update_seconds * 1000:.0f} ms/update"
                " measured)"
            )
        else:
            s.budget_updates, s.budget_minutes, s.decay_from = 0, 0.0, 0
            self.console.log(f"no --max-minutes any more (was {old:g}): the learning rate"
                             f" follows 1/sqrt decay after update {s.step}")  # fmt: skip

    def _ended_with_test(self) -> bool:
        """Whether log.jsonl ends with the test score: the run finished all it had to do."""
        log = self.run_dir / "log.jsonl"
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        try:
            last = json.loads(lines[-1]) if lines else {}
        except ValueError:  # a half-written line: killed mid-write, so not finished
            return False
        return isinstance(last, dict) and "test_bleu" in last

    def _forget_after(self, step: int) -> None:
        """Drop what a killed run wrote past the step it resumes from: log.jsonl records (so a
        curve never shows a step twice; a half-written last line goes too), checkpoints, and
        the temporary files of saves cut short."""
        for tmp in [*self.run_dir.glob(".*.tmp"), *(self.run_dir / CHECKPOINTS).glob(".*.tmp")]:
            tmp.unlink()
        log = self.run_dir / "log.jsonl"
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
        for path in checkpoint_paths(self.run_dir):
            if int(path.stem.removeprefix("step-")) > step:
                path.unlink()

    # ----------------------------------------------------------------- steps
    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """This epoch's batches: a function of (seed, epoch) alone, so resuming replays them."""
        return token_batches(
            self.lengths, self.cfg.max_tokens, random.Random(self.cfg.seed * 1000 + epoch)
        )

    def _batch(self, idx: list[int]) -> Batch:
        train = self.data["train"]
        return make_batch([train.src[i] for i in idx], [train.tgt[i] for i in idx]).to(self.device)

    def _step(self, batches: list[list[int]]) -> tuple[torch.Tensor, int, bool]:
        """One update from ``accum`` batches: (mean loss per target token, target tokens,
        whether it was made); a skipped update leaves the step count as it was."""
        self._plan_budget()
        lr = self.lr(self.state.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        tgt = self.data["train"].tgt
        n_tokens = sum(len(tgt[i]) + 1 for idx in batches for i in idx)  # + </s>; no sync
        w = self.world
        mine, seeds = w.shard(batches), w.shard(self.micro_seeds(len(batches)))
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
        self.state.step += made
        return loss, n_tokens, made

    def close(self) -> None:
        """Leave the process group (DDP): the DDP wrapper goes first, so that no gradient
        bucket of its own outlives the group it talks through."""
        self.ddp = None
        gc.collect()
        leave_world(self.world)

    def lr(self, step: int) -> float:
        """The learning rate of update ``step``: ``lr_at`` with the budget's last update, the
        first of --max-steps and the --max-minutes estimate, from where that estimate took over."""
        return lr_at(step, self.cfg, self._end(), self._start())

    def _end(self) -> int | None:
        c, s = self.cfg, self.state
        ends = [n for n in (c.max_steps, s.budget_updates if c.max_minutes else 0) if n]
        return min(ends) if ends else None

    def _start(self) -> tuple[int, float] | None:
        s = self.state
        return (s.decay_from, s.decay_progress) if s.decay_from else None

    def _progress(self, step: int) -> float:
        """The decay's progress at ``step`` under the current estimate (0 before there is one)."""
        end = self._end()
        if end is None or not self.state.budget_updates or step <= self.cfg.warmup:
            return 0.0
        return decay_progress(step, end, self._start() or (self.cfg.warmup, 0.0))

    def _plan_budget(self) -> None:
        """Turn --max-minutes into a number of updates: the seconds left divided by the seconds
        per update measured since the previous estimate (from halfway through warm-up for the
        first), a validation's seconds spread over the --valid-every updates it follows. Made
        at the end of warm-up and again after every validation: updates slow down as a run
        goes on (Multi30k on 2 cores: ~420 ms each at first, 450-480 after 1,000), and one
        estimate left the learning rate at 11-13% of its peak when the time ran out. Each new
        estimate takes the decay over where it stands, so the learning rate never jumps. Rank
        0's clock decides and every rank gets its numbers, so that DDP ranks keep one schedule;
        the estimate is saved in last.pt (a resume keeps it until the next validation)."""
        c, s = self.cfg, self.state
        if not c.max_minutes or c.budget_decay is None:
            return
        if s.step == c.warmup // 2 and not s.budget_updates:
            s.mark_step, s.mark_elapsed, s.valid_seconds = s.step, s.elapsed, 0.0
        validations = s.step // c.valid_every - s.mark_step // c.valid_every  # since the mark
        if s.step < c.warmup or (s.budget_updates and not validations):
            return
        steps = s.step - s.mark_step  # >= 1: the mark is before this update
        train = (s.elapsed - s.mark_elapsed - s.valid_seconds) / steps
        valid = s.valid_seconds / validations if validations else 0.0  # one validation
        seconds = train + valid / c.valid_every
        total = budget_updates(s.step, s.elapsed, seconds, c.max_minutes)
        total, seconds, train, valid = from_main(
            self.world, [total, seconds, train, valid], self.device
        )
        was, started = s.budget_updates, s.mark_step
        s.decay_from, s.decay_progress = s.step, self._progress(s.step)
        s.budget_updates, s.budget_minutes, s.update_seconds = int(total), c.max_minutes, seconds
        s.mark_step, s.mark_elapsed, s.valid_seconds = s.step, s.elapsed, 0.0
        measured = f"{train * 1000:.0f} ms/update" + (
            f" and {valid:.1f} s per validation (every {c.valid_every})" if validations else ""
        )
        self.console.log(
            f"--max-minutes {c.max_minutes:g}: {measured} over updates {started}-{s.step}, so"
            f" the learning rate decays ({c.budget_decay}) to 0 at update {s.budget_updates}"
            f"{f' (was {was})' if was else ''}"
        )

    def micro_seeds(self, n: int) -> list[int]:
        """The seeds of the update's ``n`` micro-batches: a function of (seed, update, index)
        alone, whichever process takes the micro-batch and whether or not the run resumed."""
        return [
            int.from_bytes(
                hashlib.blake2b(f"{self.cfg.seed}:{self.state.step}:{i}".encode(), digest_size=8)
                .digest()[:7], "little",
            )
            for i in range(n)
        ]  # fmt: skip

    def eps(self, i: int) -> float:
        """Teacher-forcing probability eps_i of scheduled sampling at update i (from 0)."""
        c = self.cfg
        return teacher_forcing_prob(i, c.scheduled_sampling, c.ss_k, c.ss_min, c.ss_warmup)

    def _decoder_input(self, b: Batch) -> torch.Tensor:
        """Gold ``<s> y`` (teacher forcing), or scheduled sampling's pass-2 input (B, T).

        Pass 1 runs without dropout or gradient, as at inference, and its random choices come
        from a generator of their own: with eps = 1 training equals plain teacher forcing.
        """
        c = self.cfg
        if c.scheduled_sampling == "off" or self.state.step < c.ss_warmup:
            return b.tgt_in
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.dtype):
            logits = self.model(b.src, b.tgt_in)  # (B, T, V)
        self.model.train()
        predicted = model_predictions(logits, c.ss_mix, c.ss_tau, self.ss_generator)
        return mix_inputs(b.tgt_in, predicted, self.eps(self.state.step), self.ss_generator)

    # ----------------------------------------------------------------- validation
    def greedy_bleu(self, split: str, limit: int | None = None) -> float:
        data = self.data[split]
        n = len(data.src) if limit is None else min(limit, len(data.src))
        self.model.eval()
        with autocast(self.device, self.dtype):
            results = translate_ids(self.model, data.src[:n], DecodeConfig())
        hyps = decode(self.tokenizer, [r.hypotheses[0].tokens for r in results])
        return bleu(hyps, data.refs[:n])

    def validate(self) -> dict[str, float]:
        self.model.eval()
        valid = self.data["valid"]
        tf = teacher_forced(self.model, valid.src, valid.tgt, self.cfg.max_tokens, self.dtype)
        score = self.greedy_bleu("valid", self.cfg.valid_bleu_size)
        if score > self.state.best_bleu:
            self.state.best_bleu, self.state.best_step, self.state.stale_validations = (
                score,
                self.state.step,
                0,
            )
            atomic_torch_save(self.run_dir / "model.pt", self.model.state_dict())
        else:
            self.state.stale_validations += 1
        if self.cfg.average:
            state = self.model.state_dict()
            save_checkpoint(self.run_dir, self.state.step, state, self.cfg.average)
        return {
            "valid_loss": tf.xent,
            "valid_ppl": tf.ppl,
            "valid_acc": tf.accuracy,
            "valid_bleu": score,
        }

    def _validate_and_report(self) -> None:
        """Validate, log the metrics to log.jsonl and print them, then save last.pt with the
        validation's seconds counted (training time, and validation time for the budget)."""
        start, s = time.perf_counter(), self.state
        m = self.validate()
        self._log(m)  # its elapsed: the time of the weights it scored
        self.console.log(
            f"step {s.step}: valid loss {m['valid_loss']:.3f}  ppl {m['valid_ppl']:.2f}"
            f"  BLEU {m['valid_bleu']:.2f}  (best {s.best_bleu:.2f} at step {s.best_step})"
        )
        spent = time.perf_counter() - start
        s.elapsed += spent
        s.valid_seconds += spent
        self._save_last()

    def _keep_average(self) -> None:
        """Average the last ``average`` validation checkpoints and score the mean on the
        validation set; it becomes model.pt only if its BLEU is at least the best checkpoint's."""
        s, paths = self.state, checkpoint_paths(self.run_dir)[-self.cfg.average :]
        if len(paths) < 2:
            self.console.log(f"not averaging: {len(paths)} validation checkpoint(s)")
            return
        averaged = average_state_dicts(load_state(p) for p in paths)
        self.model.load_state_dict(averaged)
        score = self.greedy_bleu("valid", self.cfg.valid_bleu_size)
        kept = score >= s.best_bleu
        if kept:
            atomic_torch_save(self.run_dir / "model.pt", averaged)
        names = [p.stem for p in paths]
        self._log(
            {"averaged": names, "average_bleu": score, "best_bleu": s.best_bleu,
             "best_step": s.best_step, "kept": "average" if kept else "best"}
        )  # fmt: skip
        self.console.log(
            f"average of {len(paths)} checkpoints ({names[0]} to {names[-1]}): valid BLEU"
            f" {score:.2f}, best single {s.best_bleu:.2f} at step {s.best_step};"
            f" model.pt is {'the average' if kept else f'step {s.best_step}'}"
        )

    def _skip_update(self) -> None:
        """Count an update skipped for a non-finite loss or gradient; too many in a row stop
        the run, with last.pt as it was (no NaN weight is ever saved)."""
        s = self.state
        s.skipped += 1
        s.skipped_in_a_row += 1
        self._log({"skipped_update": "non-finite loss or gradient", "skipped": s.skipped})
        if s.skipped_in_a_row >= MAX_NONFINITE:
            kept = "last.pt keeps its last save" if (self.run_dir / "last.pt").exists() else (
                "nothing was saved yet")  # fmt: skip
            raise TformerError(
                f"{MAX_NONFINITE} updates in a row had a non-finite loss or gradient after step"
                f" {s.step} (none was applied; {kept}): try a lower --lr or --precision fp32"
            )

    # ----------------------------------------------------------------- loop
    def _log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to log.jsonl (rank 0) with the step and the epoch (1-based) it
        belongs to and the seconds of training so far (a validation's: up to its start), and
        its numbers to TensorBoard with --tensorboard."""
        if not self.world.main:
            return
        s = self.state
        epoch = s.epoch if s.batch_in_epoch == 0 and s.step else s.epoch + 1  # one just ended?
        with open(self.run_dir / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": s.step, "epoch": epoch, "elapsed": s.elapsed, **record}))
            f.write("\n")
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.board.add_scalar(key, value, s.step)

    def _agree_stop(self, interrupted: list[bool]) -> str | None:
        """Whether to stop after this update, decided once for every rank: rank 0's stopping
        rules (its clock, its validations) or a Ctrl-C on any rank."""
        w = self.world
        reason = "interrupted (Ctrl-C or SIGTERM)" if interrupted[0] else None
        if w.main:
            reason = reason or self._stop_reason()
        if w.size > 1 and agree(w, [reason is not None], self.device)[0] and reason is None:
            interrupted[0] = w.main  # only a Ctrl-C elsewhere stops rank 0 without a reason
            reason = "interrupted (Ctrl-C or SIGTERM)" if w.main else "stopped with rank 0"
        return reason

    def _stop_reason(self) -> str | None:
        cfg, s = self.cfg, self.state
        if cfg.max_steps and s.step >= cfg.max_steps:
            return f"reached --max-steps {cfg.max_steps}"
        if cfg.max_epochs and s.epoch >= cfg.max_epochs:
            return f"reached --epochs {cfg.max_epochs}"
        if cfg.max_minutes and s.elapsed >= cfg.max_minutes * 60:
            return f"reached --max-minutes {cfg.max_minutes:g}"
        if cfg.patience and s.stale_validations >= cfg.patience:
            return f"early stop: no better validation BLEU in {cfg.patience} validations"
        return None

    def run(self, quiet: bool = False) -> TrainResult:
        cfg, s = self.cfg, self.state
        if self.done:
            reason = self._stop_reason() or ""
            limit = next((o for o in ("--max-steps", "--epochs") if o in reason), None)
            later = (
                f"a later {limit} (0: no limit)" if limit else
                "a later --max-minutes" if "--max-minutes" in reason else
                "a larger --patience (0: no early stopping)"
            )  # fmt: skip
            self.console.log(
                f"{self.run_dir} already finished at update {s.step} ({reason}, which still"
                f" applies): nothing to do; {later} trains on"
            )
            return TrainResult(self.run_dir, s, None, reason)
        n_params = sum(p.numel() for p in self.model.parameters())
        first = self._epoch_batches(s.epoch)
        longest = max(self.lengths)  # a pair over --max-tokens gets a batch of its own
        size = f"<= {cfg.max_tokens}" if longest <= cfg.max_tokens else f"<= {longest} (one pair)"
        self.console.log(
            f"model {n_params / 1e6:.2f}M parameters on {self.device.type}"
            f"{f' x {self.world.size} processes (DDP)' if self.world.size > 1 else ''}"
            f" ({precision_name(self.device, self.dtype)});"
            f" {len(self.lengths)} training pairs,"
            f" {len(first)} batches/epoch of {size} tokens"
            f" ({padding_waste(first, self.lengths):.0%} padding)"
        )
        total = cfg.max_steps or (
            cfg.max_epochs * len(first) // cfg.accum if cfg.max_epochs else None
        )
        w, per_update = self.world, max(cfg.accum, self.world.size)
        progress = make_progress("train", self.console, disable=quiet or not w.main)
        rate_tokens, rate_start = 0, time.perf_counter()
        with stop_on_interrupt() as interrupted, progress, oom_hint(cfg.max_tokens):
            stopped_by = self._agree_stop(interrupted)  # a resumed run may be past its limits
            task = progress.add_task("train", total=total, completed=s.step, info="")
            while stopped_by is None:
                batches = self._epoch_batches(s.epoch)
                while s.batch_in_epoch < len(batches) and stopped_by is None:
                    t0 = time.perf_counter()
                    group = batches[s.batch_in_epoch : s.batch_in_epoch + per_update]
                    loss, n_tokens, made = self._step(group)
                    s.batch_in_epoch += len(group)
                    s.elapsed += time.perf_counter() - t0
                    if not made:
                        self._skip_update()
                    else:
                        kill_point("update")  # tests: die with this update's work unsaved
                        s.skipped_in_a_row = 0
                        s.tgt_tokens += n_tokens
                        rate_tokens += n_tokens
                        if s.step % LOG_EVERY == 0:
                            now = time.perf_counter()
                            tps = rate_tokens / (now - rate_start)
                            rate_tokens, rate_start = 0, now
                            if w.size > 1:  # each rank holds its share of the mean
                                dist.all_reduce(loss)
                            lr, mean_loss = self.lr(s.step), loss.item()
                            info = f"loss {mean_loss:.3f}  lr {lr:.2e}  {tps:,.0f} tok/s"
                            progress.update(task, info=info)
                            record = {"loss": mean_loss, "lr": lr, "tgt_tokens_per_s": tps}
                            if cfg.scheduled_sampling != "off":  # of the update just made
                                record["eps"] = self.eps(s.step - 1)
                            self._log(record)
                        progress.update(task, completed=s.step)
                        t0, counted = time.perf_counter(), s.elapsed
                        if s.step % cfg.valid_every == 0 and w.main:
                            self._validate_and_report()
                        elif cfg.save_every and t0 - self.last_save >= cfg.save_every * 60:
                            self._save_last()
                        s.elapsed = counted + time.perf_counter() - t0  # what it counted too
                        rate_start += time.perf_counter() - t0
                    stopped_by = self._agree_stop(interrupted)
                if s.batch_in_epoch >= len(batches):
                    s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                    stopped_by = stopped_by or self._agree_stop(interrupted)
            if not interrupted[0]:
                progress.update(task, total=s.step, completed=s.step)  # epochs vary by a batch
        if not w.main:  # rank 0 alone validates, saves and reports
            return TrainResult(self.run_dir, s, None, stopped_by or "", interrupted[0])
        if s.step % cfg.valid_every and not interrupted[0]:
            self._validate_and_report()  # score the final weights too: the best is really the best
        else:
            self._save_last()
        best = (
            f"best valid BLEU {s.best_bleu:.2f} at step {s.best_step}"
            if s.best_step
            else "no validation yet"
        )
        peak = peak_memory_mib(self.device)
        self._log({"stopped_by": stopped_by, "peak_memory_mib": peak})
        self.console.log(f"stopped: {stopped_by}; {best}; peak memory {peak:,.0f} MiB")
        if cfg.average and not interrupted[0]:
            self._keep_average()
        test_bleu = None
        if not interrupted[0] and (self.run_dir / "model.pt").exists():
            self.model.load_state_dict(load_state(self.run_dir / "model.pt"))
            test_bleu = self.greedy_bleu("test")
            self._log({"test_bleu": test_bleu})
        if self.board is not None:
            self.board.close()
        return TrainResult(self.run_dir, s, test_bleu, stopped_by or "", interrupted[0])


# What ``--compile auto`` does for the training step: eager, since compiling measured no faster
# on any device. ``forward_loss`` under ``torch.compile(dynamic=True)`` against eager (3+3
# layers, d 256, V 8k, pre-LN, 4,096-token batches):
# - CPU (AMD EPYC Zen 4 with AVX512-BF16, 2 threads, torch 2.13): whole steps on the same batch
#   back to back, order alternating, 26 pairs, compiled/eager speed, median (quartiles): fp32
#   0.96x (0.77-1.24), bf16 0.83x (0.77-1.14), after 20-147 s of compiling. The eager step is
#   79% (fp32) and 65% (bf16) matmul time; Inductor's fused CPU kernels for the rest (dropout
#   masks, autocast casts, the loss's passes over the logits) did not beat eager's.
# - CPU with AMX (an Intel Xeon, 2 cores pinned, torch 2.11, bf16, `bench_train.py --device cpu
#   --compile`), where matmuls are a third of the eager step: eager 589 ms per update, compiled
#   771 (after 105 s of compiling).
# - CUDA (one H200, torch 2.11, bf16 autocast, `bench_train.py --device cuda --compile`): eager
#   16 ms per update, compiled 17 (after 29 s of compiling); at 16,384-token batches eager 17,
#   compiled 77: the step took as long at 4x the tokens, bound by the host launching kernels.
COMPILE_PAYS = False
