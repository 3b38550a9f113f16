"""`tformer compare RUN_A RUN_B [...]`: runs side by side on the same test data.

Each run's ``tformer eval`` result is reused from ``RUN/evals/`` when current (``EvalKey``),
else evaluated now. Every number of the report is shown beside its difference to RUN_A, and
BLEU and chrF differences are tested by sacrebleu's paired bootstrap resampling (Koehn 2004)
and approximate randomization (Riezler & Maxwell 2005). ``save``: the runs' curves overlaid."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from tformer_cli.checkpoint import RUNS_DIR, RunConfig, check_checkpoint, resolve_run
from tformer_cli.errors import TformerError
from tformer_cli.report.curves import check_axis, make_chart, run_series, save_chart
from tformer_cli.report.eval_run import evaluate_run
from tformer_cli.report.exposure import diff, fmt, pct, points
from tformer_cli.report.picture import check_picture, escape, html_table
from tformer_cli.report.request import EvalRequest, StoredEval, load_stored_eval
from tformer_cli.report.runs import read_log

ALPHA = 0.05  # significance level of the verdicts (the p-values are printed too)
N_BOOTSTRAP = 1000  # sacrebleu's defaults
N_AR = 10000
VERDICTS = {(True, True): ("both", "green"), (True, False): ("bs only", "yellow"),
            (False, True): ("ar only", "yellow"), (False, False): ("no", "dim")}  # fmt: skip


# ---------------------------------------------------------------------------- collect
@dataclass(frozen=True)
class Scored:
    """One run's evaluation: reused from its stored results, or made now."""

    name: str
    path: str
    reused: bool
    stored: StoredEval
    kept: bool = False  # evaluated now, and the result kept in the run folder


def score_runs(
    runs: Sequence[Path],
    request: EvalRequest,
    keep: bool,
    log: Console,
    quiet: bool,
    runs_dir: Path = RUNS_DIR,
) -> list[Scored]:
    """Every run scored on ``request``: its current stored result, else a new evaluation; each
    checked readable before any is evaluated."""
    paths = [resolve_run(r, runs_dir) for r in runs]
    if len({p.resolve() for p in paths}) < len(paths):
        raise TformerError("a run is named twice: compare different runs")
    for path in paths:
        RunConfig.load(path)
        check_checkpoint(path / "model.pt")
    scored = []
    for name, path in zip(run_names(paths), paths, strict=True):
        config = RunConfig.load(path)
        stored = load_stored_eval(path, request.key(path, config, *request.placement(config)))
        reused = stored is not None
        if stored is None:  # no current stored result: evaluate now
            if not quiet:
                log.print(f"evaluating {path} (no current stored result)", markup=False)
            stored = evaluate_run(path, request, keep=keep, console=log, quiet=quiet).stored
        scored.append(Scored(name, str(path), reused, stored, kept=keep and not reused))
    return scored


def run_names(paths: Sequence[Path]) -> list[str]:
    """Folder names, or the paths where two runs share a name."""
    names = [p.name for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


# ---------------------------------------------------------------------------- measure
@dataclass(frozen=True)
class Row:
    """One number of the report: its path in the report's JSON and how it prints (``share``: a
    fraction in %, its differences in percentage points)."""

    label: str
    path: tuple[str, ...]
    spec: str = ".2f"
    share: bool = False


def report_rows(beam: int | None) -> list[Row]:
    searches = [("greedy", "greedy")] + ([("beam", f"beam {beam}")] if beam else [])
    rows = [Row(f"BLEU {name}", (key, "bleu")) for key, name in searches]
    rows += [Row(f"chrF {name}", (key, "chrf")) for key, name in searches]
    rows += [Row(f"exact match {name}", (key, "exact_match"), share=True) for key, name in searches]
    return [
        *rows,
        Row("tf_xent (teacher forcing)", ("tf", "xent"), ".4f"),
        Row("tf_ppl", ("tf", "ppl")),
        Row("tf_acc", ("tf", "acc"), share=True),
        Row("tf_bleu (TF argmax)", ("exposure_gap", "tf_bleu")),
        Row("bleu_gap (tf_bleu - greedy)", ("exposure_gap", "bleu_gap")),
        Row("err_clean", ("accumulation", "err_clean"), share=True),
        Row("err_self", ("accumulation", "err_self"), share=True),
        Row("excess_error", ("accumulation", "excess_error"), share=True),
        Row("excess_error_pct (%)", ("accumulation", "excess_error_pct"), ".1f"),
        Row("prefix-noise drop", ("prefix_noise", "drop"), share=True),
        Row("prefix-noise paired drop", ("prefix_noise", "paired_drop"), share=True),
        Row("length decay_ratio", ("length_decay", "decay_ratio"), ".3f"),
    ]


def lookup(report: dict[str, Any], path: Sequence[str]) -> float | None:
    value: Any = report
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class MetricRow:
    label: str
    values: list[float | None]  # one per run
    diffs: list[float | None]  # run i minus RUN_A (None for RUN_A itself)
    spec: str
    share: bool


@dataclass(frozen=True)
class PairedResult:
    """One metric of one search, one run against RUN_A: sacrebleu's scores and p-values."""

    metric: str  # BLEU or chrF
    search: str  # greedy or beam k
    baseline: str
    system: str
    baseline_score: float
    score: float
    diff: float  # score - baseline_score
    p_bootstrap: float
    p_ar: float
    bootstrap_mean: float | None  # the system's mean score over the bootstrap resamples
    bootstrap_ci: float | None  # half-width of its 95% interval

    @property
    def significant_bootstrap(self) -> bool:
        """``p < ALPHA`` for a non-zero difference (equal outputs get sacrebleu's smallest p)."""
        return self.p_bootstrap < ALPHA and self.diff != 0

    @property
    def significant_ar(self) -> bool:
        return self.p_ar < ALPHA and self.diff != 0


def paired_tests(
    refs: Sequence[str],
    systems: Sequence[tuple[str, Sequence[str]]],
    search: str = "greedy",
    n_bootstrap: int = N_BOOTSTRAP,
    n_ar: int = N_AR,
) -> tuple[list[PairedResult], dict[str, str]]:
    """BLEU and chrF of each system against the first (sacrebleu's ``PairedTest``), signatures."""
    named = [(name, list(hyps)) for name, hyps in systems]
    results: dict[str, dict[str, list[Any]]] = {}
    signatures: dict[str, str] = {}
    for test, n in (("bs", n_bootstrap), ("ar", n_ar)):
        metrics = {"BLEU": BLEU(force=True), "chrF": CHRF()}
        sigs, scores = PairedTest(named, metrics, [list(refs)], test_type=test, n_samples=n)()
        names = [k for k in scores if k != "System"]  # the scores' own names: BLEU, chrF2
        results[test] = dict(zip(metrics, (scores[k] for k in names), strict=True))
        for ours, theirs in zip(metrics, names, strict=True):
            signatures[f"{ours} {test}"] = str(sigs[theirs])
    out = []
    for metric in ("BLEU", "chrF"):
        bs, ar = results["bs"][metric], results["ar"][metric]
        for i in range(1, len(named)):
            mean, ci = (None if x is None else float(x) for x in (bs[i].mean, bs[i].ci))
            out.append(PairedResult(
                metric, search, named[0][0], named[i][0], bs[0].score, bs[i].score,
                bs[i].score - bs[0].score, float(bs[i].p_value), float(ar[i].p_value), mean, ci,
            ))  # fmt: skip
    return out, signatures


@dataclass(frozen=True)
class Comparison:
    runs: list[Scored]
    pairs: int
    metrics: list[MetricRow]
    tests: list[PairedResult]
    signatures: dict[str, str]
    n_bootstrap: int
    n_ar: int

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.runs]

    def __str__(self) -> str:
        """The tables ``tformer compare`` prints, as text: ``print(comparison)``."""
        text = io.StringIO()
        Console(file=text, width=100, color_system=None).print(render_comparison(self))
        return text.getvalue()

    def _repr_html_(self) -> str:
        """A notebook's display: the tables of ``tformer compare --save FILE.html``."""
        return comparison_html(self)


def measure(scored: Sequence[Scored], n_bootstrap: int, n_ar: int) -> Comparison:
    """Side-by-side numbers and the paired tests, from runs scored on the same references."""
    first = scored[0]
    for other in scored[1:]:
        if other.stored.refs != first.stored.refs:
            raise TformerError(
                f"{first.name} and {other.name} were scored on different references"
                f" ({len(first.stored.refs)} and {len(other.stored.refs)} pairs): give both the"
                " same test data with --data (and --split)"
            )
    beams = {(s.stored.report.get("beam") or {}).get("beam") for s in scored}
    beam = beams.pop() if len(beams) == 1 else None
    rows = []
    for row in report_rows(beam):
        values = [lookup(s.stored.report, row.path) for s in scored]
        diffs = [None] + [diff(v, values[0]) for v in values[1:]]
        if any(v is not None for v in values):
            rows.append(MetricRow(row.label, values, diffs, row.spec, row.share))
    refs, tests, signatures = first.stored.refs, [], {}
    searches = [("greedy", [s.stored.greedy for s in scored])]
    if beam is not None and all(s.stored.beam is not None for s in scored):
        searches.append((f"beam {beam}", [s.stored.beam or [] for s in scored]))
    for search, outputs in searches:
        systems = list(zip((s.name for s in scored), outputs, strict=True))
        found, sigs = paired_tests(refs, systems, search, n_bootstrap, n_ar)
        tests += found
        signatures.update(sigs)
    return Comparison(list(scored), len(refs), rows, tests, signatures, n_bootstrap, n_ar)


# ---------------------------------------------------------------------------- render
def value_text(value: float | None, row: MetricRow) -> str:
    return pct(value) if row.share else fmt(value, row.spec)


def diff_text(value: float | None, row: MetricRow) -> str:
    return points(value) if row.share else fmt(value, f"+{row.spec}")


def render_comparison(c: Comparison) -> Group:
    """The two tables: every number side by side, then the paired tests."""
    names = c.names
    head = Text.assemble(
        ("tformer compare  ", "bold"),
        f"{len(names)} runs on the same {c.pairs} pairs | baseline {names[0]}",
    )
    origins = [
        f"stored result of {s.stored.created} (model.pt unchanged since)"
        if s.reused
        else f"evaluated now{' (result kept)' if s.kept else ''}"
        for s in c.runs
    ]
    source = Text("\n".join(f"{s.name}: {o}" for s, o in zip(c.runs, origins, strict=True)), "dim")
    numbers = Table(title="Side by side", title_justify="left")
    numbers.add_column("metric")
    for i, name in enumerate(names):
        numbers.add_column(name, justify="right", overflow="fold")
        if i:
            numbers.add_column(f"{name} - {names[0]}" if len(names) > 2 else "difference",
                               justify="right", overflow="fold")  # fmt: skip
    for row in c.metrics:
        cells = [row.label]
        for i, value in enumerate(row.values):
            cells.append(value_text(value, row))
            if i:
                cells.append(diff_text(row.diffs[i], row))
        numbers.add_row(*cells)
    tests = Table(title="Is the difference significant? (sacrebleu paired tests)",
                  title_justify="left")  # fmt: skip
    for name in ("metric", "run", "baseline", "score", "diff", "p (bs)", "p (ar)", "sig."):
        left = name in ("metric", "run")
        tests.add_column(name, justify="left" if left else "right", overflow="fold")
    for t in c.tests:
        verdict = Text(*VERDICTS[t.significant_bootstrap, t.significant_ar])
        tests.add_row(
            f"{t.metric} {t.search}", t.system, f"{t.baseline_score:.2f}", f"{t.score:.2f}",
            f"{t.diff:+.2f}", f"{t.p_bootstrap:.4f}", f"{t.p_ar:.4f}", verdict,
        )  # fmt: skip
    caption = Text(
        f"baseline: {names[0]}'s score. p: the chance of a difference at least this large if"
        " both runs were equally good (paired over the same sentences); bs: paired bootstrap"
        f" resampling (n={c.n_bootstrap}), Koehn (2004) as in Moses/sacrebleu; ar: approximate"
        f" randomization (n={c.n_ar}), Riezler & Maxwell (2005), sacrebleu's default test."
        f" sig.: p < {ALPHA:g} in both tests, in one only, or in neither (no). A zero difference"
        " is never significant (sacrebleu then reports its smallest p). Few sentences give wide"
        " intervals: a difference that is not significant may still be real.\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(c.signatures.items())),
        style="dim",
    )
    return Group(head, source, Text(""), numbers, Text(""), tests, caption)


def comparison_dict(c: Comparison) -> dict[str, Any]:
    """Everything the tables show, with the settings, for ``--json``."""
    return {
        "runs": [
            {"name": s.name, "path": s.path, "reused": s.reused}
            | {field: getattr(s.stored, field) for field in ("created", "key", "request")}
            for s in c.runs
        ],
        "pairs": c.pairs,
        "metrics": [dataclasses.asdict(m) for m in c.metrics],
        "significance": [
            {
                **dataclasses.asdict(t),
                "significant_bootstrap": t.significant_bootstrap,
                "significant_ar": t.significant_ar,
            }
            for t in c.tests
        ],
        "alpha": ALPHA,
        "n_bootstrap": c.n_bootstrap,
        "n_ar": c.n_ar,
        "signatures": c.signatures,
    }


def comparison_html(c: Comparison) -> str:
    """The side-by-side numbers and the tests as HTML tables, for the saved page."""
    names = c.names
    metrics = [
        [r.label, *(value_text(v, r) + (f" ({diff_text(r.diffs[i], r)})" if i else "")
                    for i, v in enumerate(r.values))]
        for r in c.metrics
    ]  # fmt: skip
    tests = [
        [f"{t.metric} {t.search}", t.system, f"{t.diff:+.2f}", f"{t.p_bootstrap:.4f}",
         f"{t.p_ar:.4f}"]
        for t in c.tests
    ]  # fmt: skip
    head = ["metric", "run", "difference", f"p bootstrap (n={c.n_bootstrap})",
            f"p approx. rand. (n={c.n_ar})"]  # fmt: skip
    return (
        f"<p>{len(names)} runs on the same {c.pairs} pairs; differences against"
        f" {escape(names[0])}.</p>\n{html_table(['metric', *names], metrics)}\n"
        f"{html_table(head, tests)}\n"
    )


# ---------------------------------------------------------------------------- the command
def compare_runs(
    runs: Sequence[Path],
    console: Console,
    request: EvalRequest | None = None,
    *,
    keep: bool = False,
    save: Path | None = None,
    x: str = "updates",
    as_json: bool = False,
    n_bootstrap: int = N_BOOTSTRAP,
    n_ar: int = N_AR,
    err: Console | None = None,
    quiet: bool = False,
    runs_dir: Path = RUNS_DIR,
) -> Comparison:
    """Score every run on ``request`` (default: their own test split, beam 5, as `tformer eval`,
    so that stored results are reused; ``keep`` keeps new ones), print the tables (or JSON), and
    write the runs' curves over ``x`` to ``save``."""
    if len(runs) < 2:
        raise TformerError("compare needs at least two runs")
    check_axis(x)
    check_picture(save)
    log = err or Console(stderr=True)
    scored = score_runs(runs, request or EvalRequest(), keep, log, quiet, runs_dir)
    if not quiet:
        log.print(
            f"paired tests: bootstrap ({n_bootstrap} resamples) and approximate randomization"
            f" ({n_ar} trials), BLEU and chrF",
            markup=False,
        )
    comparison = measure(scored, n_bootstrap, n_ar)
    if as_json:
        text = json.dumps(comparison_dict(comparison), indent=2, ensure_ascii=False)
        console.out(text, highlight=False)
    else:
        console.print(render_comparison(comparison))
    if save is not None:
        series = [(s.name, run_series(read_log(Path(s.path)))) for s in scored]
        chart = make_chart(series, x, "training curves: " + ", ".join(comparison.names))
        save_chart(chart, save, comparison_html(comparison))
        log.print(f"wrote {save}", markup=False, highlight=False)
    return comparison
