"""Tests for tformer_cli.report.runs: the state of run folders (finished, interrupted, running,
broken), the run lock, the table and its JSON."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import DecodeConfig, TrainConfig
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.report import runs
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EvalRequest, StoredEval, keep_eval
from tformer_cli.report.runs import (
    RunLock,
    collect_run,
    is_running,
    list_runs,
    lock_run,
    read_log,
    show_runs,
)


def training_log(last_step: int = 100, valid_every: int = 50) -> list[dict]:
    """Training records every 25 updates and validations every ``valid_every``."""
    records = []
    for step in range(25, last_step + 1, 25):
        records.append(
            {
                "step": step,
                "epoch": 1,
                "loss": 5.0 - step / 100,
                "lr": 1e-3,
                "tgt_tokens_per_s": 1000.0,
                "elapsed": step / 10,
            }
        )
        if step % valid_every == 0:
            records.append(
                {
                    "step": step,
                    "epoch": 1,
                    "valid_loss": 3.0 - step / 100,
                    "valid_ppl": 9.0,
                    "valid_acc": 0.5,
                    "valid_bleu": 10.0 + step / 10,
                }
            )
    return records


def write_log(run_dir: Path, records: list[dict], tail: str = "") -> None:
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (run_dir / "log.jsonl").write_text(text, encoding="utf-8")


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


@pytest.fixture
def finished(runs_dir, make_run) -> Path:
    run_dir, _ = make_run(runs_dir / "done")
    end = [
        {"step": 100, "epoch": 1, "stopped_by": "reached --max-steps 100", "peak_memory_mib": 9.0},
        {"step": 100, "epoch": 1, "test_bleu": 12.5},
    ]
    write_log(run_dir, training_log() + end)
    (run_dir / "last.pt").write_bytes(b"state")
    return run_dir


@pytest.fixture
def interrupted(runs_dir, make_run) -> Path:
    """Killed after update 75: no stop record; last.pt from its validation at 50."""
    run_dir, _ = make_run(runs_dir / "cut")
    write_log(run_dir, training_log(75), tail='{"step": 100, "ep')  # half a line, as a kill leaves
    (run_dir / "last.pt").write_bytes(b"state")
    return run_dir


def test_a_run_stopped_by_a_rule_with_model_pt_is_finished(finished):
    info = collect_run(finished)
    assert (info.state, info.detail) == ("finished", "reached --max-steps 100")
    assert info.updates == 100 and info.best_valid_bleu == 20.0 and info.best_step == 100
    assert (info.test_bleu, info.test_bleu_from) == (12.5, "train")
    assert (info.encoder_layers, info.d_model, info.precision) == (2, 32, "fp32")
    assert info.parameters == sum(p.numel() for p in _model_of(finished).parameters())


def _model_of(run_dir: Path):
    from tformer_cli.model import Transformer

    return Transformer(RunConfig.load(run_dir).model)


def test_a_killed_run_is_interrupted_and_its_cut_last_line_is_ignored(interrupted):
    assert len(read_log(interrupted)) == 4
    info = collect_run(interrupted)
    assert (info.state, info.detail) == ("interrupted", "killed")
    assert info.resume == f"tformer train --resume {interrupted}" and info.updates == 75


def test_ctrl_c_and_a_resumed_finished_run_are_interrupted(finished, runs_dir, make_run):
    run_dir, _ = make_run(runs_dir / "ctrl-c")
    stop = {"step": 50, "epoch": 1, "stopped_by": "interrupted (Ctrl-C)", "peak_memory_mib": 1.0}
    write_log(run_dir, [*training_log(50), stop])
    (run_dir / "last.pt").write_bytes(b"state")
    assert (collect_run(run_dir).state, collect_run(run_dir).detail) == ("interrupted", "Ctrl-C")
    # a finished run resumed with a higher --max-steps, then killed: training records follow
    records = [*read_log(finished), {"step": 125, "epoch": 2, "loss": 1.0, "elapsed": 12.0}]
    write_log(finished, records)
    assert collect_run(finished).state == "interrupted"


def test_a_run_without_last_pt_resumes_from_step_0(runs_dir, make_run):
    run_dir, _ = make_run(runs_dir / "early")
    (run_dir / "model.pt").unlink()
    info = collect_run(run_dir)
    assert info.state == "interrupted" and "resumes from step 0" in info.detail
    assert info.updates == 0


def test_a_killed_run_whose_last_pt_is_gone_says_to_train_on_from_its_weights(interrupted):
    (interrupted / "last.pt").unlink()  # model.pt stays: --resume would refuse it
    info = collect_run(interrupted)
    assert info.state == "interrupted" and info.resume is None
    assert f"last.pt gone (train on: tformer train --init-from {interrupted})" in info.detail


def test_a_run_holding_the_lock_is_running_and_only_while_it_holds_it(interrupted):
    assert not is_running(interrupted)
    with RunLock(interrupted):
        assert is_running(interrupted)
        info = collect_run(interrupted)
        assert info.state == "running" and info.pid == os.getpid()
        with lock_run(interrupted, wait=0):  # this process holds it already: shared, no wait
            assert is_running(interrupted)
        assert is_running(interrupted)  # the outer holder still has it
    assert not is_running(interrupted) and collect_run(interrupted).state == "interrupted"
    lock = lock_run(interrupted)  # held until released (or the object or the process is gone)
    assert is_running(interrupted)
    lock.release()
    assert not is_running(interrupted)


def test_the_lock_of_a_killed_process_vanishes_with_it(interrupted):
    """SIGKILL leaves no chance to clean up: the kernel drops the flock, the file stays."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(interrupted / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert is_running(interrupted)
        with pytest.raises(TformerError, match="is being trained by another process"):
            lock_run(interrupted, wait=0.2)  # a second trainer waits a moment, then gives up
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (interrupted / ".lock").exists() and not is_running(interrupted)
    assert collect_run(interrupted).state == "interrupted"


def test_a_running_run_before_its_config_is_written_is_running(runs_dir):
    with RunLock(runs_dir / "new"):
        info = collect_run(runs_dir / "new")
    assert info.state == "running" and info.detail.startswith("setting up")


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("no config", "config.json is missing: the run's weights are there"),
        ("config not JSON", "config.json is corrupt"),
        ("log not UTF-8", "log.jsonl is not UTF-8 text"),
        ("bad line inside the log", "log.jsonl line 2 is not a JSON object"),
        ("finished without model.pt", "finished, but model.pt is missing"),
        ("truncated model.pt", "model.pt is corrupt"),
        ("no tokenizer", "tokenizer.json: no such tokenizer file"),
        ("tokenizer not JSON", "tokenizer.json: not a valid tokenizer file"),
    ],
)
def test_a_broken_folder_is_a_row_saying_why(finished, breakage, reason):
    if breakage == "no config":
        (finished / "config.json").unlink()
    elif breakage == "config not JSON":
        (finished / "config.json").write_text("{", encoding="utf-8")
    elif breakage == "log not UTF-8":
        (finished / "log.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\n')
    elif breakage == "bad line inside the log":
        (finished / "log.jsonl").write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n', encoding="utf-8")
    elif breakage == "no tokenizer":
        (finished / "tokenizer.json").unlink()
    elif breakage == "tokenizer not JSON":
        (finished / "tokenizer.json").write_text("garbage", encoding="utf-8")
    elif breakage == "truncated model.pt":
        whole = (finished / "model.pt").read_bytes()
        (finished / "model.pt").write_bytes(whole[: len(whole) // 2])
    else:
        (finished / "model.pt").unlink()
    info = collect_run(finished)
    assert info.state == "broken" and reason in info.detail
    out = " ".join(render(finished.parent).split())
    assert "broken: " in out and reason in out and "Traceback" not in out


def render(runs_dir: Path, as_json: bool = False, width: int = 200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    show_runs(runs_dir, console, as_json=as_json)
    return console.file.getvalue()


def test_runs_lists_every_state_newest_first_with_json(finished, interrupted, runs_dir):
    (runs_dir / "junk").mkdir()
    (runs_dir / ".cache").mkdir()  # hidden: the tokenized-data cache, not a run
    with RunLock(runs_dir / "live"):
        RunConfig.load(finished).save(runs_dir / "live")
        for age, name in enumerate(["live", "cut", "done", "junk"]):
            folder = runs_dir / name
            for f in [folder, *folder.iterdir()]:
                os.utime(f, (time.time() - 3600 * age,) * 2)
        found = list_runs(runs_dir)
        assert [(r.name, r.state) for r in found] == [
            ("live", "running"), ("cut", "interrupted"), ("done", "finished"), ("junk", "broken")
        ]  # fmt: skip
        rows = json.loads(render(runs_dir, as_json=True))
        table = render(runs_dir)
    assert [r["name"] for r in rows] == ["live", "cut", "done", "junk"]
    assert list(rows[0]) == [f.name for f in dataclasses.fields(runs.RunInfo)]
    assert rows[2]["test_bleu"] == 12.5 and rows[3]["detail"].endswith("(no config.json)")
    for text in ("live", "running", "interrupted: killed", "finished", "12.50", "20.00", "0.0"):
        assert text in table, text
    assert "tformer train --resume RUN" in table
    assert render(runs_dir, width=100)  # a narrow terminal folds, never fails


def test_runs_of_a_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(TformerError, match="does not exist: train a model first"):
        list_runs(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "no runs under" in render(tmp_path / "empty")


def test_test_bleu_comes_from_a_current_stored_eval(finished):
    config = RunConfig.load(finished)
    asked = EvalRequest(config=EvalConfig(DecodeConfig(beam=3)))  # the run's own test split
    key = asked.key(finished, config, torch.device("cpu"), None)
    assert key.model_sha256 == file_sha256(finished / "model.pt")
    report = {"greedy": {"bleu": 30.0}, "beam": {"bleu": 31.5, "beam": 3}}
    stored = StoredEval(
        key.digest, json.loads(json.dumps(dataclasses.asdict(key))),
        "2026-01-02T03:04:05+00:00", report, ["a"], ["a"], ["a"],
    )  # fmt: skip
    keep_eval(finished, stored)
    info = collect_run(finished)
    assert (info.test_bleu, info.test_beam_bleu, info.test_beam) == (30.0, 31.5, 3)
    assert info.test_bleu_from == "eval" and "30.00/31.50" in render(finished.parent)
    (finished / "model.pt").write_bytes(b"other weights")  # the stored result is stale now
    info = collect_run(finished)
    assert (info.test_bleu, info.test_bleu_from, info.test_beam_bleu) == (12.5, "train", None)


@pytest.mark.parametrize("asked", [{"limit": 3}, {"split": "valid"}, {"data": "other.tsv"}])
def test_test_bleu_ignores_a_stored_eval_of_other_data_or_part_of_the_test_split(finished, asked):
    config = RunConfig.load(finished)
    key = EvalRequest(**asked).key(finished, config, torch.device("cpu"), None)
    report = {"greedy": {"bleu": 30.0}, "beam": None}
    stored = StoredEval(
        key.digest, json.loads(json.dumps(dataclasses.asdict(key))),
        "2026-01-02T03:04:05+00:00", report, ["a"], None, ["a"],
    )  # fmt: skip
    keep_eval(finished, stored)
    info = collect_run(finished)
    assert (info.test_bleu, info.test_bleu_from) == (12.5, "train")


def test_config_with_other_settings_still_collects(runs_dir, make_run):
    run_dir, model = make_run(runs_dir / "ss")
    train = TrainConfig(device="cpu", precision="bf16", scheduled_sampling="linear")
    RunConfig(model.cfg, train).save(run_dir)
    assert collect_run(run_dir).precision == "bf16"


def test_a_folder_that_cannot_be_read_does_not_stop_the_listing(finished, interrupted, monkeypatch):
    collect = runs.collect_run

    def flaky(run_dir, **how):
        if run_dir.name == "cut":
            raise PermissionError(13, "Permission denied", str(run_dir / "log.jsonl"))
        return collect(run_dir, **how)

    monkeypatch.setattr(runs, "collect_run", flaky)
    found = {r.name: r for r in list_runs(finished.parent)}
    assert found["done"].state == "finished" and found["cut"].state == "broken"
    assert "cannot be read (PermissionError" in found["cut"].detail


def test_a_run_name_stays_whole_on_an_80_column_console(runs_dir, make_run):
    """The name is what ``-m`` takes: never folded into pieces, however narrow the console."""
    make_run(runs_dir / "toy-20261126-075542")
    console = Console(file=io.StringIO(), width=80, soft_wrap=True, color_system=None)  # as cli's
    show_runs(runs_dir, console)
    assert "toy-20261126-075542" in console.file.getvalue()


# ---------------------------------------------------------------------------- the default run
def test_runs_marks_the_run_a_command_given_none_uses(finished, interrupted, runs_dir, make_run):
    """Newest first: a running run, a broken one and an interrupted one without a model.pt are
    passed over; an interrupted run with its model.pt is usable: ``*`` and a legend mark it."""
    (runs_dir / "junk").mkdir()
    no_model, _ = make_run(runs_dir / "early")
    (no_model / "model.pt").unlink()
    with RunLock(runs_dir / "live"):
        RunConfig.load(finished).save(runs_dir / "live")
        for age, name in enumerate(["live", "junk", "early", "cut", "done"]):
            folder = runs_dir / name
            for f in [folder, *folder.iterdir()]:
                os.utime(f, (time.time() - 3600 * age,) * 2)
        listed = list_runs(runs_dir)
        table = render(runs_dir)
        rows = json.loads(render(runs_dir, as_json=True))
    assert [r.name for r in listed if r.default] == ["cut"]
    assert [r["name"] for r in rows if r["default"]] == ["cut"]
    marked = [line.split() for line in table.splitlines() if line.startswith("*")]
    assert [line[1] for line in marked] == ["cut", "the"]  # the row, then the legend
    assert "*: the run a command uses without -m" in table


def test_without_a_usable_run_nothing_is_marked(runs_dir):
    (runs_dir / "junk").mkdir()
    assert not any(r.default for r in list_runs(runs_dir))
    assert "*" not in render(runs_dir)
