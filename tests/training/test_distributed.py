"""Tests for tformer_cli.training.distributed and DDP training: two real gloo processes under
torchrun (a `tformer train --nproc 2` launch, killed, then a resume by tests/training/ddp_worker.py)
against one process on the same global batches."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.training.test_trainer import TRAIN_ARGS, log_records, quiet_console
from tformer_cli.checkpoint import RunConfig, load_state
from tformer_cli.training.distributed import World
from tformer_cli.training.trainer import Trainer

WORKER = Path(__file__).with_name("ddp_worker.py")
# Two processes sum the gradients in another order than one process accumulating them, and
# Adam's m / sqrt(v) turns last-bit differences of tiny gradients into lr-sized steps, so 12
# updates of a model this size drift apart by a fraction of this tolerance. The exact check
# of the arithmetic is the worker's gradient gap (< 1e-6); this only bounds the drift.
ATOL = 1e-3


def test_each_rank_takes_every_nth_batch_of_an_update():
    group = [[0], [1], [2], [3], [4]]
    assert World(0, 2).shard(group) == [[0], [2], [4]]
    assert World(1, 2).shard(group) == [[1], [3]]
    assert World().shard(group) == group
    assert World(1, 2).main is False and World(0, 2).main


def close_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=ATOL, rtol=0, msg=name)


def env(**extra: str) -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if k != "TFORMER_TEST_KILL_AT"}
    return {**values, "TFORMER_THREADS": "1", **extra}


def one_process(run_dir: Path, like: Path, max_steps: int, resume: bool = False) -> None:
    """Train ``run_dir`` in this process with the settings of the run ``like``."""
    saved = RunConfig.load(like)
    cfg = dataclasses.replace(saved.train, max_steps=max_steps)
    Trainer(run_dir, saved.model, cfg, resume=resume, console=quiet_console()).run(quiet=True)


@pytest.mark.slow
def test_two_gloo_processes_train_as_one_killed_and_resumed_under_another_n(
    tmp_path, tiny_corpus, single_thread_trainer
):
    """`tformer train --nproc 2 --accum 2` (dropout on): both processes are SIGKILLed after
    update 9 (last.pt holds update 8); two processes resume to 12 (tests/training/ddp_worker.py:
    the gradient of one DDP step equals one process's, every rank ends with rank 0's weights,
    and both ranks memory-map the same data cache files); one process then resumes to 16.
    Weights and validation losses equal a single process's with --accum 2, which takes the
    same two batches per update. With --max-minutes rank 0 estimates the run's updates at the
    end of warm-up (update 3) and again after each validation (update 4, ...), and broadcasts
    them (the schedule ends at --max-steps, the earlier, so the clock changes no weight)."""
    killed = tmp_path / "ddp"
    # --max-minutes: rank 0's estimate of the run's updates, broadcast (no rank waits)
    cmd = [sys.executable, "-m", "tformer_cli", "train", "--data", str(tiny_corpus),
           "--runs-dir", str(tmp_path), "--name", "ddp", *TRAIN_ARGS, "--max-steps", "12",
           "--valid-every", "4", "--warmup", "3", "--accum", "2", "--nproc", "2",
           "--max-minutes", "60"]  # fmt: skip
    first = subprocess.run(cmd, env=env(TFORMER_TEST_KILL_AT="update:9"), capture_output=True,
                           text=True, timeout=180)  # fmt: skip
    assert first.returncode != 0
    saved = load_state(killed / "last.pt")["state"]
    assert saved["step"] == 8, first.stderr[-2000:]
    assert saved["decay_from"] == 4 and saved["budget_updates"] > 12  # re-estimated, no hang

    out = tmp_path / "worker.json"
    worker = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
              "2", str(WORKER), str(killed), "12", str(out)]  # fmt: skip
    second = subprocess.run(worker, env=env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["gradient_gap"] < 1e-6
    assert (report["world"], report["step"], report["same_weights"]) == (2, 12, True)
    rank0, rank1 = report["mapped"]  # both ranks map the same cache files (one page cache copy)
    assert rank0 == rank1
    assert {Path(m.split(" ", 2)[2]).name for m in rank0} == {
        "train.arrow", "valid.arrow", "test.arrow",
    }  # fmt: skip
    assert all(str(tmp_path / ".cache" / "encoded-") in m for m in rank0)

    alone = tmp_path / "one"
    one_process(alone, killed, 12)
    close_weights(load_state(alone / "last.pt")["model"], load_state(killed / "last.pt")["model"])
    losses = {r["step"]: r["valid_loss"] for r in log_records(killed) if "valid_loss" in r}
    expected = {r["step"]: r["valid_loss"] for r in log_records(alone) if "valid_loss" in r}
    assert losses.keys() == expected.keys() == {4, 8, 12}
    assert losses == pytest.approx(expected, rel=1e-3)

    one_process(killed, killed, 16, resume=True)  # another N: one process goes on
    one_process(alone, alone, 16, resume=True)
    close_weights(load_state(alone / "last.pt")["model"], load_state(killed / "last.pt")["model"])


def test_ctrl_c_of_a_two_process_run_saves_and_exits_130_without_torchruns_traceback(
    tmp_path, tiny_corpus
):
    """A terminal's Ctrl-C reaches `tformer train --nproc 2` alone (torchrun runs in a session
    of its own); it passes the signal to the workers, which save and stop: exit 130, as one
    process, and none of torchrun's SignalException traceback."""
    cmd = [sys.executable, "-m", "tformer_cli", "train", "--data", str(tiny_corpus),
           "--runs-dir", str(tmp_path), "--name", "cut", *TRAIN_ARGS, "--max-steps", "100000",
           "--valid-every", "100000", "--nproc", "2"]  # fmt: skip
    launcher = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    log = tmp_path / "cut" / "log.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)  # training has begun: its first log record (update 25)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert "interrupted: continue with tformer train --resume" in stderr
    assert load_state(tmp_path / "cut" / "last.pt")["state"]["step"] >= 25
