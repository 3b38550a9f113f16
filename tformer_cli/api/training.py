"""Training and the runs folder from Python: ``train`` (as ``tformer train``), ``runs``,
``compare``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from tformer_cli.api.run import PathLike, Run, as_path, load, threads_kept
from tformer_cli.checkpoint import RunConfig, load_weights, resolve_run
from tformer_cli.config import DecodeConfig, ModelConfig, TrainConfig, from_dict, load_recipe
from tformer_cli.console import StopOnClosedPipe
from tformer_cli.data.corpus import kept_data
from tformer_cli.errors import TformerError
from tformer_cli.model import Transformer
from tformer_cli.report.compare import Comparison, compare_runs
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EvalRequest
from tformer_cli.report.runs import RunInfo, list_runs
from tformer_cli.train.trainer import RESUME_OVERRIDES, Trainer, new_run_dir

# train's keywords that differ from the config field they set (as the CLI's options do)
ALIASES = {
    "src": ("src_lang",), "tgt": ("tgt_lang",), "tokenizer": ("tokenizer_kind",),
    "heads": ("h",), "layers": ("n_encoder_layers", "n_decoder_layers"),
    "tie": ("tie_embeddings",), "epochs": ("max_epochs",),
}  # fmt: skip
MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def settings(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """train's keywords as (model, train) config fields; an unknown keyword is an error."""
    model, train = {}, {}
    for key, value in options.items():
        for field in ALIASES.get(key, (key,)):
            if field in MODEL_FIELDS and field != "vocab_size":
                model[field] = str(value) if isinstance(value, Path) else value
            elif field in TRAIN_FIELDS:
                train[field] = str(value) if isinstance(value, Path) else value
            else:
                raise TformerError(f"{key}: no such train option (see tformer train --help)")
    return model, train


def fine_tuned(
    run: Path, model: dict[str, Any], train: TrainConfig
) -> tuple[ModelConfig, TrainConfig]:
    """``init_from``: the run's model settings and tokenizer; a model keyword that contradicts
    them is an error (as ``tformer train --init-from``)."""
    run = resolve_run(run)
    source = RunConfig.load(run).model
    load_weights(Transformer(source), run)
    for field, value in model.items():
        if value != getattr(source, field):
            raise TformerError(f"{field}: {value} contradicts {run}'s {getattr(source, field)}")
    tokenizer = str((run / "tokenizer.json").resolve())
    return source, dataclasses.replace(
        train, init_from=str(run.resolve()), tokenizer_file=tokenizer,
        max_len=min(train.max_len, source.max_positions),
    )  # fmt: skip


def train(
    data: str | None = None, *, recipe: str | None = None, name: str | None = None,
    runs_dir: PathLike = "runs", resume: PathLike | None = None,
    init_from: PathLike | None = None, quiet: bool = False, **options: Any,
) -> Run:  # fmt: skip
    """Train as ``tformer train`` does and return the run, loaded: a new folder
    ``runs_dir/name`` (default: data + time), or ``resume`` an interrupted one from its
    ``last.pt`` (only its stopping rules and device may change). ``recipe``: toy, multi30k,
    multi30k-15min or a .toml file; ``options``: any train option by its CLI name with ``_``
    (``max_steps=300``, ``d_model=64``, ``layers=2``...), or a config field name; given ones
    win over the recipe's. Ctrl-C saves ``last.pt`` and returns the run so far (resume it with
    ``resume=``); stopped before its first validation, the error says how to resume."""
    if data is not None:
        options["data"] = data
    model_opts, train_opts = settings(options)
    log = Console(file=StopOnClosedPipe(sys.stderr), quiet=quiet, log_path=False)
    if resume is not None:
        run_dir = as_path(resume, "resume")
        saved = RunConfig.load(run_dir)
        stops = {k: v for k, v in train_opts.items() if k in RESUME_OVERRIDES}
        ignored = sorted({*train_opts, *model_opts} - set(stops))
        if ignored:
            names = ", ".join(ignored)
            log.print(f"note: {names} ignored: a resumed run keeps its settings", markup=False)
        model_cfg, train_cfg = saved.model, dataclasses.replace(saved.train, **stops)
    else:
        tables = load_recipe(recipe) if recipe else {}
        train_cfg = kept_data(from_dict(TrainConfig, {**tables.get("train", {}), **train_opts}))
        model_values = {**tables.get("model", {}), **model_opts}
        model_cfg = from_dict(ModelConfig, {"vocab_size": train_cfg.vocab_size, **model_values})
        if init_from is not None:
            model_cfg, train_cfg = fine_tuned(
                as_path(init_from, "init_from"), model_opts, train_cfg
            )
        run_dir = new_run_dir(as_path(runs_dir, "runs_dir"), name, train_cfg.data)
    trainer = Trainer(run_dir, model_cfg, train_cfg, resume=resume is not None, console=log)
    with threads_kept():
        try:
            result = trainer.run(quiet=quiet)
        finally:
            trainer.close()
    if not (result.run_dir / "model.pt").exists():
        raise TformerError(f"interrupted before the first validation: resume={result.run_dir!s}")
    if result.interrupted:
        log.print(f"interrupted: continue with train(resume={str(result.run_dir)!r})", markup=False)
    return load(result.run_dir)


def runs(folder: PathLike = "runs") -> list[RunInfo]:
    """The runs under ``folder``, newest first: what ``tformer runs`` lists."""
    return list_runs(as_path(folder, "folder"))


def compare(
    runs: Sequence[PathLike], *, data: str | None = None, split: str = "test",
    limit: int | None = None, beam: int = 5, alpha: float | None = None, seed: int = 1234,
    quiet: bool = True,
) -> Comparison:  # fmt: skip
    """``tformer compare``: the runs on the same data with paired significance tests (the first
    is the baseline); ``alpha``: default the first run's ``beam_alpha``. Prints the tables."""
    paths = [as_path(r, "runs") for r in runs]
    if alpha is None and paths:
        alpha = RunConfig.load(resolve_run(paths[0])).train.beam_alpha
    cfg = EvalConfig(DecodeConfig(beam=beam, alpha=0.6 if alpha is None else alpha), seed=seed)
    with threads_kept():
        request = EvalRequest(data=data, split=split, limit=limit, config=cfg)
        return compare_runs(paths, Console(), request, quiet=quiet)  # type: ignore[arg-type]
