"""Training and the runs folder from Python: ``train``, ``runs``, ``compare``; and the training
it shares with ``tformer train`` (``fit``)."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tformer_cli.api.run import (
    PathLike,
    Run,
    as_path,
    eval_request,
    load,
    run_alpha,
    settings,
    takes,
    threads_kept,
)
from tformer_cli.config import (
    NOT_EVALUATED,
    TRAIN_OPTIONS,
    EvalOptions,
    ModelConfig,
    TrainConfig,
    load_recipe,
    option_of,
)
from tformer_cli.console import StopOnClosedPipe
from tformer_cli.errors import SettingError, TformerError
from tformer_cli.learn.use import TRAINED, TRAINING_NOTE, prepare, swapped
from tformer_cli.report.compare import Comparison
from tformer_cli.report.runs import RunInfo, list_runs
from tformer_cli.training.distributed import LAUNCHED
from tformer_cli.training.setup import new_configs, new_run_dir, resume_options, resumed_configs

if TYPE_CHECKING:
    from tformer_cli.training.trainer import TrainResult

# the train options that name a file or folder: a str or a Path
PATH_OPTIONS = ("init_from", "tokenizer_file", "src_file", "tgt_file", "valid_src_file",
                "valid_tgt_file")  # fmt: skip
# what a resumed run notes as ignored besides the train options
RUN_OPTIONS = ("preset", "name", "runs_dir")


def train_settings(
    given: Mapping[str, Any], *, preset: str | None, resume: Path | None, name: str | None,
    runs_dir: Path, log: Console,
) -> tuple[ModelConfig, TrainConfig, Path]:  # fmt: skip
    """The model and training settings and the run folder: a new run's (the ``preset`` recipe,
    then the options ``given``), or a resumed one's own with the stopping rules and device
    given (``log`` names the options ignored)."""
    options = {o: v for o, v in given.items() if o in TRAIN_OPTIONS}
    if resume is not None:
        asked = {o: v for o, v in given.items() if o in TRAIN_OPTIONS or o in RUN_OPTIONS}
        overrides, ignored = resume_options(asked)
        say = functools.partial(log.print, markup=False)
        return (*resumed_configs(resume, overrides, ignored, say), resume)
    model_cfg, train_cfg = new_configs(options, load_recipe(preset) if preset else {})
    return model_cfg, train_cfg, new_run_dir(runs_dir, name, train_cfg.data)


@dataclass(frozen=True)
class Trained:
    """How ``fit`` ended: its result, whether this process reports (rank 0), the exit status of
    an interruption (130; 0 in the workers that ``--nproc`` launched), and the log's console."""

    result: TrainResult
    main: bool
    stopped: int
    log: Console


def fit(
    given: Mapping[str, Any], *, preset: str | None, resume: Path | None, name: str | None,
    runs_dir: Path, use: Path | dict[str, Any] | None, quiet: bool,
    tensorboard: Path | None = None,
) -> Trained:  # fmt: skip
    """Train as ``tformer train`` and ``tformer.train`` do, logging on stderr: the settings and
    run folder of ``train_settings``; ``use``: a learner's file, checked, whose passing functions
    train on the eager step. Ctrl-C saves and ends it."""
    from tformer_cli.training.trainer import Trainer  # looked up when called

    log = Console(file=StopOnClosedPipe(sys.stderr), quiet=quiet, log_path=False)
    learner = None if use is None else prepare(use, TRAINED)
    if learner is not None and not quiet:
        log.print(
            f"{TRAINING_NOTE}\n{learner.line()}", markup=False, highlight=False, soft_wrap=True
        )
    model_cfg, train_cfg, run_dir = train_settings(
        given, preset=preset, resume=resume, name=name, runs_dir=runs_dir, log=log
    )
    if learner is not None:  # the eager step, which calls the learner's loss
        train_cfg = dataclasses.replace(train_cfg, compile="off")
    trainer = Trainer(
        run_dir, model_cfg, train_cfg, resume=resume is not None, console=log,
        tensorboard=tensorboard,
    )  # fmt: skip
    try:
        with threads_kept(), swapped(learner):
            result = trainer.run(quiet=quiet)
    finally:
        trainer.close()
    return Trained(result, trainer.world.main, 0 if os.environ.get(LAUNCHED) else 130, log)


def train(
    data: str | None = None, *, recipe: str | None = None, name: str | None = None,
    runs_dir: PathLike = "runs", resume: PathLike | None = None,
    init_from: PathLike | None = None, use: PathLike | dict[str, Any] | None = None,
    quiet: bool = False, **options: Any,
) -> Run:  # fmt: skip
    """Train as ``tformer train`` does and return the run, loaded: a new folder
    ``runs_dir/name`` (default: data + time), or ``resume`` an interrupted one from its
    ``last.pt`` (only its stopping rules and device may change). ``recipe``: a shipped one
    (``config.shipped_recipes()``: toy, multi30k...) or a .toml file; ``options``: any train
    option by its CLI name with ``_`` (``max_steps=300``, ``d_model=64``, ``layers=2``...); given
    ones win over the recipe's.
    ``use``: a ``tformer learn`` exercises file (or its folder, or a notebook's ``globals()``),
    checked; its passing ``label_smoothed_loss`` and ``mix_inputs`` train the model, on the
    eager step (``tformer train --use``). Ctrl-C saves ``last.pt`` and returns the run so far
    (resume it with ``resume=``); stopped before its first validation, the error says how to
    resume."""
    given = {"data": data, "init_from": init_from, **options}
    given = {
        k: as_path(v, k) if k in PATH_OPTIONS else v for k, v in given.items() if v is not None
    }
    unknown = sorted(set(given) - set(TRAIN_OPTIONS))
    if unknown:
        raise TformerError(f"{unknown[0]}: no such train option (see tformer train --help)")
    try:
        trained = fit(
            given, preset=recipe, resume=as_path(resume, "resume"), name=name,
            runs_dir=as_path(runs_dir, "runs_dir") or Path("runs"),
            use=use if isinstance(use, dict) else as_path(use, "use"), quiet=quiet,
        )  # fmt: skip
    except SettingError as e:  # by the keyword that sets it: layers=0, not n_encoder_layers
        raise TformerError(e.in_python(option_of)) from None
    result = trained.result
    if not (result.run_dir / "model.pt").exists():
        raise TformerError(f"interrupted before the first validation: resume={result.run_dir!s}")
    if result.interrupted:
        message = f"interrupted: continue with train(resume={str(result.run_dir)!r})"
        trained.log.print(message, markup=False)
    return load(result.run_dir)


def runs(folder: PathLike = "runs") -> list[RunInfo]:
    """The runs under ``folder``, newest first: what ``tformer runs`` lists."""
    return list_runs(as_path(folder, "folder"))


@takes(EvalOptions, skip=NOT_EVALUATED)
def compare(runs: Sequence[PathLike], *, quiet: bool = True, **options: Any) -> Comparison:
    """``tformer compare``: the runs on the same data with paired significance tests (the first
    is the baseline), each evaluated as ``EvalOptions`` say (``alpha``: default the first run's
    ``beam_alpha``). Prints nothing: a notebook, or ``print``, shows the comparison's tables."""
    from tformer_cli.report.compare import compare_runs

    paths = [as_path(r, "runs") for r in runs]
    asked = settings(EvalOptions, options, skip=NOT_EVALUATED)
    alpha = run_alpha(asked.alpha, paths[0]) if paths else 0.0  # none: compare says so
    with threads_kept():
        return compare_runs(paths, Console(quiet=True), eval_request(asked, alpha), quiet=quiet)
