"""Which run a command uses: the one it names (a folder or a name), else the newest ``usable``
one under ``runs/``, the one ``tformer runs`` marks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tformer_cli.checkpoint import RUNS_DIR, resolve_run
from tformer_cli.errors import TformerError
from tformer_cli.report.runs import RunInfo, collect_or_say_why, run_folders, usable


def default_run(runs_dir: Path = RUNS_DIR) -> tuple[RunInfo, list[RunInfo]]:
    """The newest ``usable`` run, and the newer runs passed over (read without their scores)."""
    passed: list[RunInfo] = []
    for folder in run_folders(runs_dir) if runs_dir.is_dir() else []:
        run = collect_or_say_why(folder, details=False)
        if usable(run):
            return run, passed
        passed.append(run)
    found = f" ({states(passed)}: see tformer runs)" if passed else ""
    raise TformerError(
        f"no trained run under {runs_dir}/{found}: run `tformer train` first, or give -m RUN"
    )


def states(runs: Sequence[RunInfo], most: int = 3) -> str:
    """``a running, b broken``: the first ``most`` runs' names and states."""
    return ", ".join(f"{r.name} {r.state}" for r in runs[:most]) + ", ..." * (len(runs) > most)


def default_note(run: RunInfo, passed: Sequence[RunInfo]) -> str:
    """The line a command given no run prints: the run it uses, and the newer ones passed over."""
    why = f"newest usable; newer: {states(passed)}" if passed else "newest"
    return f"using run {run.path} ({run.state}, {why}; -m to choose)"


def choose_run(run: Path | None, runs_dir: Path = RUNS_DIR) -> Path:
    """The folder of ``run`` (a folder or a name: ``resolve_run``), else of ``default_run``."""
    if run is not None:
        return resolve_run(run, runs_dir)
    return Path(default_run(runs_dir)[0].path)
