"""Tests for tformer_cli.training.state: the progress record last.pt keeps, the micro-batch seeds of
exact resume, the kill points of the crash-safety tests (whose SIGKILLs
tests/training/test_trainer.py and test_distributed.py make real), and the peak memory reported."""

from __future__ import annotations

import pytest
import torch

from tformer_cli import device
from tformer_cli.training import state as state_module
from tformer_cli.training.state import Budget, KillPoints, TrainState, micro_seeds

# The keys of last.pt's "state", in order: older runs resume from them, so they never change
SAVED_KEYS = [
    "step", "epoch", "batch_in_epoch", "best_bleu", "best_step", "stale_validations", "elapsed",
    "tgt_tokens", "skipped", "skipped_in_a_row", "budget_updates", "budget_minutes",
    "update_seconds", "mark_step", "mark_elapsed", "valid_seconds", "decay_from",
    "decay_progress",
]  # fmt: skip


def test_last_pt_keeps_one_flat_record_with_the_budget_under_its_saved_names():
    budget = Budget(updates=90, minutes=15.0, update_seconds=0.4, mark_step=40, decay_from=40)
    state = TrainState(step=41, epoch=2, elapsed=20.5, budget=budget)
    saved = state.as_saved()
    assert list(saved) == SAVED_KEYS
    assert (saved["budget_updates"], saved["budget_minutes"], saved["decay_from"]) == (90, 15, 40)
    assert TrainState.saved(saved) == state


def test_micro_seeds_are_a_function_of_seed_update_and_index_alone():
    assert micro_seeds(1, 5, 3)[:2] == micro_seeds(1, 5, 2)  # whichever share a rank takes
    assert len(set(micro_seeds(1, 5, 4))) == 4
    assert micro_seeds(1, 5, 2) != micro_seeds(1, 6, 2) != micro_seeds(2, 5, 2)
    assert all(0 <= s < 2**56 for s in micro_seeds(7, 0, 8))  # 7 bytes: a valid torch seed


@pytest.mark.parametrize(("at", "fires"), [(None, []), ("save:2", [4]), ("update:1", [0])])
def test_kill_points_fire_at_the_nth_event_of_their_kind(monkeypatch, at, fires):
    """The events' indices where the process would be SIGKILLed (os.kill recorded instead)."""
    kills, index = [], [0]
    monkeypatch.setattr(state_module.os, "kill", lambda pid, sig: kills.append(index[0]))
    on_event = KillPoints(at)
    for i, event in enumerate(["update", "save", "update", "update", "save", "save"]):
        index[0] = i
        on_event(event)
    assert kills == fires


def test_kill_points_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TFORMER_TEST_KILL_AT", "update:9")
    assert KillPoints.from_env().at == "update:9"
    monkeypatch.delenv("TFORMER_TEST_KILL_AT")
    assert KillPoints.from_env().at is None


def test_memory_peak_names_its_anonymous_part_where_proc_says(monkeypatch, tmp_path):
    status = tmp_path / "status"
    status.write_text("VmRSS:\t  204800 kB\nRssAnon:\t  102400 kB\nRssFile:\t 102400 kB\n")
    monkeypatch.setattr(device, "PROC_STATUS", str(status))
    monkeypatch.setattr(state_module, "peak_memory_mib", lambda device: 300.0)
    peak = state_module.MemoryPeak()
    peak.note()
    status.write_text("RssAnon:\t  51200 kB\n")  # lower later: the peak stays
    text, record = peak.line(torch.device("cpu"))
    assert text == "peak memory 300 MiB (anonymous 100 MiB)"
    assert record == {"peak_memory_mib": 300.0, "peak_anonymous_mib": 100.0}
    monkeypatch.setattr(device, "PROC_STATUS", str(tmp_path / "missing"))  # macOS: no /proc
    assert state_module.MemoryPeak().line(torch.device("cpu")) == (
        "peak memory 300 MiB",
        {"peak_memory_mib": 300.0},
    )
