"""Training and the runs folder from Python: ``train`` (as ``tformer train``), ``runs``,
``compare``."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from tformer_cli.api.run import PathLike, Run, as_path, length_penalty, load, threads_kept
from tformer_cli.config import DecodeConfig, load_recipe
from tformer_cli.console import StopOnClosedPipe
from tformer_cli.errors import TformerError
from tformer_cli.report.compare import Comparison, compare_runs
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EvalRequest
from tformer_cli.report.runs import RunInfo, list_runs
from tformer_cli.training.setup import (
    TRAIN_OPTIONS,
    new_configs,
    new_run_dir,
    resume_options,
    resumed_configs,
)
from tformer_cli.training.trainer import Trainer

# the train options that name a file or folder: a str or a Path
PATH_OPTIONS = ("init_from", "tokenizer_file", "src_file", "tgt_file", "valid_src_file",
                "valid_tgt_file")  # fmt: skip
CHOICES = {"positional": ("sinusoidal", "learned"), "norm": ("post", "pre")}


def train(
    data: str | None = None, *, recipe: str | None = None, name: str | None = None,
    runs_dir: PathLike = "runs", resume: PathLike | None = None,
    init_from: PathLike | None = None, quiet: bool = False, **options: Any,
) -> Run:  # fmt: skip
    """Train as ``tformer train`` does and return the run, loaded: a new folder
    ``runs_dir/name`` (default: data + time), or ``resume`` an interrupted one from its
    ``last.pt`` (only its stopping rules and device may change). ``recipe``: toy, multi30k,
    multi30k-15min or a .toml file; ``options``: any train option by its CLI name with ``_``
    (``max_steps=300``, ``d_model=64``, ``layers=2``...); given ones win over the recipe's.
    Ctrl-C saves ``last.pt`` and returns the run so far (resume it with ``resume=``); stopped
    before its first validation, the error says how to resume."""
    given = {"data": data, "init_from": init_from, **options}
    given = {
        k: as_path(v, k) if k in PATH_OPTIONS else v for k, v in given.items() if v is not None
    }
    unknown = sorted(set(given) - set(TRAIN_OPTIONS))
    if unknown:
        raise TformerError(f"{unknown[0]}: no such train option (see tformer train --help)")
    log = Console(file=StopOnClosedPipe(sys.stderr), quiet=quiet, log_path=False)
    if resume is not None:
        run_dir = as_path(resume, "resume")
        assert run_dir is not None
        overrides, ignored = resume_options(given)
        say = functools.partial(log.print, markup=False)
        model_cfg, train_cfg = resumed_configs(run_dir, overrides, ignored, say)
    else:
        model_cfg, train_cfg = new_configs(given, load_recipe(recipe) if recipe else None)
        for option, choices in CHOICES.items():
            if getattr(model_cfg, option) not in choices:
                raise TformerError(f"{option}: use {' or '.join(choices)}")
        run_dir = new_run_dir(as_path(runs_dir, "runs_dir") or Path("runs"), name, train_cfg.data)
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
    if paths:  # the first run's own unless given
        alpha = length_penalty(alpha, paths[0])
    cfg = EvalConfig(DecodeConfig(beam=beam, alpha=0.6 if alpha is None else alpha), seed=seed)
    with threads_kept():
        request = EvalRequest(data=data, split=split, limit=limit, config=cfg)
        return compare_runs(paths, Console(), request, quiet=quiet)  # type: ignore[arg-type]
