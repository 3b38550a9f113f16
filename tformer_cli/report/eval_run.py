"""`tformer eval` on a run folder: load the run and a split, evaluate (``evaluation.py``), keep
the result (``stored.py``) and write the files asked for."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import torch
from datasets import concatenate_datasets
from rich.console import Console

from tformer_cli.checkpoint import RunConfig, load_run, resolve_run, shared_tokenizer
from tformer_cli.console import make_progress
from tformer_cli.data.corpus import CARVED, FILES, PARALLEL_FILES, SPLITS, load_corpus
from tformer_cli.data.tokenizer import encode
from tformer_cli.device import free_cores, inference, precision_name, setup_threads
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.report.evaluation import (
    EvalConfig,
    EvalData,
    EvalReport,
    EvalSource,
    Outputs,
    ensemble_scores,
    evaluate,
    report_json,
)
from tformer_cli.report.stored import StoredEval, eval_request, keep_eval


def evaluate_run(
    model_dir: Path | None,
    *,
    data: str | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_file: Path | None = None,
    tgt_file: Path | None = None,
    split: str = "test",
    limit: int | None = None,
    cfg: EvalConfig = EvalConfig(),  # noqa: B008
    device: str = "auto",
    precision: str | None = None,
    json_path: Path | None = None,
    hyp_path: Path | None = None,
    threads: int = 0,
    compile: str = "auto",
    ensemble_with: Sequence[Path] = (),
    console: Console | None = None,
    quiet: bool = False,
    store: bool = True,
    on_result: Callable[[StoredEval], None] | None = None,
) -> EvalReport:
    """``tformer eval``: load a run and a split (default: the run's own data, same seed, so the
    same carved splits; ``src_file``/``tgt_file``: every pair of two plain parallel files, in
    order), evaluate, and write ``json_path`` and ``hyp_path`` if given.
    ``threads``: torch CPU threads; 0: ``$TFORMER_THREADS`` if set, else ``free_cores()``;
    ``compile``: how the decode step runs (``DecodeStep``); ``ensemble_with``: other runs
    (sharing this one's tokenizer) whose ensemble with it is scored too, greedy and the second
    search (``EvalReport.ensemble``; such a report is not kept in the run folder).

    With ``store`` the result is also kept in ``RUN/evals/<key>.json`` (``StoredEval``; a run
    folder that cannot be written gets a note, not an error); ``on_result`` receives it."""
    if split not in (*SPLITS, "all"):
        raise TformerError(f"unknown split {split!r}: use train, valid, test or all")
    start, log = time.perf_counter(), console or Console(stderr=True)
    run_dir = resolve_run(model_dir)
    train = RunConfig.load(run_dir).train
    run = load_run(run_dir, device, precision or train.precision, compile)
    setup_threads()  # $TFORMER_THREADS if set; then --threads, else the idle cores
    if threads or not os.environ.get("TFORMER_THREADS"):
        torch.set_num_threads(threads or free_cores())
    src_lang, tgt_lang = src_lang or train.src_lang, tgt_lang or train.tgt_lang
    files: dict[str, str | Path | None] = {}
    if src_file is not None or tgt_file is not None:  # exactly these pairs, in their order
        if data is not None:
            raise TformerError("give --data or --src-file/--tgt-file, not both")
        data_spec, split, files = FILES, "all", {"src_file": src_file, "tgt_file": tgt_file}
    elif data is None:  # the run's own data, its parallel files included
        data_spec, files = train.data, {name: getattr(train, name) for name in PARALLEL_FILES}
    else:
        data_spec = data
    if split == "all":  # every pair the data holds, in its order: nothing carved out
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, carve=False, **files)
        pairs = concatenate_datasets([ds[name] for name in SPLITS if name in ds])
    else:  # the run's seed carves the same valid/test splits as in training
        ds = load_corpus(data_spec, src_lang=src_lang, tgt_lang=tgt_lang, seed=train.seed, **files)
        pairs = ds[split]
        if data is not None and pairs.info.description == CARVED and not quiet:
            log.print(
                f"note: {data} has no {split} split: scoring the {len(pairs)} pairs carved from"
                " it with the run's seed; --split all scores every pair",
                markup=False,
            )
    pairs = pairs.select(range(min(limit, len(pairs)))) if limit is not None else pairs
    request = eval_request(
        run_dir, run.config, data=data, src_lang=src_lang, tgt_lang=tgt_lang, split=split,
        limit=limit, cfg=cfg, device=run.device, dtype=run.dtype, src_file=src_file,
        tgt_file=tgt_file,
    )  # fmt: skip
    src, tgt = encode(run.tokenizer, pairs["src"]), encode(run.tokenizer, pairs["tgt"])
    longest = run.config.model.max_positions - 1  # room for </s> (source) or <s> (target)
    keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) <= longest]
    refs = list(pairs["tgt"])
    eval_data = EvalData([src[i] for i in keep], [tgt[i] for i in keep], [refs[i] for i in keep])
    if src_file is not None:
        data_spec = f"{src_file} + {tgt_file}"  # what the report names
    source = EvalSource(
        str(run_dir), str(data_spec), split, src_lang, tgt_lang, limit, str(run.device),
        precision_name(run.device, run.dtype), torch.get_num_threads(),
    )  # fmt: skip
    n = len(keep)
    if src and not n:
        raise TformerError(
            f"nothing to evaluate: every pair ({len(src)}) is longer than the model's"
            f" {longest} tokens"
        )
    load = time.perf_counter() - start
    outputs: list[Outputs] = []
    with make_progress("eval", log, disable=quiet) as bar:
        task = bar.add_task("eval", total=n * (3 if cfg.search.beam > 1 else 2), info="")
        with inference(run.device, run.dtype):
            report, hyps = evaluate(
                run.model, run.tokenizer, eval_data, cfg, source, len(src) - n,
                on_progress=lambda stage, k: bar.update(task, advance=k, info=stage),
                on_outputs=outputs.append, compile=run.compile,
            )  # fmt: skip
    timing = dataclasses.replace(report.timing, total=report.timing.total + load, load=load)
    report = dataclasses.replace(report, timing=timing)
    if ensemble_with:
        others = [load_run(m, device, precision or train.precision, compile) for m in ensemble_with]
        shared_tokenizer([run, *others])
        models = [run.model, *(o.model for o in others)]
        with inference(run.device, run.dtype):
            scores = ensemble_scores(models, run.tokenizer, eval_data, cfg, run.compile)
        names = [str(r.run_dir) for r in (run, *others)]
        report = dataclasses.replace(report, ensemble=dataclasses.replace(scores, runs=names))
        store = False
    stored = StoredEval(
        request.key, json.loads(json.dumps(dataclasses.asdict(request))),
        datetime.now().astimezone().isoformat(timespec="seconds"),
        json.loads(report_json(report)), outputs[0].greedy, outputs[0].beam, eval_data.refs,
    )  # fmt: skip
    if store:
        try:
            keep_eval(run_dir, stored)
        except TformerError as e:  # a read-only run folder: the report itself still stands
            if not quiet:
                log.print(f"note: the result was not kept in the run folder: {e}", markup=False)
    if on_result is not None:
        on_result(stored)
    if json_path is not None:
        atomic_write_text(json_path, report_json(report))
    if hyp_path is not None:  # a line per pair, in order: a skipped pair's is empty
        lines = [""] * len(src)
        for i, h in zip(keep, hyps, strict=True):
            lines[i] = h
        atomic_write_text(hyp_path, "".join(f"{line}\n" for line in lines))
    return report
