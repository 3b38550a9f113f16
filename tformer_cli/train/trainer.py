"""The training loop: label-smoothed teacher forcing, AdamW with warm-up and inverse-sqrt decay,
periodic validation (loss, perplexity, greedy BLEU), best/last checkpoints, resume, Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from tformer_cli.checkpoint import (
    RunConfig,
    atomic_torch_save,
    average_state_dicts,
    checkpoint_paths,
    load_state,
    save_checkpoint,
)
from tformer_cli.config import DecodeConfig, ModelConfig, TrainConfig
from tformer_cli.console import make_progress
from tformer_cli.data.batching import Batch, make_batch, padding_waste, token_batches
from tformer_cli.data.corpus import load_corpus
from tformer_cli.data.data_cache import CACHE_DIR, DataCache
from tformer_cli.data.tokenizer import PAD_ID, decode, load_tokenizer
from tformer_cli.decode.search import translate_ids
from tformer_cli.device import autocast, resolve_device, resolve_precision, setup_threads
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write
from tformer_cli.model import Transformer
from tformer_cli.report.evaluation import bleu, teacher_forced
from tformer_cli.train.loss import label_smoothed_loss
from tformer_cli.train.scheduled_sampling import (
    check_schedule,
    mix_inputs,
    model_predictions,
    teacher_forcing_prob,
)

LOG_EVERY = 25  # steps between log.jsonl lines


@dataclass
class Split:
    """An encoded split: token ids without specials, and the raw target text for BLEU."""

    src: list[list[int]]
    tgt: list[list[int]]
    refs: list[str]


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


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    state: TrainState
    test_bleu: float | None
    stopped_by: str
    interrupted: bool = False  # by Ctrl-C: last.pt holds where to resume


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``cfg.lr`` over ``warmup`` steps, then 1/sqrt(step) decay (paper 5.3)."""
    step = max(step, 1)
    return cfg.lr * min(step / cfg.warmup, math.sqrt(cfg.warmup / step))


def train_step(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    batches: list[Batch],
    decoder_inputs: list[torch.Tensor],
    cfg: TrainConfig,
    device: torch.device,
    dtype: torch.dtype | None,
) -> tuple[float, int]:
    """One update: forward (autocast), label-smoothed loss per target token, backward over the
    accumulated batches, clipping, AdamW. Returns (mean loss per target token, target tokens)."""
    model.train()
    n_tokens = sum(b.n_tgt_tokens for b in batches)
    total = 0.0
    for b, y in zip(batches, decoder_inputs, strict=True):
        real = b.tgt_out != PAD_ID  # (B, T): the output layer runs on real positions only
        with autocast(device, dtype):
            logits = model(b.src, y, at=real)  # (N, V)
        loss = label_smoothed_loss(logits, b.tgt_out[real], cfg.label_smoothing) / n_tokens
        loss.backward()
        total += loss.item()
    if cfg.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, n_tokens


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with the paper's betas (0.9, 0.98), eps 1e-9, no weight decay; PyTorch's fused
    kernel on CPU and CUDA (one pass over all parameters instead of ~10 ops per tensor)."""
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=fused
    )


def prepare(
    run_dir: Path, cfg: TrainConfig, console: Console, resume: bool
) -> tuple[Any, dict[str, Split]]:
    """Load the corpus, get the run's tokenizer (on resume its own) and every split encoded,
    both through the cache beside the runs (``data_cache.py``); drop training pairs over max_len.

    The run folder is created only once the corpus and the tokenizer are ready, so bad data or
    bad tokenizer settings leave nothing.
    """
    corpus = load_corpus(cfg.data, src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang, seed=cfg.seed)
    cache = DataCache(run_dir.parent / CACHE_DIR, corpus)
    tok_path = run_dir / "tokenizer.json"
    if resume:
        tok = load_tokenizer(tok_path)
    else:
        cached, hit = cache.tokenizer(cfg.tokenizer_kind, cfg.vocab_size)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(tok_path, lambda tmp: shutil.copyfile(cached, tmp))
        tok = load_tokenizer(tok_path)
        how = (
            f"reusing the cached {cfg.tokenizer_kind} tokenizer from {cached.parent}"
            if hit
            else f"trained a {cfg.tokenizer_kind} tokenizer"
        )
        console.log(f"{how}: {tok.get_vocab_size()} types")
    encoded, entry, hit = cache.encoded(tok_path)
    if hit:
        n = sum(len(refs) for _, _, refs in encoded.values())
        console.log(f"reusing cached tokenized data from {entry} ({n} pairs)")
    else:
        console.log(f"tokenized data: cached at {entry}")
    splits = {}
    for name, (src, tgt, refs) in encoded.items():
        if name == "train":
            keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) < cfg.max_len]
            if len(keep) < len(src):
                console.log(
                    f"skipped {len(src) - len(keep)} training pairs over {cfg.max_len} tokens"
                )
            if not keep:
                if not resume:  # leave nothing, as bad data does
                    tok_path.unlink()
                    with suppress(OSError):
                        run_dir.rmdir()
                raise TformerError(
                    f"no training pairs left: all {len(src)} have {cfg.max_len} tokens or more"
                    " on a side (--max-len)"
                )
            src, tgt, refs = [src[i] for i in keep], [tgt[i] for i in keep], [refs[i] for i in keep]
        splits[name] = Split(src, tgt, refs)
    return tok, splits


@contextmanager
def stop_on_interrupt() -> Iterator[list[bool]]:
    """A first Ctrl-C sets a flag, so the loop finishes its step and saves; a second aborts."""
    flag = [False]

    def handler(signum: int, frame: Any) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


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
    ) -> None:
        self.run_dir, self.cfg, self.console = run_dir, cfg, console
        setup_threads()
        torch.manual_seed(cfg.seed)
        if resume:
            saved = RunConfig.load(run_dir)
            model_cfg, self.cfg = saved.model, dataclasses.replace(saved.train, **_overrides(cfg))
            cfg = self.cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_precision(cfg.precision, self.device, model_cfg.d_model)
        self.tokenizer, self.data = prepare(run_dir, cfg, console, resume)
        model_cfg = dataclasses.replace(model_cfg, vocab_size=self.tokenizer.get_vocab_size())
        RunConfig(model_cfg, cfg).save(run_dir)
        self.model = Transformer(model_cfg).to(self.device)
        self.optimizer = make_optimizer(self.model, cfg)
        self.state = TrainState()
        check_schedule(cfg.scheduled_sampling, cfg.ss_k, cfg.ss_mix)
        # scheduled sampling's own random numbers, drawn on the device the batches live on
        self.ss_generator = torch.Generator(self.device).manual_seed(cfg.seed + 1)
        if resume:
            self._load_last()
        self.lengths = [
            max(len(s), len(t)) + 1
            for s, t in zip(self.data["train"].src, self.data["train"].tgt, strict=True)
        ]

    # ----------------------------------------------------------------- checkpoints
    def _save_last(self) -> None:
        atomic_torch_save(
            self.run_dir / "last.pt",
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "state": dataclasses.asdict(self.state),
                "rng": {"torch": torch.get_rng_state(), "ss": self.ss_generator.get_state()},
            },
        )

    def _load_last(self) -> None:
        ckpt = load_state(self.run_dir / "last.pt")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.state = TrainState(**ckpt["state"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        self.ss_generator.set_state(ckpt["rng"]["ss"])
        self.console.log(
            f"resumed {self.run_dir} at step {self.state.step}, epoch {self.state.epoch + 1}"
        )

    # ----------------------------------------------------------------- steps
    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """This epoch's batches: a function of (seed, epoch) alone, so resuming replays them."""
        return token_batches(
            self.lengths, self.cfg.max_tokens, random.Random(self.cfg.seed * 1000 + epoch)
        )

    def _batch(self, idx: list[int]) -> Batch:
        train = self.data["train"]
        return make_batch([train.src[i] for i in idx], [train.tgt[i] for i in idx]).to(self.device)

    def _step(self, batches: list[list[int]]) -> tuple[float, int]:
        """One update from ``accum`` batches: (mean loss per target token, target tokens)."""
        lr = lr_at(self.state.step + 1, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = [self._batch(idx) for idx in batches]
        inputs = [self._decoder_input(b) for b in parts]
        loss, n_tokens = train_step(
            self.model, self.optimizer, parts, inputs, self.cfg, self.device, self.dtype
        )
        self.state.step += 1
        return loss, n_tokens

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
        self._save_last()
        return {
            "valid_loss": tf.xent,
            "valid_ppl": tf.ppl,
            "valid_acc": tf.accuracy,
            "valid_bleu": score,
        }

    def _validate_and_report(self) -> None:
        """Validate, log the metrics to log.jsonl and print them."""
        m, s = self.validate(), self.state
        self._log(m)
        self.console.log(
            f"step {s.step}: valid loss {m['valid_loss']:.3f}  ppl {m['valid_ppl']:.2f}"
            f"  BLEU {m['valid_bleu']:.2f}  (best {s.best_bleu:.2f} at step {s.best_step})"
        )

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

    # ----------------------------------------------------------------- loop
    def _log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to log.jsonl with the step and the epoch (1-based) it belongs to."""
        s = self.state
        epoch = s.epoch if s.batch_in_epoch == 0 and s.step else s.epoch + 1  # one just ended?
        with open(self.run_dir / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": s.step, "epoch": epoch, **record}) + "\n")

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
        n_params = sum(p.numel() for p in self.model.parameters())
        first = self._epoch_batches(s.epoch)
        longest = max(self.lengths)  # a pair over --max-tokens gets a batch of its own
        size = f"<= {cfg.max_tokens}" if longest <= cfg.max_tokens else f"<= {longest} (one pair)"
        self.console.log(
            f"model {n_params / 1e6:.2f}M parameters on {self.device.type}"
            f" ({'fp32' if self.dtype is None else 'bf16 autocast'});"
            f" {len(self.lengths)} training pairs,"
            f" {len(first)} batches/epoch of {size} tokens"
            f" ({padding_waste(first, self.lengths):.0%} padding)"
        )
        total = cfg.max_steps or (
            cfg.max_epochs * len(first) // cfg.accum if cfg.max_epochs else None
        )
        progress = make_progress("train", self.console, disable=quiet)
        stopped_by = self._stop_reason()  # a resumed run may already be past its limits
        rate_tokens, rate_start = 0, time.perf_counter()
        with stop_on_interrupt() as interrupted, progress:
            task = progress.add_task("train", total=total, completed=s.step, info="")
            while stopped_by is None:
                batches = self._epoch_batches(s.epoch)
                while s.batch_in_epoch < len(batches) and stopped_by is None:
                    t0 = time.perf_counter()
                    group = batches[s.batch_in_epoch : s.batch_in_epoch + cfg.accum]
                    loss, n_tokens = self._step(group)
                    s.batch_in_epoch += len(group)
                    s.tgt_tokens += n_tokens
                    rate_tokens += n_tokens
                    s.elapsed += time.perf_counter() - t0
                    if s.step % LOG_EVERY == 0:
                        now = time.perf_counter()
                        tps = rate_tokens / (now - rate_start)
                        rate_tokens, rate_start = 0, now
                        lr = lr_at(s.step, cfg)
                        info = f"loss {loss:.3f}  lr {lr:.2e}  {tps:,.0f} tok/s"
                        progress.update(task, info=info)
                        record = {"loss": loss, "lr": lr, "tgt_tokens_per_s": tps}
                        if cfg.scheduled_sampling != "off":  # of the update just made
                            record["eps"] = self.eps(s.step - 1)
                        self._log({**record, "elapsed": s.elapsed})
                    progress.update(task, completed=s.step)
                    if s.step % cfg.valid_every == 0:
                        t0 = time.perf_counter()
                        self._validate_and_report()
                        s.elapsed += time.perf_counter() - t0
                        rate_start += time.perf_counter() - t0
                    stopped_by = "interrupted (Ctrl-C)" if interrupted[0] else self._stop_reason()
                if s.batch_in_epoch >= len(batches):
                    s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                    stopped_by = stopped_by or self._stop_reason()
            if not interrupted[0]:
                progress.update(task, total=s.step, completed=s.step)  # epochs vary by a batch
        if s.step % cfg.valid_every and not interrupted[0]:
            self._validate_and_report()  # score the final weights too: the best is really the best
        else:
            self._save_last()
        best = (
            f"best valid BLEU {s.best_bleu:.2f} at step {s.best_step}"
            if s.best_step
            else "no validation yet"
        )
        self.console.log(f"stopped: {stopped_by}; {best}")
        if cfg.average and not interrupted[0]:
            self._keep_average()
        test_bleu = None
        if not interrupted[0] and (self.run_dir / "model.pt").exists():
            self.model.load_state_dict(load_state(self.run_dir / "model.pt"))
            test_bleu = self.greedy_bleu("test")
            self._log({"test_bleu": test_bleu})
        return TrainResult(self.run_dir, s, test_bleu, stopped_by or "", interrupted[0])


# On --resume only these may change: the stopping rules, the save interval and the device (a
# run moved between CPU and CUDA continues, though not bit for bit); any other setting would
# break exact continuation.
RESUME_OVERRIDES = ("max_steps", "max_epochs", "max_minutes", "patience", "save_every", "device")


def _overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that replace a resumed run's own."""
    return {k: getattr(cfg, k) for k in RESUME_OVERRIDES}


def new_run_dir(runs_dir: Path, name: str | None, data: str) -> Path:
    """``runs/<name>``, or ``runs/<data>-<timestamp>``; refuses to overwrite a trained run."""
    if name is None:
        stem = Path(data.removeprefix("hf:")).name or "run"
        name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if name in ("", ".", "..") or any(sep in name for sep in ("/", "\\")):
        raise TformerError(f"--name {name!r} must be a plain folder name inside {runs_dir}")
    run_dir = runs_dir / name
    if (run_dir / "model.pt").exists() or (run_dir / "last.pt").exists():
        raise TformerError(f"{run_dir} already holds a trained run: use --resume or another --name")
    return run_dir
