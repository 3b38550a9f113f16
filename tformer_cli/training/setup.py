"""Setting a run up, for the CLI and the Python API alike: the settings of a new run (a recipe,
the options given, ``--init-from``) or a resumed one, its folder, device and data."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import DatasetDict
from rich.console import Console
from tokenizers import Tokenizer

from tformer_cli.checkpoint import (
    STAMP,
    TARGET_TOKENIZER,
    RunConfig,
    load_weights,
    resolve_run,
)
from tformer_cli.config import TRAIN_OPTIONS, ModelConfig, TrainConfig, from_dict
from tformer_cli.console import make_progress
from tformer_cli.data.corpus import PARALLEL_FILES, fingerprinted_corpus, kept_data
from tformer_cli.data.data_cache import CACHE_DIR, DataCache
from tformer_cli.data.split import Split, fits_positions, lengths
from tformer_cli.data.tokenizer import load_tokenizer
from tformer_cli.device import resolve_device
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write
from tformer_cli.model import Transformer
from tformer_cli.training.distributed import World, barrier, init_world

# On --resume only these may change: the stopping rules, the save interval and the device (a
# run moved between CPU and CUDA continues, though not bit for bit); any other setting would
# break exact continuation.
RESUME_OVERRIDES = ("max_steps", "max_epochs", "max_minutes", "patience", "save_every", "device")


def new_configs(
    options: Mapping[str, Any], recipe: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[ModelConfig, TrainConfig]:
    """The settings of a new run: the ``options`` given (named as ``config.TRAIN_OPTIONS``),
    then the ``recipe``'s, then the defaults; local data paths absolute; ``fine_tuning``."""
    tables = {table: dict((recipe or {}).get(table, {})) for table in ("model", "train")}
    for option, value in options.items():
        declared = TRAIN_OPTIONS[option]
        for field in declared.fields:
            tables[declared.table][field] = str(value) if isinstance(value, Path) else value
    train_cfg = from_dict(TrainConfig, tables["train"])
    if train_cfg.src_file is not None and "data" in options:
        raise TformerError("give --data or --src-file/--tgt-file, not both")
    train_cfg = kept_data(train_cfg)
    model_cfg = from_dict(ModelConfig, {"vocab_size": train_cfg.vocab_size, **tables["model"]})
    if options.get("init_from") is not None:
        return fine_tuning(Path(options["init_from"]), model_cfg, train_cfg, set(options))
    if options.get("tokenizer_file") is not None:
        tokenizer = str(Path(options["tokenizer_file"]).resolve())
        train_cfg = dataclasses.replace(train_cfg, tokenizer_file=tokenizer)
    return model_cfg, train_cfg


def fine_tuning(
    run: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, given: set[str]
) -> tuple[ModelConfig, TrainConfig]:
    """The settings of a run that starts from ``run``'s weights: its model settings and
    tokenizer, the rest as given; a model option given that contradicts them is an error."""
    run = resolve_run(run)
    if not (run / "model.pt").is_file():
        raise TformerError(f"--init-from {run}: no model.pt (a run that has validated once)")
    source = RunConfig.load(run).model
    load_weights(Transformer(source), run)  # before any folder is made: a mismatch is an error
    for option in sorted(given):
        declared = TRAIN_OPTIONS[option]
        for field in declared.fields:
            if declared.table == "model" and getattr(model_cfg, field) != getattr(source, field):
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


def resume_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A resumed run's ``options``: (the ``RESUME_OVERRIDES`` they set, the others, sorted)."""
    fields = {o: TRAIN_OPTIONS[o].fields[0] if o in TRAIN_OPTIONS else "" for o in options}
    overrides = {fields[o]: value for o, value in options.items() if fields[o] in RESUME_OVERRIDES}
    return overrides, sorted(o for o in options if fields[o] not in RESUME_OVERRIDES)


def resumed_configs(
    run_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    ignored: Sequence[str] = (),
    say: Callable[[str], None] | None = None,
) -> tuple[ModelConfig, TrainConfig]:
    """The run's own settings with ``overrides`` (``RESUME_OVERRIDES``); ``say`` gets a note
    naming the options ``ignored``. A model.pt without last.pt cannot resume."""
    saved = RunConfig.load(run_dir)
    if ignored and say is not None:
        names = ", ".join("--" + o.replace("_", "-") for o in ignored)
        say(f"note: {names} ignored: a resumed run keeps its settings")
    train_cfg = dataclasses.replace(saved.train, **(overrides or {}))
    if not (run_dir / "last.pt").exists() and (run_dir / "model.pt").exists():
        raise TformerError(
            f"{run_dir} has a model.pt but no last.pt (the optimizer state and progress"
            f" a resume needs), so it cannot be resumed; to train its weights on, start"
            f" a new run: tformer train --init-from {run_dir} --name NEW"
        )
    return saved.model, train_cfg


def new_run_dir(runs_dir: Path, name: str | None, data: str) -> Path:
    """``runs/<name>``, or ``runs/<data>-<timestamp>``; refuses to overwrite a trained run."""
    if name is None:
        stem = Path(data.removeprefix("hf:")).name or "run"
        name = f"{stem}-{time.strftime(STAMP)}"
    if name in ("", ".", "..") or any(sep in name for sep in ("/", "\\")):
        raise TformerError(f"--name {name!r} must be a plain folder name inside {runs_dir}")
    if name.startswith("."):  # hidden, as the data cache (runs/.cache) is: tformer runs skips it
        raise TformerError(f"--name {name!r} must not start with a dot")
    run_dir = runs_dir / name
    if (run_dir / "model.pt").exists() or (run_dir / "last.pt").exists():
        raise TformerError(f"{run_dir} already holds a trained run: use --resume or another --name")
    return run_dir


def placed(device_name: str) -> tuple[World, torch.device]:
    """This process's process group (DDP under torchrun) and device (its local rank's GPU)."""
    device = resolve_device(device_name)
    world = init_world(device.type)
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    elif world.size > 1:  # N processes share the cores
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
        torch.set_num_threads(max(1, torch.get_num_threads() // local))
    return world, device


def load_data(
    run_dir: Path,
    cfg: TrainConfig,
    console: Console,
    resume: bool,
    max_positions: int,
    world: World,
) -> tuple[Tokenizer, Tokenizer, dict[str, Split]]:
    """``prepare`` on rank 0, then on the other ranks, which read what it made."""
    if world.main:
        made = not resume and not run_dir.exists()
        try:
            prepared = prepare(run_dir, cfg, console, resume, max_positions)
        except BaseException:  # Ctrl-C too: no half-made run is left behind
            if made:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
    barrier(world)
    if not world.main:
        prepared = prepare(run_dir, cfg, console, True, max_positions)
    return prepared


def prepare(
    run_dir: Path, cfg: TrainConfig, console: Console, resume: bool, max_positions: int
) -> tuple[Tokenizer, Tokenizer, dict[str, Split]]:
    """The run's tokenizer (on resume its own), the targets' (``target_tokenizer``, else the
    same) and every split encoded (``kept_pairs``), through the cache beside the runs (the
    corpus is read on a miss alone). The run folder is made once the tokenizer is ready."""
    with text_folder(run_dir.parent / CACHE_DIR) as folder:
        options = {name: getattr(cfg, name) for name in ("src_lang", "tgt_lang", *PARALLEL_FILES)}
        fingerprint, load = fingerprinted_corpus(cfg.data, seed=cfg.seed, folder=folder, **options)

        def read() -> DatasetDict:  # on a cache miss alone
            corpus = load()
            console.log(f"read the corpus: {len(corpus['train'])} training pairs")
            return corpus

        cache = DataCache(run_dir.parent / CACHE_DIR, functools.cache(read), fingerprint)
        tok_path = run_dir / "tokenizer.json"
        if not resume:
            if cfg.tokenizer_file is not None:  # a ready one: checked before the run folder exists
                load_tokenizer(Path(cfg.tokenizer_file))
                source, how = Path(cfg.tokenizer_file), f"using the tokenizer {cfg.tokenizer_file}"
            else:
                kind = cfg.tokenizer_kind
                source, hit = cache.tokenizer(kind, cfg.vocab_size, cfg.tokenizer_sample)
                cached = f"reusing the cached {kind} tokenizer from {source.parent}"
                how = cached if hit else f"trained a {kind} tokenizer"
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(tok_path, lambda tmp: shutil.copyfile(source, tmp))
        tok = load_tokenizer(tok_path)
        if not resume:
            console.log(f"{how}: {tok.get_vocab_size()} types")
        tgt_path = target_tokenizer(run_dir, cfg, resume, tok, console.log)
        progress = make_progress("encode", console)
        encoded, entry, hit = cache.encoded(tok_path, progress, tgt_path)
        if hit:
            n = sum(len(split.refs) for split in encoded.values())
            console.log(f"reusing cached tokenized data from {entry} ({n} pairs)")
        else:
            console.log(f"tokenized data: cached at {entry}")
        tgt_tok = load_tokenizer(tgt_path) if tgt_path is not None else tok
        return tok, tgt_tok, {name: kept_pairs(name, split, cfg.max_len, max_positions, console.log)
                              for name, split in encoded.items()}  # fmt: skip


@contextmanager
def text_folder(cache_dir: Path) -> Iterator[Path]:
    """A folder beside the data cache for the corpus's text while the cache fills."""
    folder = cache_dir / f".text-{os.getpid()}"
    made = [p for p in (cache_dir, cache_dir.parent) if not p.exists()]
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()  # only where empty


def target_tokenizer(
    run_dir: Path, cfg: TrainConfig, resume: bool, tok: Tokenizer, log: Callable[[str], None]
) -> Path | None:
    """The run's target-side tokenizer (``TARGET_TOKENIZER``, an imported model's) or None: on
    resume the run's own; in a new run, a copy of the ``--init-from`` run's."""
    path = run_dir / TARGET_TOKENIZER
    if resume:
        return path if path.is_file() else None
    path.unlink(missing_ok=True)
    given = Path(cfg.init_from) / TARGET_TOKENIZER if cfg.init_from is not None else None
    if given is None or not given.is_file():
        return None
    if load_tokenizer(given).get_vocab_size() != tok.get_vocab_size():
        raise TformerError(f"{given} does not match the run's tokenizer.json (vocabulary size)")
    atomic_write(path, lambda tmp: shutil.copyfile(given, tmp))
    log(f"using the target side's tokenizer {given}")
    return path


def kept_pairs(
    name: str, split: Split, max_len: int, max_positions: int, log: Callable[[str], None]
) -> Split:
    """The pairs of split ``name`` that training reads: training pairs under ``max_len`` tokens
    a side, others that fit the model's positions (``fits_positions``); none is an error."""
    n = len(split.refs)
    if name == "train":
        keep = np.flatnonzero(np.maximum(lengths(split.src), lengths(split.tgt)) < max_len)
        if len(keep) < n:
            log(f"skipped {n - len(keep)} training pairs over {max_len} tokens")
        if not len(keep):  # the caller removes the new run folder, as for bad data
            raise TformerError(
                f"no training pairs left: all {n} have {max_len} tokens or more"
                " on a side (--max-len)"
            )
    else:
        longest = max_positions - 1  # room for </s> (source) or <s> (target)
        keep = np.asarray(fits_positions(split.src, split.tgt, max_positions), dtype=np.int64)
        if n and not len(keep):
            raise TformerError(
                f"every {name} pair ({n}) is longer than the model's {longest} tokens"
            )
        if len(keep) < n:
            log(f"skipped {n - len(keep)} {name} pairs longer than the model's {longest} tokens")
    return split if len(keep) == n else split.select(keep)


def tensorboard_writer(folder: Path | None, main: bool) -> Any:
    """``SummaryWriter(folder)`` on rank 0 (``main``), else None; on every rank, a one-line
    error without the ``tensorboard`` package."""
    if folder is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TformerError(
            "--tensorboard needs the tensorboard package: pip install tensorboard"
        ) from None
    return SummaryWriter(str(folder)) if main else None
