"""Scheduled sampling: the schedules' eps_i, pass-2 input mixing, eps = 1 == teacher forcing."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.training.test_trainer import run
from tformer_cli.config import TrainConfig
from tformer_cli.data.tokenizer import BOS_ID, PAD_ID
from tformer_cli.errors import TformerError
from tformer_cli.training.scheduled_sampling import (
    mix_inputs,
    model_predictions,
    teacher_forcing_prob,
)


@pytest.mark.parametrize(
    ("schedule", "k", "step", "expected"),
    [
        ("linear", 0.01, 0, 1.0),
        ("linear", 0.01, 30, 0.7),
        ("linear", 0.01, 1000, 0.25),  # floored at eps_min = 0.25
        ("exp", 0.99, 0, 1.0),
        ("exp", 0.99, 100, 0.99**100),
        ("inverse-sigmoid", 10.0, 0, 10 / 11),
        ("inverse-sigmoid", 10.0, 50, 10 / (10 + math.exp(5))),
    ],
)
def test_schedules_give_bengio_eps_at_chosen_steps(schedule, k, step, expected):
    assert teacher_forcing_prob(step, schedule, k, eps_min=0.25) == pytest.approx(expected)


def test_warmup_is_pure_teacher_forcing_then_the_schedule_starts_from_zero():
    assert teacher_forcing_prob(99, "exp", 0.5, warmup=100) == 1.0
    assert teacher_forcing_prob(100, "exp", 0.5, warmup=100) == 1.0  # i = 0
    assert teacher_forcing_prob(102, "exp", 0.5, warmup=100) == 0.25  # i = 2


def test_off_is_always_teacher_forcing():
    assert teacher_forcing_prob(10**6, "off") == 1.0


@pytest.mark.parametrize(
    ("schedule", "k", "mix"),
    [("exp", 1.5, "argmax"), ("inverse-sigmoid", 0.5, "argmax"), ("cosine", None, "argmax"),
     ("linear", None, "beam")],
)  # fmt: skip
def test_settings_outside_a_schedules_domain_are_refused(schedule, k, mix):
    with pytest.raises(TformerError):  # TrainConfig holds no setting outside its domain
        TrainConfig(scheduled_sampling=schedule, ss_k=k, ss_mix=mix)


def test_mix_with_eps_zero_feeds_the_previous_prediction_but_keeps_bos_and_padding():
    tgt_in = torch.tensor([[BOS_ID, 10, 11, 12], [BOS_ID, 20, PAD_ID, PAD_ID]])
    predicted = torch.tensor([[30, 31, 32, 33], [40, 41, 42, 43]])  # prediction for slot t+1
    mixed = mix_inputs(tgt_in, predicted, 0.0, torch.Generator().manual_seed(0))
    assert mixed.tolist() == [[BOS_ID, 30, 31, 32], [BOS_ID, 40, PAD_ID, PAD_ID]]


def test_mix_with_eps_one_is_the_gold_input():
    tgt_in = torch.tensor([[BOS_ID, 10, 11, 12]])
    mixed = mix_inputs(tgt_in, torch.full((1, 4), 7), 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(mixed, tgt_in)


def test_mix_takes_gold_with_probability_eps():
    tgt_in = torch.cat([torch.full((2000, 1), BOS_ID), torch.full((2000, 10), 5)], dim=1)
    mixed = mix_inputs(tgt_in, torch.full((2000, 11), 9), 0.3, torch.Generator().manual_seed(0))
    assert (mixed[:, 1:] == 5).float().mean().item() == pytest.approx(0.3, abs=0.02)


def test_sampled_predictions_follow_the_tempered_distribution():
    probs = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.7, 0.2, 0.1])  # on ids 4, 5, 6
    logits = torch.log(probs).expand(1, 5000, 7)
    tokens = model_predictions(logits, "sample", 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens.flatten(), minlength=7).float() / 5000
    assert freq[4:].tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.03)
    assert model_predictions(logits, "argmax", 1.0, torch.Generator()).eq(4).all()


@pytest.mark.parametrize("mix", ["argmax", "sample"])
def test_predictions_are_never_pad_or_bos(mix):
    logits = torch.zeros(2, 50, 6)
    logits[..., PAD_ID] = logits[..., BOS_ID] = 10.0  # the model's favourites
    tokens = model_predictions(logits, mix, 1.0, torch.Generator().manual_seed(0))
    assert not ((tokens == PAD_ID) | (tokens == BOS_ID)).any()


def test_training_with_eps_one_equals_teacher_forcing(tmp_path, tiny_corpus, single_thread_trainer):
    """exp with k = 1 keeps eps = 1 but runs both passes: same losses, same weights."""
    plain, _ = run(tmp_path / "tf", tiny_corpus, max_steps=6, valid_every=100)
    ss, _ = run(
        tmp_path / "ss",
        tiny_corpus,
        max_steps=6,
        valid_every=100,
        scheduled_sampling="exp",
        ss_k=1.0,
    )
    a, b = plain.model.state_dict(), ss.model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_training_with_eps_below_one_changes_the_updates(
    tmp_path, tiny_corpus, single_thread_trainer
):
    plain, _ = run(tmp_path / "tf", tiny_corpus, max_steps=6, valid_every=100)
    ss, _ = run(
        tmp_path / "ss", tiny_corpus, max_steps=6, valid_every=100, scheduled_sampling="linear",
        ss_k=0.2,
    )  # fmt: skip
    a, b = plain.model.state_dict(), ss.model.state_dict()
    assert not all(torch.equal(a[name], b[name]) for name in a)


def test_the_training_log_records_eps(tmp_path, tiny_corpus, single_thread_trainer, monkeypatch):
    from tformer_cli.training import bookkeeping as training

    monkeypatch.setattr(training, "LOG_EVERY", 2)
    run(tmp_path / "ss", tiny_corpus, max_steps=6, valid_every=100, scheduled_sampling="linear",
        ss_k=0.1)  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "ss" / "log.jsonl").read_text().splitlines()]
    eps = {r["step"]: r["eps"] for r in lines if "eps" in r}
    assert eps == pytest.approx({2: 0.9, 4: 0.7, 6: 0.5})  # 1 - k*i at updates i = 1, 3, 5
