"""`tformer runs`: the run folders under ``runs/`` as one table, and the run lock.

A folder's state reads only ``config.json``, ``log.jsonl``, the stored evaluations
(``RUN/evals/``), the run lock and whether ``model.pt`` is a whole zip archive; an unreadable
folder is a ``broken`` row saying why, never a traceback. States, decided in this order:
- ``running``: a process holds the run lock, an exclusive ``flock`` on ``RUN/.lock`` that the
  kernel drops when its process ends however it ends, so a killed run never looks alive.
- ``broken``: no readable ``config.json``, an unreadable ``log.jsonl`` (a half-written last line
  is ignored, as ``--resume`` ignores it), a ``model.pt`` that is not a whole zip archive, a
  missing or unreadable ``tokenizer.json``, or finished without ``model.pt``.
- ``finished``: the log's records after training name a stopping rule or hold test BLEU.
- ``imported``: a model made elsewhere (``tformer import``), with its ``model.pt``.
- ``interrupted``: anything else; ``tformer train --resume RUN`` continues it."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from torch.overrides import TorchFunctionMode

from tformer_cli.checkpoint import RUNS_DIR, RunConfig
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.tokenizer import load_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.model import Transformer
from tformer_cli.report.request import EvalRequest, StoredEval, stored_evals

LOCK = ".lock"
LOCK_WAIT = 5.0  # seconds a trainer waits for a lock that a `tformer runs` probe holds briefly
TRAINING_KEYS = ("loss", "valid_loss", "skipped_update")  # records written while training
INTERRUPTIONS = ("interrupted", "stopped with rank")  # how a stopped_by that is no rule starts


# ---------------------------------------------------------------------------- the run lock
class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock`` (made if missing) until ``release()``, the end of
    the ``with`` block, of the object or of the process; a ``TformerError`` when another process
    holds it after ``wait`` seconds. A second lock on the same folder in one process (a resumed
    Trainer while the first exists) counts up instead of waiting for itself. The file keeps the
    holder's pid, for messages only."""

    def __init__(self, run_dir: Path, wait: float = LOCK_WAIT) -> None:
        self.path = run_dir / LOCK
        self._key: str | None = None
        key = str(self.path.resolve())
        with _HELD_GUARD:
            if key not in _HELD:
                _HELD[key] = [_acquire(run_dir, self.path, wait), 0]
            _HELD[key][1] += 1
        self._key = key

    def release(self) -> None:
        with _HELD_GUARD:
            if self._key is None:
                return
            held = _HELD[self._key]
            held[1] -= 1
            if held[1] == 0:
                os.close(held[0])  # closing the descriptor drops the flock
                del _HELD[self._key]
            self._key = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


_HELD: dict[str, list[int]] = {}  # this process's run locks: resolved path -> [fd, holders]
_HELD_GUARD = threading.Lock()


def _acquire(run_dir: Path, path: Path, wait: float) -> int:
    """Open ``path`` and take its exclusive flock, retrying for ``wait`` seconds."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise TformerError(f"cannot lock {path}: {e.strerror or e}") from None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:  # another trainer, or a probe that lets go at once
            if time.monotonic() >= deadline:
                os.close(fd)
                pid = lock_holder(run_dir)
                raise TformerError(
                    f"{run_dir} is being trained by another process"
                    f"{f' (pid {pid})' if pid else ''}: wait for it to end or stop it"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


lock_run = RunLock  # the trainer's name for taking it: ``lock = lock_run(run_dir)``


def is_running(run_dir: Path) -> bool:
    """Whether a live process holds the run lock (a non-blocking shared probe); creates nothing."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without flock: no sign of life to read
        return False
    finally:
        os.close(fd)  # drops the probe's own lock too
    return False


def lock_holder(run_dir: Path) -> int | None:
    """The pid the lock holder wrote, if any (for messages)."""
    try:
        return int((run_dir / LOCK).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------- the log
def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``log.jsonl`` (none without one). A half-written last line, which a killed
    process leaves, is dropped; any other unreadable line is a ``TformerError``."""
    path = run_dir / "log.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise TformerError(f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise TformerError(f"cannot read {path}: {e.strerror or e}") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if number == len(lines) and not text.endswith("\n"):
                break  # cut off mid-line
            raise TformerError(f"{path} line {number} is not a JSON object")
        records.append(record)
    return records


def stop_record(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The records after the last training record, merged: ``stopped_by``, ``test_bleu``, the
    checkpoint average's choice (empty while training goes on)."""
    last = max((i for i, r in enumerate(records) if any(k in r for k in TRAINING_KEYS)), default=-1)
    return {key: value for record in records[last + 1 :] for key, value in record.items()}


# ---------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunInfo:
    """One row of ``tformer runs`` (and its ``--json`` object)."""

    name: str
    path: str
    state: str  # one of STATE_STYLES
    detail: str  # how it stopped (finished, interrupted), its pid (running), or why it is broken
    updated: str | None  # last write to config.json, log.jsonl, model.pt or last.pt (ISO 8601)
    updated_ts: float
    data: str | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    parameters: int | None = None
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    d_model: int | None = None
    heads: int | None = None
    precision: str | None = None  # as configured: fp32, bf16 or auto
    updates: int | None = None
    epochs: int | None = None
    best_valid_bleu: float | None = None
    best_step: int | None = None
    test_bleu: float | None = None  # greedy, on the run's own test split
    test_bleu_from: str | None = None  # "eval" (stored, current model) or "train" (its log)
    test_beam_bleu: float | None = None
    test_beam: int | None = None
    stopped_by: str | None = None
    pid: int | None = None  # the training process, while running
    resume: str | None = None  # the command that continues an interrupted run
    default: bool = False  # the run a command given no -m uses (``pick.default_run``)


RANDOM_INIT = frozenset(
    ("normal_", "uniform_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
     "kaiming_uniform_", "kaiming_normal_", "orthogonal_")
)  # fmt: skip


class _SkipRandomInit(TorchFunctionMode):
    """Leave tensors as allocated instead of drawing their initial values, so that a model built
    to count its parameters costs memory the OS does not commit (the meta device would import
    torch._dynamo)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in RANDOM_INIT:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=64)
def count_parameters(cfg: ModelConfig) -> int:
    """Parameters of a model of this config (tied embeddings counted once)."""
    with _SkipRandomInit():
        return sum(p.numel() for p in Transformer(cfg).parameters())


def latest_write(run_dir: Path) -> float:
    """When the run last wrote config.json, log.jsonl, model.pt or last.pt; 0 if unreadable."""
    names = ("log.jsonl", "model.pt", "last.pt", "config.json")
    try:
        times = [(run_dir / n).stat().st_mtime for n in names if (run_dir / n).is_file()]
        return max(times, default=run_dir.stat().st_mtime)
    except OSError:
        return 0.0


def current_test_eval(run_dir: Path, train: TrainConfig) -> StoredEval | None:
    """The newest stored evaluation of the current model.pt on the run's own test split."""
    asked = EvalRequest()
    data = asked.data_for(train)
    found = [
        s
        for s in stored_evals(run_dir)
        if s.request.get("split") == data.split
        and s.request.get("data") == data.spec
        and s.request.get("limit") == asked.limit
    ]
    if not found or not (run_dir / "model.pt").is_file():
        return None
    try:
        sha = file_sha256(run_dir / "model.pt")
    except TformerError:
        return None
    return next((s for s in found if s.model_sha256 == sha), None)


def collect_run(run_dir: Path, details: bool = True) -> RunInfo:
    """Everything ``tformer runs`` shows about a folder (``details``: size and test scores)."""
    ts = latest_write(run_dir)
    updated = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds") if ts else None
    info: dict[str, Any] = dict(
        name=run_dir.name, path=str(run_dir), updated=updated, updated_ts=ts
    )
    running = is_running(run_dir)
    pid = lock_holder(run_dir) if running else None

    def running_or_broken(why: str, doing: str = "training") -> RunInfo:
        """Its row while a process holds the lock, else a broken one saying ``why``."""
        if running:
            detail = f"{doing}, pid {pid}" if pid else doing
            return RunInfo(state="running", detail=detail, pid=pid, **info)
        return RunInfo(state="broken", detail=why, **info)

    try:
        config = RunConfig.load(run_dir)
    except TformerError as e:  # while running: before its config.json is written
        return running_or_broken(str(e), "setting up")
    if details:
        info.update(row_settings(config))
    try:
        records = read_log(run_dir)
    except TformerError as e:
        return running_or_broken(str(e))
    end = stop_record(records)
    info.update(progress(records, end))
    if details:
        info.update(scores_on_test(run_dir, config.train, end))
    if running:
        return running_or_broken("")
    return RunInfo(**info, **stopped_state(run_dir, end, config.imported_from))


def row_settings(config: RunConfig) -> dict[str, Any]:
    """The row's fields from ``config.json``."""
    m, t = config.model, config.train
    try:
        parameters: int | None = count_parameters(m)
    except Exception:  # a model this version cannot build: the rest of the row still holds
        parameters = None
    return dict(
        data=t.data,
        src_lang=t.src_lang,
        tgt_lang=t.tgt_lang,
        parameters=parameters,
        encoder_layers=m.n_encoder_layers,
        decoder_layers=m.n_decoder_layers,
        d_model=m.d_model,
        heads=m.h,
        precision=t.precision,
    )


def progress(records: Sequence[dict[str, Any]], end: dict[str, Any]) -> dict[str, Any]:
    """How far the log says the run got, its best validation, and how it stopped."""
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    epochs = [r["epoch"] for r in records if isinstance(r.get("epoch"), int) and "loss" in r]
    valid = [r for r in records if isinstance(r.get("valid_bleu"), (int, float))]
    best = max(valid, key=lambda r: r["valid_bleu"], default=None)
    return dict(
        updates=max(steps, default=0),
        epochs=max(epochs, default=None),
        best_valid_bleu=None if best is None else float(best["valid_bleu"]),
        best_step=None if best is None else best.get("step"),
        stopped_by=end.get("stopped_by"),
    )


def scores_on_test(run_dir: Path, train: TrainConfig, end: dict[str, Any]) -> dict[str, Any]:
    """Test BLEU: from a current stored `tformer eval` result, else from the end of training."""
    found: dict[str, Any] = {}
    if isinstance(end.get("test_bleu"), (int, float)):
        found.update(test_bleu=float(end["test_bleu"]), test_bleu_from="train")
    stored = current_test_eval(run_dir, train)
    greedy = (stored.report.get("greedy") or {}) if stored is not None else {}
    if stored is not None and isinstance(greedy.get("bleu"), (int, float)):
        beam = stored.report.get("beam") or {}
        found.update(
            test_bleu=float(greedy["bleu"]),
            test_bleu_from="eval",
            test_beam_bleu=beam.get("bleu"),
            test_beam=beam.get("beam"),
        )
    return found


def stopped_state(
    run_dir: Path, end: dict[str, Any], imported_from: str | None = None
) -> dict[str, Any]:
    """The state of a run no process holds, its detail, and the command that resumes it."""
    has_model = (run_dir / "model.pt").is_file()
    stopped_by = end.get("stopped_by")  # a rule's, not an interruption's
    rule = isinstance(stopped_by, str) and not stopped_by.startswith(INTERRUPTIONS)
    finished = (rule and bool(stopped_by)) or "test_bleu" in end
    if has_model and not zipfile.is_zipfile(run_dir / "model.pt"):  # torch.save writes a zip
        return dict(state="broken", detail="model.pt is corrupt (not a whole checkpoint)")
    try:  # what translate and eval read beside model.pt
        load_tokenizer(run_dir / "tokenizer.json")
    except TformerError as e:
        return dict(state="broken", detail=str(e).replace(f"{run_dir}/", ""))
    if imported_from is not None and has_model:  # made elsewhere: tformer import
        return dict(state="imported", detail=f"from {imported_from}")
    if finished and has_model:
        return dict(state="finished", detail=str(end.get("stopped_by") or "finished"))
    if finished:
        return dict(state="broken", detail="finished, but model.pt is missing")
    how = "Ctrl-C" if str(end.get("stopped_by", "")).startswith("interrupted") else "killed"
    if not (run_dir / "last.pt").is_file():
        if has_model:  # --resume would refuse: no progress
            how += f", last.pt gone (train on: tformer train --init-from {run_dir})"
            return dict(state="interrupted", detail=how)
        how += " before its first save (resumes from step 0)"
    return dict(state="interrupted", detail=how, resume=f"tformer train --resume {run_dir}")


def run_folders(runs_dir: Path) -> list[Path]:
    """The run folders under ``runs_dir`` (not hidden ones), newest first, then by name."""
    if not runs_dir.is_dir():
        what = "is not a folder" if runs_dir.exists() else "does not exist"
        raise TformerError(f"{runs_dir} {what}: train a model first (tformer train), or give DIR")
    folders = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(folders, key=lambda p: (latest_write(p), p.name), reverse=True)


def list_runs(runs_dir: Path = RUNS_DIR) -> list[RunInfo]:
    """Every run folder under ``runs_dir``, newest first, the default one marked."""
    runs = [collect_or_say_why(p) for p in run_folders(runs_dir)]
    first = next((i for i, r in enumerate(runs) if usable(r)), None)
    if first is not None:
        runs[first] = dataclasses.replace(runs[first], default=True)
    return runs


def collect_or_say_why(run_dir: Path, details: bool = True) -> RunInfo:
    """``collect_run``, a folder that cannot be read a broken row."""
    try:
        return collect_run(run_dir, details=details)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        reason = f"cannot be read ({type(e).__name__}: {e})"
        return RunInfo(run_dir.name, str(run_dir), "broken", reason, None, 0.0)


# ---------------------------------------------------------------------------- the default run
def usable(run: RunInfo) -> bool:
    """Whether a command given no run may use it: finished, imported, interrupted with model.pt."""
    if run.state == "interrupted":
        return (Path(run.path) / "model.pt").is_file()
    return run.state in ("finished", "imported")


# ---------------------------------------------------------------------------- rendering
STATE_STYLES = {"running": "bold cyan", "finished": "green", "interrupted": "yellow",
                "broken": "bold red", "imported": ""}  # fmt: skip


def short_data(info: RunInfo) -> str:
    """``toy``, ``hf:NAME``, or a local path's last part; with the languages when set."""
    data = info.data or "?"
    if not data.startswith("hf:") and ("/" in data or os.sep in data):
        data = Path(data).name or data
    langs = f" {info.src_lang}-{info.tgt_lang}" if info.src_lang and info.tgt_lang else ""
    return data + langs


def model_size(info: RunInfo) -> str:
    """``1.01M 2+2 d128``."""
    if info.d_model is None:
        return ""
    n = "?" if info.parameters is None else f"{info.parameters / 1e6:.2f}M"
    return f"{n} {info.encoder_layers}+{info.decoder_layers} d{info.d_model}"


def test_cell(info: RunInfo) -> str:
    if info.test_bleu is None:
        return ""
    beam = f"/{info.test_beam_bleu:.2f}" if info.test_beam_bleu is not None else ""
    return f"{info.test_bleu:.2f}{beam}"


def when(ts: float) -> str:
    """``11-23 16:09`` this year, ``2025-11-23`` before."""
    if not ts:
        return ""
    t = datetime.fromtimestamp(ts)
    return t.strftime("%m-%d %H:%M" if t.year == datetime.now().year else "%Y-%m-%d")


def render_runs(runs: Sequence[RunInfo], runs_dir: Path | None = None) -> Table:
    """The runs as one table, ``*`` before the default run, a broken row saying why."""
    title = f"runs under {runs_dir}, newest first" if runs_dir is not None else "runs"
    caption = (
        "model: parameters, encoder+decoder layers, d_model; prec.: the --precision trained with;"
        " valid BLEU: the best; test BLEU: greedy (/ beam k, from tformer eval)"
    )
    table = Table(
        title=title, title_justify="left", caption=caption, caption_justify="left",
        box=None, pad_edge=False, header_style="bold underline",
    )  # fmt: skip
    longest = max((len(r.name) for r in runs), default=3)  # a name is what -m takes: kept whole
    table.add_column("", no_wrap=True)  # the default run's *
    table.add_column("run", overflow="fold", min_width=min(longest, 28), max_width=28)
    table.add_column("updated", no_wrap=True)
    table.add_column("data", overflow="fold", min_width=8, max_width=24)
    table.add_column("model", no_wrap=True)
    table.add_column("prec.", no_wrap=True)
    table.add_column("updates", justify="right", no_wrap=True)
    table.add_column("valid BLEU", justify="right", no_wrap=True)
    table.add_column("test BLEU", justify="right", no_wrap=True)
    table.add_column("state", overflow="fold", min_width=16, ratio=1)
    for r in runs:
        state = Text(r.state, style=STATE_STYLES[r.state])
        if r.detail and r.state != "finished":
            detail = r.detail.replace(f"{r.path}{os.sep}", "").replace(r.path, "the folder")
            state.append(f": {detail}", style="red" if r.state == "broken" else "dim")
        table.add_row(
            "*" if r.default else "",
            r.name,
            when(r.updated_ts),
            short_data(r) if r.data is not None else "",
            model_size(r),
            r.precision or "",
            "" if r.updates is None else f"{r.updates:,}",
            "" if r.best_valid_bleu is None else f"{r.best_valid_bleu:.2f}",
            test_cell(r),
            state,
        )
    return table


def runs_json(runs: Sequence[RunInfo]) -> str:
    """The rows as a JSON list, every field of ``RunInfo``."""
    return json.dumps([dataclasses.asdict(r) for r in runs], indent=2, ensure_ascii=False) + "\n"


def show_runs(runs_dir: Path | None, console: Console, as_json: bool = False) -> list[RunInfo]:
    """``tformer runs [DIR] [--json]``: print the table (or the JSON) to ``console``."""
    folder = RUNS_DIR if runs_dir is None else runs_dir
    runs = list_runs(folder)
    if as_json:
        console.out(runs_json(runs), end="", highlight=False)
    elif not runs:
        console.print(f"no runs under {folder}/ yet: tformer train makes one", markup=False)
    else:
        console.print(render_runs(runs, folder))
        if any(r.default for r in runs):
            console.print(
                "*: the run a command uses without -m (the newest finished or usable one)"
            )
        if any(r.resume for r in runs):
            console.print("resume an interrupted run: tformer train --resume RUN", style="dim")
    return runs
