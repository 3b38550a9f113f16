"""Setting a run up: its data and tokenizer, its folder, the settings of a resumed or fine-tuned
run, and the options that map onto the configs."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.corpus import load_corpus
from tformer_cli.data.data_cache import CACHE_DIR, DataCache
from tformer_cli.data.tokenizer import load_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write


@dataclass
class Split:
    """An encoded split: token ids without specials, and the raw target text for BLEU."""

    src: list[list[int]]
    tgt: list[list[int]]
    refs: list[str]


@contextmanager
def removed_on_failure(run_dir: Path, made: bool) -> Iterator[None]:
    """Remove ``run_dir`` again if it is ``made`` here and what writes its first files fails or
    is interrupted (Ctrl-C while the data is tokenized): no half-made run is left behind."""
    try:
        yield
    except BaseException:
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def prepare(
    run_dir: Path, cfg: TrainConfig, console: Console, resume: bool, max_positions: int
) -> tuple[Any, dict[str, Split]]:
    """Load the corpus, get the run's tokenizer (on resume its own) and every split encoded,
    both through the cache beside the runs (``data_cache.py``); drop training pairs over max_len
    and validation/test pairs longer than the model's positions (as ``tformer eval`` does).

    The run folder is created only once the corpus and the tokenizer are ready, so bad data or
    bad tokenizer settings leave nothing.
    """
    corpus = load_corpus(
        cfg.data, src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang, src_file=cfg.src_file,
        tgt_file=cfg.tgt_file, valid_src_file=cfg.valid_src_file,
        valid_tgt_file=cfg.valid_tgt_file, seed=cfg.seed,
    )  # fmt: skip
    cache = DataCache(run_dir.parent / CACHE_DIR, corpus)
    tok_path = run_dir / "tokenizer.json"
    if resume:
        tok = load_tokenizer(tok_path)
    elif cfg.tokenizer_file is not None:  # a ready one: checked before the run folder exists
        load_tokenizer(Path(cfg.tokenizer_file))
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(tok_path, lambda tmp: shutil.copyfile(cfg.tokenizer_file, tmp))
        tok = load_tokenizer(tok_path)
        console.log(f"using the tokenizer {cfg.tokenizer_file}: {tok.get_vocab_size()} types")
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
            if not keep:  # the caller removes the new run folder, as for bad data
                raise TformerError(
                    f"no training pairs left: all {len(src)} have {cfg.max_len} tokens or more"
                    " on a side (--max-len)"
                )
        else:
            longest = max_positions - 1  # room for </s> (source) or <s> (target)
            keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) <= longest]
            if src and not keep:
                raise TformerError(
                    f"every {name} pair ({len(src)}) is longer than the model's {longest} tokens"
                )
            if len(keep) < len(src):
                console.log(
                    f"skipped {len(src) - len(keep)} {name} pairs longer than the model's"
                    f" {longest} tokens"
                )
        src, tgt, refs = [src[i] for i in keep], [tgt[i] for i in keep], [refs[i] for i in keep]
        splits[name] = Split(src, tgt, refs)
    return tok, splits


# On --resume only these may change: the stopping rules, the save interval and the device (a
# run moved between CPU and CUDA continues, though not bit for bit); any other setting would
# break exact continuation.
RESUME_OVERRIDES = ("max_steps", "max_epochs", "max_minutes", "patience", "save_every", "device")


def _overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that replace a resumed run's own."""
    return {k: getattr(cfg, k) for k in RESUME_OVERRIDES}


def tensorboard_writer(folder: Path) -> Callable[[], Any]:
    """A maker of ``torch.utils.tensorboard.SummaryWriter(folder)``; a one-line error where
    the ``tensorboard`` package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TformerError(
            "--tensorboard needs the tensorboard package: pip install tensorboard"
        ) from None
    return lambda: SummaryWriter(str(folder))


def new_run_dir(runs_dir: Path, name: str | None, data: str) -> Path:
    """``runs/<name>``, or ``runs/<data>-<timestamp>``; refuses to overwrite a trained run."""
    if name is None:
        stem = Path(data.removeprefix("hf:")).name or "run"
        name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if name in ("", ".", "..") or any(sep in name for sep in ("/", "\\")):
        raise TformerError(f"--name {name!r} must be a plain folder name inside {runs_dir}")
    if name.startswith("."):  # hidden, as the data cache (runs/.cache) is: tformer runs skips it
        raise TformerError(f"--name {name!r} must not start with a dot")
    run_dir = runs_dir / name
    if (run_dir / "model.pt").exists() or (run_dir / "last.pt").exists():
        raise TformerError(f"{run_dir} already holds a trained run: use --resume or another --name")
    return run_dir


# train's options -> (config table, field); "layers" sets both stacks
TRAIN_OPTIONS: dict[str, tuple[str, ...]] = {
    "data": ("train", "data"), "src": ("train", "src_lang"), "tgt": ("train", "tgt_lang"),
    "src_file": ("train", "src_file"), "tgt_file": ("train", "tgt_file"),
    "valid_src_file": ("train", "valid_src_file"), "valid_tgt_file": ("train", "valid_tgt_file"),
    "vocab_size": ("train", "vocab_size"), "tokenizer": ("train", "tokenizer_kind"),
    "tokenizer_file": ("train", "tokenizer_file"), "init_from": ("train", "init_from"),
    "d_model": ("model", "d_model"), "heads": ("model", "h"), "d_ff": ("model", "d_ff"),
    "layers": ("model", "n_encoder_layers", "n_decoder_layers"), "dropout": ("model", "dropout"),
    "positional": ("model", "positional"), "norm": ("model", "norm"),
    "tie": ("model", "tie_embeddings"), "max_tokens": ("train", "max_tokens"),
    "max_len": ("train", "max_len"), "lr": ("train", "lr"), "warmup": ("train", "warmup"),
    "decay": ("train", "decay"), "compile": ("train", "compile"),
    "label_smoothing": ("train", "label_smoothing"), "clip_norm": ("train", "clip_norm"),
    "accum": ("train", "accum"), "max_steps": ("train", "max_steps"),
    "epochs": ("train", "max_epochs"), "max_minutes": ("train", "max_minutes"),
    "valid_every": ("train", "valid_every"), "valid_bleu_size": ("train", "valid_bleu_size"),
    "save_every": ("train", "save_every"),
    "patience": ("train", "patience"), "average": ("train", "average"), "seed": ("train", "seed"),
    "beam_alpha": ("train", "beam_alpha"),
    "precision": ("train", "precision"), "device": ("train", "device"),
    "scheduled_sampling": ("train", "scheduled_sampling"), "ss_k": ("train", "ss_k"),
    "ss_min": ("train", "ss_min"), "ss_warmup": ("train", "ss_warmup"),
    "ss_mix": ("train", "ss_mix"), "ss_tau": ("train", "ss_tau"),
}  # fmt: skip


def fine_tuning(
    run: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, given: set[str]
) -> tuple[ModelConfig, TrainConfig]:
    """The settings of a run that starts from ``run``'s weights: its model settings and
    tokenizer, the rest as given. A model option given that contradicts them is an error."""
    from tformer_cli.checkpoint import RunConfig, load_weights, resolve_run
    from tformer_cli.model import Transformer

    run = resolve_run(run)
    if not (run / "model.pt").is_file():
        raise TformerError(f"--init-from {run}: no model.pt (a run that has validated once)")
    source = RunConfig.load(run).model
    load_weights(Transformer(source), run)  # before any folder is made: a mismatch is an error
    for option in sorted(given):
        table, *fields = TRAIN_OPTIONS[option]
        for field in fields:
            if table == "model" and getattr(model_cfg, field) != getattr(source, field):
                raise TformerError(
                    f"--{option.replace('_', '-')} {getattr(model_cfg, field)} contradicts"
                    f" {run}'s {getattr(source, field)}: --init-from takes the run's model"
                )
    if "tokenizer_file" in given:
        raise TformerError("--init-from takes the run's tokenizer: give no --tokenizer-file")
    tokenizer = str((run / "tokenizer.json").resolve())
    max_len = (
        train_cfg.max_len if "max_len" in given else min(train_cfg.max_len, source.max_positions)
    )
    return source, dataclasses.replace(
        train_cfg, init_from=str(run.resolve()), tokenizer_file=tokenizer, max_len=max_len
    )
