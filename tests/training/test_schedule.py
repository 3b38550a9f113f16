"""Tests for tformer_cli.training.schedule: the paper's warm-up and inverse-sqrt decay, and the
budget-aware schedule of --max-minutes ("Budgeted Training", Li et al. 2020): its shape (the
estimate of the budget: test_budget.py); the elapsed time of the log's records."""

from __future__ import annotations

import itertools
import math

import pytest

from tests.training.test_trainer import log_records, run
from tformer_cli.config import TrainConfig
from tformer_cli.errors import TformerError
from tformer_cli.training import bookkeeping
from tformer_cli.training.schedule import lr_at


# ---------------------------------------------------------------------------- the paper's
@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1e-3 / 100),  # step 0 counts as step 1
        (1, 1e-3 / 100),
        (50, 0.5e-3),
        (100, 1e-3),  # the peak, at the end of warm-up
        (400, 0.5e-3),  # 1e-3 * sqrt(100 / 400)
        (10_000, 1e-4),  # 1e-3 * sqrt(100 / 10000)
    ],
)
def test_lr_warms_up_linearly_then_decays_as_inverse_sqrt(step, expected):
    cfg = TrainConfig(lr=1e-3, warmup=100)
    assert lr_at(step, cfg) == pytest.approx(expected, rel=1e-12)


def test_zero_warmup_is_refused_up_front():
    with pytest.raises(TformerError, match="warmup=0: must be at least 1"):
        TrainConfig(lr=1e-3, warmup=0)


# ---------------------------------------------------------------------------- shape
@pytest.mark.parametrize(
    ("decay", "step", "expected"),
    [
        ("linear", 50, 0.5),  # warm-up as ever
        ("linear", 100, 1.0),  # the peak
        ("linear", 325, 0.75),  # a quarter of the way from warm-up to the end
        ("linear", 550, 0.5),
        ("linear", 1000, 0.0),  # the budget's last update
        ("linear", 5000, 0.0),  # past it: still 0
        ("cosine", 100, 1.0),
        ("cosine", 325, (1 + math.cos(math.pi / 4)) / 2),
        ("cosine", 550, 0.5),
        ("cosine", 1000, 0.0),
    ],
)
def test_budgeted_lr_warms_up_then_decays_to_zero_at_the_last_update(decay, step, expected):
    cfg = TrainConfig(lr=1.0, warmup=100, decay=decay, max_minutes=15)
    assert lr_at(step, cfg, total=1000) == pytest.approx(expected, abs=1e-12)


def test_budgeted_lr_never_rises_after_warmup():
    cfg = TrainConfig(lr=1e-3, warmup=10, max_minutes=15)  # auto: linear
    lrs = [lr_at(step, cfg, total=200) for step in range(10, 260)]
    assert all(a >= b for a, b in itertools.pairwise(lrs)) and lrs[0] == 1e-3 and lrs[-1] == 0


def test_auto_decay_is_linear_with_a_time_budget_and_rsqrt_without():
    assert TrainConfig(max_minutes=15).budget_decay == "linear"
    assert TrainConfig().budget_decay is None
    assert TrainConfig(max_minutes=15, decay="rsqrt").budget_decay is None
    assert TrainConfig(max_steps=10, decay="cosine").budget_decay == "cosine"
    rsqrt = TrainConfig(lr=1e-3, warmup=100)
    assert lr_at(400, rsqrt, total=500) == pytest.approx(0.5e-3)  # no budget: total ignored


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"decay": "step"}, "decay='step': must be one of auto, rsqrt, linear, cosine"),
        ({"decay": "linear"}, "decay='linear': needs max_minutes or max_steps"),
        ({"decay": "cosine", "max_steps": 0}, "decay='cosine': needs max_minutes or"),
    ],
)
def test_bad_decay_settings_are_one_line_errors(values, message):
    with pytest.raises(TformerError, match=message):
        TrainConfig(**values)


def test_validation_and_every_other_record_carry_the_elapsed_time(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    monkeypatch.setattr(bookkeeping, "LOG_EVERY", 4)
    run(tmp_path / "run", tiny_corpus, max_steps=8, valid_every=4)
    records = log_records(tmp_path / "run")
    assert {"valid_bleu", "loss", "test_bleu", "stopped_by"} <= {k for r in records for k in r}
    assert all(isinstance(r["elapsed"], float) for r in records)
    assert [r["elapsed"] for r in records] == sorted(r["elapsed"] for r in records)
    at_4 = [r for r in records if r["step"] == 4 and ("loss" in r or "valid_bleu" in r)]
    assert len(at_4) == 2 and at_4[0]["elapsed"] == at_4[1]["elapsed"] > 0  # its weights' time
