"""What ``tformer eval``, ``runs``, ``show``, ``compare``, ``average``, ``export``, ``import``
and ``tokenizer train`` do, printed where the caller says: the command line's work, callable.
Light to import: each function loads what it needs when called."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tformer_cli.api.decoding import interop_packages
from tformer_cli.config import TrainConfig

if TYPE_CHECKING:
    from tformer_cli.report.request import EvalRequest


def evaluate_runs(
    runs: Sequence[Path | None], asked: EvalRequest, *, console: Console | None, log: Console,
    json_path: Path | None = None, hyp_path: Path | None = None, quiet: bool = False,
) -> str:  # fmt: skip
    """``tformer eval`` of each run (``None``: the newest), kept in its folder, each report
    printed on ``console`` (``None``: not printed); the last run also scores the ensemble of
    them all and writes ``json_path`` and ``hyp_path``. Returns the last report's JSON."""
    from tformer_cli.device import oom_hint
    from tformer_cli.report.eval_run import evaluate_run
    from tformer_cli.report.evaluation import render_report, report_json

    for i, run in enumerate(runs):  # each run's report; the last one ends with the ensemble's
        last = i == len(runs) - 1
        with oom_hint():
            evaluation = evaluate_run(
                run, asked, keep=True, json_path=json_path if last else None,
                hyp_path=hyp_path if last else None, ensemble_with=runs[:-1] if last else (),
                console=log, quiet=quiet,
            )  # fmt: skip
        if console is not None:
            console.print(render_report(evaluation.report))
    return report_json(evaluation.report)


def check_runs(runs: Sequence[Path]) -> None:
    """A one-line error for a run that is neither a folder nor a name under runs/
    (``checkpoint.resolve_run``). Imports no torch: a mistyped name is reported at once."""
    from tformer_cli.checkpoint import resolve_run

    for run in runs:
        resolve_run(run)


def pick_default_run(log: Console | None) -> Path | None:
    """The run a command given none uses (``report.pick.default_run``), named on ``log``;
    ``None`` where there is none (the command says so where it needs one)."""
    from tformer_cli.errors import TformerError
    from tformer_cli.report.pick import default_note
    from tformer_cli.report.pick import default_run as newest_usable

    try:
        run, passed = newest_usable()
    except TformerError:
        return None
    if log is not None:
        log.print(default_note(run, passed), markup=False, highlight=False)
    return Path(run.path)


def average_checkpoints(
    run: Path | None, last: int, output: Path | None = None
) -> tuple[list[Path], Path]:
    """``tformer average``: the mean of the ``last`` newest checkpoints of ``run`` (default:
    the newest) written to ``output`` (default: RUN/averaged.pt); (the checkpoints, the file)."""
    from tformer_cli.checkpoint import average_run
    from tformer_cli.report.pick import choose_run

    return average_run(choose_run(run), last, output)


def export_run(run: Path | None, to: str, output: Path, quantization: str) -> tuple[Path, Path]:
    """``tformer export``: ``run`` (default: the newest) as a CTranslate2 model (``to``
    ctranslate2, weights in ``quantization``) or a Hugging Face Marian model (hf) in the new
    folder ``output``; (the run's folder, what was written)."""
    from tformer_cli.report.pick import choose_run

    run_dir = choose_run(run)
    with interop_packages():
        if to == "ctranslate2":
            from tformer_cli.interop.ct2 import export_ctranslate2

            return run_dir, export_ctranslate2(run_dir, output, quantization)
        from tformer_cli.interop.hf import export_hf

        return run_dir, export_hf(run_dir, output)


def import_run(source: str, runs_dir: Path, name: str | None) -> Path:
    """``tformer import``: a Hugging Face Marian model (``hf:NAME`` or a folder) as a run
    under ``runs_dir`` (``name``: default the model's); its folder."""
    with interop_packages():
        from tformer_cli.interop.hf import import_marian

        return import_marian(source, runs_dir, name)


@dataclass(frozen=True)
class TokenizerStats:
    """One side of the valid split through a tokenizer."""

    side: str
    sentences: int
    avg_tokens: float
    unk_rate: float


def train_tokenizer(
    output: Path, *, data: str, src: str | None, tgt: str | None, vocab_size: int, kind: str
) -> tuple[int, list[TokenizerStats]]:
    """``tformer tokenizer train``: a shared source+target tokenizer trained on ``data`` as
    ``tformer train`` samples it, written to ``output``; (its vocabulary size, the statistics
    of each side of the valid split)."""
    from tformer_cli.data.corpus import corpus_within, training_text
    from tformer_cli.data.tokenizer import save_tokenizer, tokenizer_stats
    from tformer_cli.data.tokenizer import train_tokenizer as trained

    with corpus_within(data, src_lang=src, tgt_lang=tgt) as corpus:
        sample = training_text(corpus["train"], TrainConfig().tokenizer_sample)
        tok = trained(sample, vocab_size, kind)
        valid = [tokenizer_stats(tok, corpus["valid"][side]) for side in ("src", "tgt")]
    save_tokenizer(tok, output)
    stats = [
        TokenizerStats(side, s.sentences, s.avg_tokens, s.unk_rate)
        for side, s in zip(("src", "tgt"), valid, strict=True)
    ]
    return tok.get_vocab_size(), stats
