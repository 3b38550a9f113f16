"""`tformer show RUN`: the run's settings, its training curves in the terminal and as a picture."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tformer_cli.checkpoint import RUNS_DIR, RunConfig
from tformer_cli.report.curves import (
    Chart,
    chart_terminal,
    check_axis,
    make_chart,
    run_series,
    save_chart,
)
from tformer_cli.report.pick import choose_run
from tformer_cli.report.picture import check_picture, escape
from tformer_cli.report.runs import RunInfo, collect_run, read_log

STOPPING = (("--max-steps", "max_steps"), ("--epochs", "max_epochs"),
            ("--max-minutes", "max_minutes"), ("--patience", "patience"),
            ("--average", "average"))  # fmt: skip


def settings_rows(config: RunConfig, info: RunInfo) -> list[tuple[str, str]]:
    """The run's settings and progress as short label/value rows."""
    m, t = config.model, config.train
    params = "?" if info.parameters is None else f"{info.parameters:,}"
    langs = f" ({t.src_lang} -> {t.tgt_lang})" if t.src_lang and t.tgt_lang else ""
    files = [getattr(t, n, None) for n in ("src_file", "tgt_file")]
    data = " + ".join(f for f in files if f) if t.data == "files" and any(files) else t.data
    tied = ", tied embeddings" if m.tie_embeddings else ""
    rules = [f"{option} {getattr(t, name):g}" for option, name in STOPPING if getattr(t, name)]
    rows = [
        ("state", f"{info.state}: {info.detail}" if info.detail else info.state),
        ("data", f"{data}{langs}, seed {t.seed}"),
        ("tokenizer", f"{t.tokenizer_kind}, {m.vocab_size:,} types (asked {t.vocab_size:,})"),
        ("model", f"{params} parameters; {m.n_encoder_layers}+{m.n_decoder_layers} layers, d"
                  f" {m.d_model}, {m.h} heads, FFN {m.d_ff}, {m.norm}-LN, {m.positional} positions,"
                  f" dropout {m.dropout:g}{tied}"),
        ("training", f"{t.max_tokens:,} tokens/batch x {t.accum}, lr {t.lr:g}, warm-up {t.warmup},"
                     f" label smoothing {t.label_smoothing:g}, precision {t.precision}"),
        ("stopping", ", ".join(rules) or "none (Ctrl-C)"),
    ]  # fmt: skip
    if t.scheduled_sampling != "off":
        k = "" if t.ss_k is None else f", k {t.ss_k:g}"
        how = f", min {t.ss_min:g}, warm-up {t.ss_warmup}, mix {t.ss_mix}"
        rows.append(("scheduled sampling", f"{t.scheduled_sampling}{k}{how}"))
    progress = f"{info.updates or 0:,} updates"
    if info.epochs:
        progress += f", {info.epochs} epoch{'' if info.epochs == 1 else 's'}"
    if info.best_valid_bleu is not None:
        progress += f"; best valid BLEU {info.best_valid_bleu:.2f} at step {info.best_step}"
    rows.append(("progress", progress))
    if info.test_bleu is not None:
        how = "tformer eval" if info.test_bleu_from == "eval" else "end of training"
        b = info.test_beam_bleu
        beam = "" if b is None else f", beam {info.test_beam} {b:.2f}"
        rows.append(("test BLEU", f"greedy {info.test_bleu:.2f}{beam} ({how})"))
    return rows


def show_run(
    run: Path,
    console: Console,
    *,
    save: Path | None = None,
    x: str = "updates",
    err: Console | None = None,
    runs_dir: Path = RUNS_DIR,
    width: int | None = None,
) -> Chart:
    """``tformer show RUN``: the run's settings, then its curves; ``save`` writes them as .svg,
    .html (with the settings) or .png. Returns the chart."""
    check_axis(x)
    check_picture(save)
    run_dir = choose_run(run, runs_dir)
    config = RunConfig.load(run_dir)  # a broken run: its one-line reason
    records = read_log(run_dir)
    info = collect_run(run_dir)
    settings = [("run", str(run_dir)), *settings_rows(config, info)]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in settings:
        table.add_row(label, value)
    chart = make_chart([(run_dir.name, run_series(records))], x, f"run {run_dir.name}")
    console.print(table)
    console.print(chart_terminal(chart, width or console.width))
    if save is not None:
        cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in settings)
        save_chart(chart, save, f"<table>{cells}</table>\n")
        (err or Console(stderr=True)).print(f"wrote {save}", markup=False, highlight=False)
    return chart
