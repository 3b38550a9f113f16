"""What surrounds the training loop of ``trainer.Trainer``, off the reading path: a run's set-up,
its log (``log.jsonl``, TensorBoard), the validation that keeps the best weights in
``model.pt``, ``last.pt`` (``state.py``), the stopping rules and the end of a run (the average
of the last checkpoints, the test BLEU). ``MAX_NONFINITE`` skipped updates in a row stop it."""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console
from torch.nn.parallel import DistributedDataParallel

from tformer_cli.checkpoint import (
    RunConfig,
    atomic_torch_save,
    average_state_dicts,
    checkpoint_paths,
    load_state,
    load_weights,
    save_checkpoint,
)
from tformer_cli.config import DecodeConfig, ModelConfig, TrainConfig
from tformer_cli.data.batching import Batch, make_batch, padding_waste, plan_batches
from tformer_cli.data.split import lengths
from tformer_cli.data.tokenizer import decode
from tformer_cli.decode.translate import translate_ids
from tformer_cli.device import (
    KEEP_FREE,
    autocast,
    bound_kernel_cache,
    precision_name,
    release_freed_memory,
    resolve_precision,
    setup_threads,
)
from tformer_cli.errors import TformerError
from tformer_cli.files import write_error
from tformer_cli.model import Transformer
from tformer_cli.report.evaluation import bleu, teacher_forced
from tformer_cli.report.runs import lock_run
from tformer_cli.training.distributed import agree, leave_world
from tformer_cli.training.schedule import make_optimizer
from tformer_cli.training.scheduled_sampling import sampled_inputs, teacher_forcing_prob
from tformer_cli.training.setup import (
    RESUME_OVERRIDES,
    load_data,
    placed,
    resumed_configs,
    tensorboard_writer,
)
from tformer_cli.training.state import (
    KillPoints,
    MemoryPeak,
    TokenRate,
    TrainResult,
    TrainState,
    ended_with_test,
    forget_after,
    load_last,
    save_last,
)

LOG_EVERY = 25  # steps between log.jsonl lines
MAX_NONFINITE = 5  # updates in a row with a non-finite loss or gradient that stop the run
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM)"


class TrainerBase:
    """A run folder being trained: all of ``trainer.Trainer`` but the loop and the update."""

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
        self.run_dir = run_dir
        setup_threads()
        bound_kernel_cache()
        torch.manual_seed(cfg.seed)
        if resume:  # the run's own settings, the stopping rules, save interval and device of cfg
            overrides = {k: getattr(cfg, k) for k in RESUME_OVERRIDES}
            model_cfg, cfg = resumed_configs(run_dir, overrides)
        if cfg.max_len > model_cfg.max_positions:
            raise TformerError(
                f"--max-len {cfg.max_len} is more than the model's"
                f" {model_cfg.max_positions} positions"
            )
        self.cfg = cfg
        self.world, self.device = placed(cfg.device)
        self.console = console if self.world.main else Console(quiet=True)
        self.board = tensorboard_writer(tensorboard, self.world.main)  # --tensorboard
        self.dtype = resolve_precision(cfg.precision, self.device, model_cfg.d_model)
        # the targets' tokenizer: an imported model's target side's, else the tokenizer
        self.tokenizer, self.tgt_tokenizer, self.data = load_data(
            run_dir, cfg, self.console, resume, model_cfg.max_positions, self.world
        )
        release_freed_memory()  # what reading the corpus and the tokenizer's training left
        model_cfg = dataclasses.replace(model_cfg, vocab_size=self.tokenizer.get_vocab_size())
        self.model = Transformer(model_cfg).to(self.device)
        if cfg.init_from is not None and not resume:  # fine-tuning: new optimizer and schedule
            load_weights(self.model, Path(cfg.init_from))
            self.console.log(f"weights from {cfg.init_from}/model.pt")
        self.optimizer = make_optimizer(self.model, cfg)
        self.state = TrainState()
        # scheduled sampling's own random numbers, drawn on the device the batches live on
        self.ss_generator = torch.Generator(self.device)
        self.on_event = KillPoints.from_env()  # called at "update" and "save"
        if resume and (run_dir / "last.pt").exists():
            self._load_last()
        # a finished run resumed with no later stopping rule: nothing to do, nothing rewritten
        self.done = resume and self._stop_reason() is not None and ended_with_test(run_dir)
        if self.world.main:
            self._take_run(model_cfg, resume)
        ids = [self.device.index] if self.device.index is not None else None
        ddp = self.world.size > 1
        self.ddp = DistributedDataParallel(self.model, device_ids=ids) if ddp else None
        self.last_save = time.perf_counter()
        train = self.data["train"]
        self.tgt_lengths = lengths(train.tgt)  # (n,) int32: target tokens, for the loss scale
        self.lengths = np.maximum(lengths(train.src), self.tgt_lengths) + 1  # (n,) with </s>
        self.batches: tuple[int, list[np.ndarray]] = (-1, [])  # (epoch, its batches)
        self.rate = TokenRate()
        self.memory = MemoryPeak()  # noted at each log record
        self.bar: Callable[..., None] = lambda **_: None  # the progress bar's update, in run()

    def _take_run(self, model_cfg: ModelConfig, resume: bool) -> None:
        """Rank 0: the run's lock, config.json, and on resume nothing past its step."""
        self.run_lock = lock_run(self.run_dir)  # `tformer runs`: running while this process lives
        if resume and not (self.run_dir / "last.pt").exists():  # said once the run is ours
            self.console.log(f"{self.run_dir} has no last.pt (stopped before its first save):"
                             " starting from step 0 with its saved settings")  # fmt: skip
        if not self.done:
            RunConfig(model_cfg, self.cfg).save(self.run_dir)
        if resume and not self.done:
            forget_after(self.run_dir, self.state.step)

    def close(self) -> None:
        """Leave the process group (DDP), the DDP wrapper and its gradient buckets first."""
        self.ddp = None
        gc.collect()
        leave_world(self.world)

    # ----------------------------------------------------------------- last.pt
    def _save_last(self) -> None:
        if not self.world.main:
            return
        save_last(self.run_dir, self.model, self.optimizer, self.state, self.device, self.on_event)
        self.last_save = time.perf_counter()

    def _load_last(self) -> None:
        self.state, saved_on = load_last(self.run_dir, self.model, self.optimizer)
        self._say(self.state.budget.rebudget(self.state.step, self.state.elapsed, self.cfg))
        saved_on = saved_on or self.device.type
        if saved_on != self.device.type:  # other kernels, other random number generators
            self.console.log(f"note: saved on {saved_on}, resumed on {self.device.type}: training"
                             " continues, but not bit for bit")  # fmt: skip
        self.console.log(
            f"resumed {self.run_dir} at step {self.state.step}, epoch {self.state.epoch + 1}"
        )

    def _say(self, text: str | None) -> None:
        if text is not None:
            self.console.log(text)

    # ----------------------------------------------------------------- an update's data and count
    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This epoch's batches: a function of (seed, epoch) alone, so resuming replays them."""
        if self.batches[0] != epoch:
            order = random.Random(self.cfg.seed * 1000 + epoch)
            self.batches = (epoch, plan_batches(self.lengths, self.cfg.max_tokens, order))
        return self.batches[1]

    def _batch(self, idx: np.ndarray) -> Batch:
        """The pairs at ``idx``, read from the training split (memory-mapped), padded."""
        train = self.data["train"]
        return make_batch([train.src[i] for i in idx], [train.tgt[i] for i in idx]).to(self.device)

    def lr(self, step: int) -> float:
        """The learning rate of update ``step`` (``Budget.lr``)."""
        return self.state.budget.lr(step, self.cfg)

    def eps(self, i: int) -> float:
        """Teacher-forcing probability eps_i of scheduled sampling at update i (from 0)."""
        c = self.cfg
        return teacher_forcing_prob(i, c.scheduled_sampling, c.ss_k, c.ss_min, c.ss_warmup)

    def _decoder_input(self, b: Batch) -> torch.Tensor:
        """Gold ``<s> y`` (teacher forcing), or scheduled sampling's pass-2 input (B, T)."""
        c, step = self.cfg, self.state.step
        if c.scheduled_sampling == "off" or step < c.ss_warmup:
            return b.tgt_in
        return sampled_inputs(
            self.model, b, self.eps(step), c.ss_mix, c.ss_tau, self.ss_generator, self.dtype
        )

    def _after_update(self, loss: torch.Tensor, n_tokens: int, made: bool) -> None:
        """Count the update, then validate or save; or count it skipped (non-finite)."""
        if not made:
            self._skip_update()
            return
        self._count_update(loss, n_tokens)
        self._validate_or_save()

    def _count_update(self, loss: torch.Tensor, n_tokens: int) -> None:
        """Count an update made; log its loss, lr and token rate every ``LOG_EVERY``."""
        s = self.state
        self.on_event("update")  # nothing saved since this update
        s.skipped_in_a_row = 0
        s.tgt_tokens += n_tokens
        self.rate.add(n_tokens)
        if s.step % LOG_EVERY == 0:
            release_freed_memory(keep=KEEP_FREE)  # not each update: the next would fault it in
            tps = self.rate.take()
            if self.world.size > 1:  # each rank holds its share of the mean
                dist.all_reduce(loss)
            lr, mean_loss = self.lr(s.step), loss.item()
            self.bar(info=f"loss {mean_loss:.3f}  lr {lr:.2e}  {tps:,.0f} tok/s")
            record = {"loss": mean_loss, "lr": lr, "tgt_tokens_per_s": tps}
            if self.cfg.scheduled_sampling != "off":  # of the update just made
                record["eps"] = self.eps(s.step - 1)
            self._log(record)
        self.bar(completed=s.step)

    def _skip_update(self) -> None:
        """Count an update skipped (non-finite); too many in a row stop the run."""
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

    # ----------------------------------------------------------------- validation
    def greedy_bleu(self, split: str, limit: int | None = None) -> float:
        data = self.data[split]
        n = len(data.src) if limit is None else min(limit, len(data.src))
        self.model.eval()
        with autocast(self.device, self.dtype):
            results = translate_ids(self.model, data.src[:n], DecodeConfig())
        hyps = decode(self.tgt_tokenizer, [r.hypotheses[0].tokens for r in results])
        return bleu(hyps, data.refs[:n])

    def validate(self) -> dict[str, float]:
        self.model.eval()
        valid = self.data["valid"]
        tf = teacher_forced(self.model, valid.src, valid.tgt, self.cfg.max_tokens, self.dtype)
        score = self.greedy_bleu("valid", self.cfg.valid_bleu_size)
        s = self.state
        if score > s.best_bleu:
            s.best_bleu, s.best_step, s.stale_validations = score, s.step, 0
            atomic_torch_save(self.run_dir / "model.pt", self.model.state_dict())
        else:
            s.stale_validations += 1
        if self.cfg.average:
            save_checkpoint(self.run_dir, s.step, self.model.state_dict(), self.cfg.average)
        return {"valid_loss": tf.xent, "valid_ppl": tf.ppl, "valid_acc": tf.acc,
                "valid_bleu": score}  # fmt: skip

    def _validate_or_save(self) -> None:
        """Validate every --valid-every updates (rank 0), else save last.pt on time."""
        cfg, s = self.cfg, self.state
        t0, counted = time.perf_counter(), s.elapsed
        if s.step % cfg.valid_every == 0 and self.world.main:
            self._validate_and_report()
        elif cfg.save_every and t0 - self.last_save >= cfg.save_every * 60:
            self._save_last()
        s.elapsed = counted + time.perf_counter() - t0  # what it counted too
        self.rate.pause(time.perf_counter() - t0)

    def _validate_and_report(self) -> None:
        """Validate, log and print the metrics, and save last.pt with the seconds counted."""
        start, s = time.perf_counter(), self.state
        release_freed_memory()  # the updates' free heap: decoding starts from what is allocated
        m = self.validate()
        self._log(m)  # its elapsed: the time of the weights it scored
        self.console.log(
            f"step {s.step}: valid loss {m['valid_loss']:.3f}  ppl {m['valid_ppl']:.2f}"
            f"  BLEU {m['valid_bleu']:.2f}  (best {s.best_bleu:.2f} at step {s.best_step})"
        )
        spent = time.perf_counter() - start
        s.elapsed += spent
        s.budget.valid_seconds += spent
        self._save_last()
        release_freed_memory()  # decoding's buffers, kept by glibc for reuse, back to the OS

    def _keep_average(self) -> None:
        """Average the last ``average`` checkpoints: model.pt if its valid BLEU is no worse."""
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

    # ----------------------------------------------------------------- log and stopping
    def _log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to log.jsonl (rank 0) with its step, epoch (1-based) and seconds
        of training so far; its numbers to TensorBoard with --tensorboard."""
        if not self.world.main:
            return
        self.memory.note()
        s = self.state
        epoch = s.epoch if s.batch_in_epoch == 0 and s.step else s.epoch + 1  # one just ended?
        line = json.dumps({"step": s.step, "epoch": epoch, "elapsed": s.elapsed, **record})
        try:  # a full disk may tear the line: read_log drops it, --resume cuts it
            with open(self.run_dir / "log.jsonl", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            raise write_error(self.run_dir / "log.jsonl", e) from None
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.board.add_scalar(key, value, s.step)

    def _agree_stop(self, interrupted: list[bool]) -> str | None:
        """Why to stop after this update, alike on every rank (rank 0's rules, any Ctrl-C)."""
        w = self.world
        reason = INTERRUPTED if interrupted[0] else None
        if w.main:
            reason = reason or self._stop_reason()
        if w.size > 1 and agree(w, [reason is not None], self.device)[0] and reason is None:
            interrupted[0] = w.main  # only a Ctrl-C elsewhere stops rank 0 without a reason
            reason = INTERRUPTED if w.main else "stopped with rank 0"
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

    # ----------------------------------------------------------------- the start and the end
    def _updates(self) -> int | None:
        """The progress bar's total: --max-steps, or --epochs of updates."""
        cfg = self.cfg
        if cfg.max_steps:
            return cfg.max_steps
        first = self._epoch_batches(self.state.epoch)
        return cfg.max_epochs * len(first) // cfg.accum if cfg.max_epochs else None

    def _say_what_trains(self) -> None:
        """The model, the device, the precision and the batches, in one line."""
        n_params = sum(p.numel() for p in self.model.parameters())
        first = self._epoch_batches(self.state.epoch)
        longest = int(self.lengths.max())  # a pair over --max-tokens gets a batch of its own
        limit = self.cfg.max_tokens
        size = f"<= {limit}" if longest <= limit else f"<= {longest} (one pair)"
        self.console.log(
            f"model {n_params / 1e6:.2f}M parameters on {self.device.type}"
            f"{f' x {self.world.size} processes (DDP)' if self.world.size > 1 else ''}"
            f" ({precision_name(self.device, self.dtype)});"
            f" {len(self.lengths)} training pairs,"
            f" {len(first)} batches/epoch of {size} tokens"
            f" ({padding_waste(first, self.lengths):.0%} padding)"
        )

    def _already_finished(self) -> TrainResult:
        """A finished run resumed with no later stopping rule: say so, change nothing."""
        s = self.state
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

    def _finish(self, stopped_by: str, interrupted: bool) -> TrainResult:
        """Rank 0: score (or save) the final weights, log the stop, keep the average where it is
        better, and score model.pt on the test split."""
        cfg, s = self.cfg, self.state
        if not self.world.main:  # rank 0 alone validates, saves and reports
            return TrainResult(self.run_dir, s, None, stopped_by, interrupted)
        if s.step % cfg.valid_every and not interrupted:
            self._validate_and_report()  # score the final weights too: the best is really the best
        else:
            self._save_last()
        best = (
            f"best valid BLEU {s.best_bleu:.2f} at step {s.best_step}"
            if s.best_step
            else "no validation yet"
        )
        memory, record = self.memory.line(self.device)
        self._log({"stopped_by": stopped_by, **record})
        self.console.log(f"stopped: {stopped_by}; {best}; {memory}")
        if cfg.average and not interrupted:
            self._keep_average()
        test_bleu = None
        if not interrupted and (self.run_dir / "model.pt").exists():
            self.model.load_state_dict(load_state(self.run_dir / "model.pt"))
            test_bleu = self.greedy_bleu("test")
            self._log({"test_bleu": test_bleu})
        if self.board is not None:
            self.board.close()
        return TrainResult(self.run_dir, s, test_bleu, stopped_by, interrupted)
