"""`tformer eval` on a run folder: load the run and the split an ``EvalRequest`` asks for,
evaluate it (``evaluation.py``), and write what is asked: the result kept in the run folder
(``request.py``), the report as JSON, the hypotheses."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from datasets import Dataset, concatenate_datasets
from rich.console import Console

from tformer_cli.checkpoint import LoadedRun, RunConfig, load_run, shared_tokenizer
from tformer_cli.console import make_progress
from tformer_cli.data.corpus import CARVED, SPLITS, load_corpus
from tformer_cli.data.split import Split, fits_positions
from tformer_cli.data.tokenizer import encode
from tformer_cli.decode.translate import SourcesEngine
from tformer_cli.device import free_cores, inference, precision_name, setup_threads
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.report.evaluation import (
    Ensemble,
    EvalReport,
    EvalSource,
    Outputs,
    evaluate_split,
    report_json,
    run_searches,
)
from tformer_cli.report.pick import choose_run
from tformer_cli.report.request import DataChoice, EvalRequest, StoredEval, keep_eval


@dataclass(frozen=True)
class RunEvaluation:
    """An evaluation of a run: the report, its stored result, a hypothesis per pair of the split."""

    report: EvalReport
    stored: StoredEval
    hypotheses: list[str]


def evaluate_run(
    run: Path | None,
    request: EvalRequest | None = None,
    *,
    keep: bool = False,
    json_path: Path | None = None,
    hyp_path: Path | None = None,
    ensemble_with: Sequence[Path] = (),
    console: Console | None = None,
    quiet: bool = False,
) -> RunEvaluation:
    """Evaluate ``run`` (default: the newest) on ``request`` (default: the run's own test split),
    with ``ensemble_with`` (runs sharing its tokenizer) as an ensemble too. Nothing is written
    unless asked: ``keep``, the result in ``RUN/evals/<key>.json`` (never an ensemble's; a folder
    that cannot be written gets a note); ``json_path``, the report; ``hyp_path``, the hypotheses."""
    request = request or EvalRequest()
    request.check()
    start, log = time.perf_counter(), console or Console(stderr=True)
    # load: the run, its split encoded, the pairs the model can read, the result's key
    loaded = load_for(run, request)
    engine = search_engine(loaded, request, len(ensemble_with))
    data = request.data_for(loaded.config.train)
    split = encode_split(loaded, read_pairs(data, request, log, quiet))
    kept = fitting_pairs(split, loaded.config.model.max_positions)
    key = request.key(loaded.run_dir, loaded.config, loaded.device, loaded.dtype)
    load = time.perf_counter() - start
    # evaluate: the run alone, then with the others as an ensemble
    scored, skipped = split.select(kept), len(split.src) - len(kept)
    source = eval_source(loaded, data, request)
    report, outputs = score_split(loaded, scored, skipped, request, source, log, quiet, engine)
    timing = dataclasses.replace(report.timing, total=report.timing.total + load, load=load)
    report = dataclasses.replace(report, timing=timing)
    if ensemble_with:
        report = with_ensemble(report, loaded, scored, request, ensemble_with)
    # write what was asked for
    hyps = [""] * len(split.src)  # a line per pair of the split, empty for a skipped one
    for i, hyp in zip(kept, outputs.hypotheses, strict=True):
        hyps[i] = hyp
    created = datetime.now().astimezone().isoformat(timespec="seconds")
    key_json = json.loads(json.dumps(dataclasses.asdict(key)))
    stored = StoredEval(
        key.digest, key_json, created, report.to_dict(), outputs.greedy, outputs.beam, scored.refs
    )
    if keep and report.ensemble is None:
        try:
            keep_eval(loaded.run_dir, stored)
        except TformerError as e:  # a read-only run folder: the report itself still stands
            if not quiet:
                log.print(f"note: the result was not kept in the run folder: {e}", markup=False)
    if json_path is not None:
        atomic_write_text(json_path, report_json(report))
    if hyp_path is not None:
        atomic_write_text(hyp_path, "".join(f"{line}\n" for line in hyps))
    return RunEvaluation(report, stored, hyps)


def load_for(run: Path | None, request: EvalRequest) -> LoadedRun:
    """The run on the request's device, precision and CPU threads, after ``check_data``."""
    run_dir = choose_run(run)
    config = RunConfig.load(run_dir)
    request.check_data(run_dir, config)
    loaded = load_run(run_dir, request.device, request.precision_for(config), request.compile)
    use_threads(request.threads)
    return loaded


def search_engine(run: LoadedRun, request: EvalRequest, others: int) -> SourcesEngine | None:
    """What runs the searches: ``None`` (tformer's) or the run's CTranslate2 engine, after a
    one-line error for what it cannot do (an ensemble with ``others`` runs, MBR, epsilon)."""
    if request.engine == "torch":
        return None
    from tformer_cli.interop.engine import ctranslate2_engine, refusal

    why = refusal(request.config.search, 1 + others)
    if why is not None:
        raise TformerError(why)
    return ctranslate2_engine(run)


def use_threads(threads: int) -> None:
    """torch's CPU threads: ``threads``; 0: ``$TFORMER_THREADS`` if set, else the idle cores."""
    setup_threads()
    if threads or not os.environ.get("TFORMER_THREADS"):
        torch.set_num_threads(threads or free_cores())


def read_pairs(data: DataChoice, request: EvalRequest, log: Console, quiet: bool) -> Dataset:
    """The first ``request.limit`` text pairs of ``data``'s split (``all``: every pair, in order,
    nothing carved; else carved with the run's seed, as in training)."""
    langs = {"src_lang": data.src_lang, "tgt_lang": data.tgt_lang}
    if data.split == "all":
        ds = load_corpus(data.spec, **langs, carve=False, **data.files)
        pairs = concatenate_datasets([ds[name] for name in SPLITS if name in ds])
    else:
        ds = load_corpus(data.spec, **langs, seed=data.carve_seed, **data.files)
        pairs = ds[data.split]
        if request.data is not None and pairs.info.description == CARVED and not quiet:
            log.print(
                f"note: {request.data} has no {data.split} split: scoring the {len(pairs)} pairs"
                " carved from it with the run's seed; --split all scores every pair",
                markup=False,
            )
    limit = request.limit
    return pairs.select(range(min(limit, len(pairs)))) if limit is not None else pairs


def encode_split(run: LoadedRun, pairs: Dataset) -> Split:
    """Sources by the run's tokenizer, references by its target side's (``tgt_tokenizer``)."""
    refs = list(pairs["tgt"])
    return Split(encode(run.tokenizer, pairs["src"]), encode(run.tgt_tokenizer, refs), refs)


def fitting_pairs(split: Split, max_positions: int) -> list[int]:
    """``fits_positions``, with a one-line error when a non-empty split has no such pair."""
    kept = fits_positions(split.src, split.tgt, max_positions)
    if split.src and not kept:
        raise TformerError(
            f"nothing to evaluate: every pair ({len(split.src)}) is longer than the model's"
            f" {max_positions - 1} tokens"
        )
    return kept


def eval_source(run: LoadedRun, data: DataChoice, request: EvalRequest) -> EvalSource:
    """What the report says was evaluated, and where."""
    return EvalSource(
        str(run.run_dir), data.name, data.split, data.src_lang, data.tgt_lang, request.limit,
        str(run.device), precision_name(run.device, run.dtype), torch.get_num_threads(),
        engine=request.engine,
    )  # fmt: skip


def score_split(
    run: LoadedRun,
    split: Split,
    skipped: int,
    request: EvalRequest,
    source: EvalSource,
    log: Console,
    quiet: bool,
    engine: SourcesEngine | None = None,
) -> tuple[EvalReport, Outputs]:
    """``evaluate_split`` on the run's device and precision, with a progress bar."""
    with make_progress("eval", log, disable=quiet) as bar:
        total = len(split.src) * (3 if request.config.search.beam > 1 else 2)
        task = bar.add_task("eval", total=total, info="")
        with inference(run.device, run.dtype):
            return evaluate_split(
                run.model, run.tgt_tokenizer, split, request.config, source, skipped,
                on_progress=lambda stage, k: bar.update(task, advance=k, info=stage),
                compile=run.compile, engine=engine,
            )  # fmt: skip


def with_ensemble(
    report: EvalReport, run: LoadedRun, split: Split, request: EvalRequest, others: Sequence[Path]
) -> EvalReport:
    """``report`` with the searches of the ensemble of ``run`` and ``others``."""
    precision = request.precision_for(run.config)
    loaded = [load_run(m, request.device, precision, request.compile) for m in others]
    shared_tokenizer([run, *loaded])
    models = [run.model, *(o.model for o in loaded)]
    with inference(run.device, run.dtype):
        searches = run_searches(models, run.tgt_tokenizer, split, request.config, run.compile)
    (greedy, _), second = searches
    names = [str(r.run_dir) for r in (run, *loaded)]
    ensemble = Ensemble(names, greedy, None if second is None else second[0])
    return dataclasses.replace(report, ensemble=ensemble)
