"""Tests for tformer_cli.training.state's Budget: the estimate of the updates --max-minutes
allows, made at the end of warm-up and after every validation, saved in last.pt, and a resume
that changes the budget."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.training.test_trainer import (
    MODEL,
    assert_same_weights,
    log_records,
    quiet_console,
    run,
    train_cfg,
)
from tformer_cli.checkpoint import load_state
from tformer_cli.training import bookkeeping
from tformer_cli.training import state as state_module
from tformer_cli.training.schedule import lr_at
from tformer_cli.training.state import TrainState, budget_updates
from tformer_cli.training.trainer import Trainer


def test_budget_updates_divide_the_time_left_by_the_measured_rate():
    assert budget_updates(step=10, elapsed=60.0, update_seconds=0.5, minutes=2) == 130
    assert budget_updates(step=10, elapsed=500.0, update_seconds=0.5, minutes=2) == 11  # past it


# ---------------------------------------------------------------------------- in a run
def fixed_estimate(monkeypatch, updates_left: int = 30) -> None:
    """The estimate at the end of warm-up, made independent of the clock: ``updates_left``
    more updates (a re-estimate after a resume would end elsewhere)."""

    def estimate(step: int, elapsed: float, seconds: float, minutes: float) -> int:
        return step + updates_left

    monkeypatch.setattr(state_module, "budget_updates", estimate)


def test_the_estimate_is_made_at_the_end_of_warmup_and_saved(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    monkeypatch.setattr(bookkeeping, "LOG_EVERY", 1)
    fixed_estimate(monkeypatch)
    trainer, _ = run(
        tmp_path / "run", tiny_corpus, max_steps=0, max_epochs=2, max_minutes=60, valid_every=100,
        warmup=2,
    )  # fmt: skip
    state = load_state(tmp_path / "run" / "last.pt")["state"]
    assert (state["budget_updates"], state["budget_minutes"]) == (2 + 30, 60)
    assert state["update_seconds"] > 0 and state["decay_from"] == 2  # the end of warm-up
    assert state["mark_step"] == 2  # where the measuring for the next estimate begins
    cfg = trainer.cfg
    lrs = {r["step"]: r["lr"] for r in log_records(tmp_path / "run") if "lr" in r}
    assert len(lrs) > 3 and lrs == {step: pytest.approx(lr_at(step, cfg, 32)) for step in lrs}
    assert lrs[2] == cfg.lr and lrs[3] == pytest.approx(cfg.lr * 29 / 30)


def test_the_estimate_is_made_again_after_every_validation_and_the_decay_never_jumps(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    """Warm-up ends at update 2 before any validation; each validation (every 4 updates) takes
    >= 1 s more than usual, and each later estimate spreads it over the 4 updates it follows.
    Every estimate moves the end 30 updates past it, and the learning rate goes on down from
    where it stood. The last.pt of a validation counts its second in the time spent validating
    and in the total."""
    monkeypatch.setattr(bookkeeping, "LOG_EVERY", 1)
    rates: dict[int, float] = {}

    def estimate(step: int, elapsed: float, seconds: float, minutes: float) -> int:
        rates[step] = seconds
        return step + 30

    validate = Trainer.validate

    def slow_validation(self: Trainer) -> dict[str, float]:
        time.sleep(1.0)
        return validate(self)

    saves: dict[int, tuple[float, float]] = {}  # step: (valid_seconds, elapsed) as saved
    save = Trainer._save_last

    def recorded_save(self: Trainer) -> None:
        saves.setdefault(self.state.step, (self.state.budget.valid_seconds, self.state.elapsed))
        save(self)

    monkeypatch.setattr(state_module, "budget_updates", estimate)
    monkeypatch.setattr(Trainer, "validate", slow_validation)
    monkeypatch.setattr(Trainer, "_save_last", recorded_save)
    trainer, _ = run(
        tmp_path / "run", tiny_corpus, max_steps=0, max_epochs=3, max_minutes=60, valid_every=4,
        warmup=2,
    )  # fmt: skip
    said = " ".join(trainer.console.file.getvalue().split())  # the lines as one
    last = trainer.state.step
    assert last > 8 and list(rates) == [2, *range(4, last, 4)]  # warm-up's end, each validation
    valid_seconds, elapsed = saves[4]  # the last.pt of the first validation: a resume point
    assert 1.0 <= valid_seconds < elapsed
    assert all(rates[s] > 1.0 / 4 for s in rates if s >= 4)  # a validation's second, spread
    state = load_state(tmp_path / "run" / "last.pt")["state"]
    latest = max(rates)
    assert (state["budget_updates"], state["decay_from"]) == (latest + 30, latest)
    assert state["update_seconds"] == pytest.approx(rates[latest])
    assert "s per validation (every 4)" in said and "to 0 at update 34 (was 32)" in said
    lrs = [r["lr"] for r in log_records(tmp_path / "run") if "lr" in r and r["step"] >= 2]
    steps = [a - b for a, b in itertools.pairwise(lrs)]
    assert lrs[0] == trainer.cfg.lr and all(0 < d < trainer.cfg.lr / 25 for d in steps)


def test_a_last_pt_of_an_older_version_still_resumes():
    """Fields that older versions saved and this one no longer keeps are left out."""
    state = TrainState.saved({"step": 40, "budget_updates": 90, "budget_final": True})
    assert (state.step, state.budget.updates, state.budget.decay_from) == (40, 90, 0)


def test_resume_keeps_the_saved_estimate_bit_for_bit(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    """Three epochs straight == one epoch, then --resume for two: the resumed run decays
    to the update estimated before the stop (re-estimating would end 30 updates after it)."""
    fixed_estimate(monkeypatch)
    budget = dict(max_steps=0, max_minutes=60, valid_every=100, warmup=2)
    straight, _ = run(tmp_path / "straight", tiny_corpus, max_epochs=3, **budget)
    first, _ = run(tmp_path / "split", tiny_corpus, max_epochs=1, **budget)
    assert first.state.step > 2  # past warm-up: the estimate was made before the stop
    resumed, _ = run(tmp_path / "split", tiny_corpus, resume=True, max_epochs=3, **budget)
    assert resumed.state.budget.updates == straight.state.budget.updates == 32
    assert resumed.state.step == straight.state.step > first.state.step
    assert_same_weights(
        load_state(tmp_path / "straight" / "last.pt")["model"],
        load_state(tmp_path / "split" / "last.pt")["model"],
    )


def test_resume_with_another_max_minutes_recomputes_the_estimate_and_says_so(
    tmp_path, tiny_corpus, single_thread_trainer
):
    run(tmp_path / "run", tiny_corpus, max_steps=8, max_minutes=60, valid_every=100)
    saved = load_state(tmp_path / "run" / "last.pt")["state"]
    assert saved["budget_updates"] > 8  # an hour of tiny updates

    def resume(minutes: float) -> tuple[Trainer, str]:
        console = quiet_console()
        cfg = train_cfg(tiny_corpus, max_steps=0, max_minutes=minutes, valid_every=100)
        trainer = Trainer(tmp_path / "run", MODEL, cfg, resume=True, console=console)
        return trainer, console.file.getvalue()

    same, said = resume(60)
    assert same.state.budget.updates == saved["budget_updates"] and "max-minutes" not in said
    longer, said = resume(120)
    expected = budget_updates(8, saved["elapsed"], saved["update_seconds"], 120)
    assert longer.state.budget.updates == expected > saved["budget_updates"]
    assert longer.state.budget.minutes == 120
    assert f"--max-minutes 60 -> 120: the learning rate now reaches 0 at update {expected}" in said
    assert f"(was {saved['budget_updates']};" in said
    assert longer.lr(8) == pytest.approx(same.lr(8))  # the decay goes on from where it stood
    assert longer.lr(9) > same.lr(9)  # and more slowly, to the later end
    unbounded, said = resume(0)
    assert unbounded.state.budget.updates == 0 and unbounded.cfg.budget_decay is None
    assert "no --max-minutes any more (was 60): the learning rate follows 1/sqrt decay" in said
    assert unbounded.lr(9) == pytest.approx(lr_at(9, unbounded.cfg))
