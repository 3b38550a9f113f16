"""Tests for tformer_cli.train.trainer: the loss and schedule by hand, overfitting a batch, and a
tiny end-to-end run whose --resume continues bit-for-bit."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

from tformer_cli.checkpoint import RunConfig, average_state_dicts, checkpoint_paths, load_state
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.errors import TformerError
from tformer_cli.train.loss import label_smoothed_loss
from tformer_cli.train.trainer import (
    Trainer,
    lr_at,
    new_run_dir,
    stop_on_interrupt,
)


# ---------------------------------------------------------------------------- schedule
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


def test_zero_warmup_is_refused_or_gives_a_finite_rate():
    try:
        cfg = TrainConfig(lr=1e-3, warmup=0)
    except TformerError:
        return  # refusing the setting up front is fine too
    for step in (1, 10, 1000):
        assert 0 < lr_at(step, cfg) <= 1e-3


def test_tiny_model_overfits_a_small_batch(tiny_model):
    model = tiny_model(seed=0).train()
    src = [[4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14, 15], [16, 17]]
    b = make_batch(src, [s[::-1] for s in src])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    for _ in range(300):
        real = b.tgt_out != 0
        logits = model(b.src, b.tgt_in, at=real)  # (N, V)
        loss = label_smoothed_loss(logits, b.tgt_out[real], 0.0) / b.n_tgt_tokens
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    with torch.no_grad():
        assert torch.equal(model.eval()(b.src, b.tgt_in).argmax(-1)[b.tgt_out != 0],
                           b.tgt_out[b.tgt_out != 0])  # fmt: skip


# ---------------------------------------------------------------------------- the trainer
MODEL = ModelConfig(
    vocab_size=100, d_model=32, h=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
    dropout=0.1, max_positions=64,
)  # fmt: skip


def train_cfg(corpus, **overrides) -> TrainConfig:
    values = dict(
        data=str(corpus), vocab_size=100, max_tokens=96, lr=3e-3, warmup=5, valid_every=8,
        max_steps=16, device="cpu", precision="fp32", seed=7,
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)


def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=200)


def run(run_dir, corpus, resume=False, **overrides):
    trainer = Trainer(
        run_dir, MODEL, train_cfg(corpus, **overrides), resume=resume, console=quiet_console()
    )
    return trainer, trainer.run(quiet=True)


def test_training_run_writes_every_file_of_the_run_folder(
    tmp_path, tiny_corpus, single_thread_trainer
):
    trainer, result = run(tmp_path / "run", tiny_corpus)
    run_dir = tmp_path / "run"
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "tokenizer.json", "model.pt", "last.pt", "log.jsonl"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    assert result.state.step == 16 and "max-steps" in result.stopped_by
    assert result.test_bleu is not None
    config = RunConfig.load(run_dir)
    assert config.model.vocab_size == trainer.tokenizer.get_vocab_size() <= 100
    assert config.train.max_steps == 16
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [8, 16]
    assert any("test_bleu" in r for r in records)
    last = load_state(run_dir / "last.pt")
    assert last["state"]["step"] == 16
    model_state = load_state(run_dir / "model.pt")
    assert model_state.keys() == trainer.model.state_dict().keys()


def test_clip_norm_zero_turns_clipping_off(tmp_path, tiny_corpus, single_thread_trainer):
    """A huge --clip-norm never clips, so it must train exactly as 0 (off) does."""
    off, _ = run(tmp_path / "off", tiny_corpus, max_steps=4, valid_every=100, clip_norm=0.0)
    huge, _ = run(tmp_path / "huge", tiny_corpus, max_steps=4, valid_every=100, clip_norm=1e9)
    tight, _ = run(tmp_path / "tight", tiny_corpus, max_steps=4, valid_every=100, clip_norm=1e-3)
    weights = [t.model.state_dict()["generator.weight"] for t in (off, huge, tight)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_no_training_pair_under_max_len_is_an_error_leaving_no_run(
    tmp_path, tiny_corpus, single_thread_trainer
):
    with pytest.raises(TformerError, match="no training pairs left: all 40"):
        run(tmp_path / "run", tiny_corpus, max_len=2)
    assert not (tmp_path / "run").exists()


def test_log_of_a_run_of_two_whole_epochs_never_says_epoch_3(
    tmp_path, tiny_corpus, single_thread_trainer
):
    trainer, _ = run(tmp_path / "run", tiny_corpus, max_steps=0, max_epochs=2, valid_every=100)
    assert (trainer.state.epoch, trainer.state.batch_in_epoch) == (2, 0)
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    assert {json.loads(line)["epoch"] for line in lines} <= {1, 2}


def test_resume_continues_bit_for_bit(tmp_path, tiny_corpus, single_thread_trainer):
    """16 steps straight == 8 steps, then --resume for 8 more (dropout on: the RNG is restored).
    The resumed run is asked for another lr: only the stopping rules may change."""
    straight, _ = run(tmp_path / "straight", tiny_corpus, max_steps=16, valid_every=100)
    run(tmp_path / "split", tiny_corpus, max_steps=8, valid_every=100)
    halfway = load_state(tmp_path / "split" / "last.pt")["model"]
    resumed, result = run(
        tmp_path / "split", tiny_corpus, resume=True, max_steps=16, valid_every=100, lr=1.0
    )
    assert resumed.cfg.lr == 3e-3
    assert result.state.step == 16
    assert resumed.state.epoch == straight.state.epoch
    a = load_state(tmp_path / "straight" / "last.pt")["model"]
    b = load_state(tmp_path / "split" / "last.pt")["model"]
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert not all(torch.equal(a[name], halfway[name]) for name in a)  # 8 more steps happened


@pytest.mark.parametrize(
    ("average_bleu", "kept"), [(30.0, "average"), (25.0, "average"), (24.9, "best")]
)
def test_the_average_of_the_last_checkpoints_is_kept_only_if_it_validates_as_well_as_the_best(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch, average_bleu, kept
):
    """Validations at steps 4, 8, 12, 16 score 10, 25, 20, 15 (best: step 8), the average of
    steps 8-16 scores ``average_bleu``; the test split is decoded once, after the choice."""
    scores, splits = iter([10.0, 25.0, 20.0, 15.0, average_bleu]), []

    def greedy_bleu(self, split, limit=None):
        splits.append(split)
        return next(scores) if split == "valid" else 1.0

    monkeypatch.setattr(Trainer, "greedy_bleu", greedy_bleu)
    run(tmp_path / "run", tiny_corpus, valid_every=4, average=3)
    run_dir = tmp_path / "run"
    paths = checkpoint_paths(run_dir)
    assert [p.name for p in paths] == ["step-000008.pt", "step-000012.pt", "step-000016.pt"]
    assert splits == ["valid"] * 5 + ["test"]
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [4, 8, 12, 16]
    choice = next(r for r in records if "kept" in r)
    assert choice["kept"] == kept and choice["average_bleu"] == average_bleu
    assert (choice["best_bleu"], choice["best_step"]) == (25.0, 8)
    model = load_state(run_dir / "model.pt")
    expected = (
        average_state_dicts(load_state(p) for p in paths)
        if kept == "average"
        else load_state(paths[0])
    )
    assert all(torch.equal(model[k], expected[k]) for k in expected)


def test_new_run_dir_refuses_to_overwrite_a_trained_run(tmp_path):
    fresh = new_run_dir(tmp_path, "x", "toy")
    assert fresh == tmp_path / "x"
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "last.pt").write_bytes(b"")
    with pytest.raises(TformerError, match="--resume"):
        new_run_dir(tmp_path, "x", "toy")
    assert new_run_dir(tmp_path, None, "data/my-corpus").name.startswith("my-corpus-")
    for name in ("../escape", "a/b", "..", ""):
        with pytest.raises(TformerError, match="plain folder name"):
            new_run_dir(tmp_path, name, "toy")


def test_first_ctrl_c_only_sets_the_stop_flag_and_a_second_one_aborts():
    import os
    import signal

    with stop_on_interrupt() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag == [True]  # the loop finishes its update and saves last.pt
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_mid_run_saves_last_pt_and_reports_the_interruption(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    """A real SIGINT during update 3: the update finishes, last.pt holds step 3, no test BLEU."""
    import os
    import signal

    step = Trainer._step

    def step_then_ctrl_c(self, group):
        result = step(self, group)
        if self.state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(Trainer, "_step", step_then_ctrl_c)
    _, result = run(tmp_path / "run", tiny_corpus, max_steps=16, valid_every=100)
    assert result.interrupted and result.stopped_by == "interrupted (Ctrl-C)"
    assert result.state.step == 3 and result.test_bleu is None
    assert load_state(tmp_path / "run" / "last.pt")["state"]["step"] == 3


def test_resume_past_its_limit_makes_no_update(tmp_path, tiny_corpus, single_thread_trainer):
    run(tmp_path / "run", tiny_corpus, max_steps=8, valid_every=100)
    before = load_state(tmp_path / "run" / "last.pt")["model"]
    _, result = run(tmp_path / "run", tiny_corpus, resume=True, max_steps=4, valid_every=100)
    assert result.state.step == 8 and "max-steps 4" in result.stopped_by
    after = load_state(tmp_path / "run" / "last.pt")["model"]
    assert all(torch.equal(before[name], after[name]) for name in before)
