"""Tests for tformer_cli.training.trainer: overfitting a batch, and a tiny end-to-end run whose
--resume continues bit-for-bit."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tformer_cli.checkpoint import RunConfig, average_state_dicts, checkpoint_paths, load_state
from tformer_cli.compile import maybe_compile
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.errors import TformerError
from tformer_cli.training import bookkeeping
from tformer_cli.training import trainer as trainer_module
from tformer_cli.training.bookkeeping import MAX_NONFINITE
from tformer_cli.training.loss import label_smoothed_loss
from tformer_cli.training.setup import new_run_dir, prepare
from tformer_cli.training.state import stop_on_interrupt
from tformer_cli.training.trainer import Trainer, forward_loss


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
        max_steps=16, device="cpu", precision="fp32", seed=7, max_len=64,
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)


def quiet_console() -> Console:
    """A console that records what the trainer says, as the CLI's does: no log path, no wrap
    (a wrapped log path made the test depend on the length of pytest's temporary folder)."""
    return Console(file=io.StringIO(), width=200, log_path=False, soft_wrap=True)


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
    stop = next(r for r in records if "stopped_by" in r)
    said = trainer.console.file.getvalue()
    peak = re.search(r"; peak memory ([\d,]+) MiB \(anonymous ([\d,]+) MiB\) *$", said, re.M)
    assert peak, said
    assert [int(n.replace(",", "")) for n in peak.groups()] == [
        round(stop["peak_memory_mib"]),
        round(stop["peak_anonymous_mib"]),
    ]
    assert 0 < stop["peak_anonymous_mib"] < stop["peak_memory_mib"]
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


def test_training_bounds_onednns_kernel_cache(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    """After the command line's set-up, a trainer sets oneDNN's cache to the training bound
    (the variable is read at the first kernel, so before the model's first update)."""
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # restored after the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setattr("tformer_cli.device._process_wide", True)
    run(tmp_path / "r", tiny_corpus, max_steps=1, valid_every=100)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "32"


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
    for name in (".cache", ".hidden"):  # runs/.cache holds the data cache; tformer runs skips dots
        with pytest.raises(TformerError, match="must not start with a dot"):
            new_run_dir(tmp_path, name, "toy")


def test_first_ctrl_c_only_sets_the_stop_flag_and_a_second_one_aborts():
    import os
    import signal

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run in the background
    with stop_on_interrupt() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag == [True]  # the loop finishes its update and saves last.pt
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_mid_run_saves_last_pt_and_reports_the_interruption(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch, signum
):
    """A real SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption; torchrun stopping its
    workers) during update 3: the update finishes, last.pt holds step 3, no test BLEU."""
    import signal

    step = Trainer._step

    def step_then_signal(self, group):
        result = step(self, group)
        if self.state.step == 3:
            os.kill(os.getpid(), getattr(signal, signum))
        return result

    monkeypatch.setattr(Trainer, "_step", step_then_signal)
    _, result = run(tmp_path / "run", tiny_corpus, max_steps=16, valid_every=100)
    assert result.interrupted and result.stopped_by == "interrupted (Ctrl-C or SIGTERM)"
    assert result.state.step == 3 and result.test_bleu is None
    assert load_state(tmp_path / "run" / "last.pt")["state"]["step"] == 3


def test_resume_past_its_limit_makes_no_update(tmp_path, tiny_corpus, single_thread_trainer):
    """A finished run resumed with a limit behind it is left as it was (no validation, no test,
    no new stop record, its settings kept); one killed before its test score finishes it."""
    run_dir = tmp_path / "run"
    run(run_dir, tiny_corpus, max_steps=8, valid_every=100)
    files = {
        name: (run_dir / name).read_bytes() for name in ("last.pt", "log.jsonl", "config.json")
    }
    console = quiet_console()  # a later --epochs does not lift the --max-steps that stopped it
    cfg = train_cfg(tiny_corpus, max_steps=4, max_epochs=50, valid_every=100)
    result = Trainer(run_dir, MODEL, cfg, resume=True, console=console).run(quiet=True)
    assert result.state.step == 8 and "max-steps 4" in result.stopped_by
    assert result.test_bleu is None
    assert {name: (run_dir / name).read_bytes() for name in files} == files
    said = " ".join(console.file.getvalue().split())
    assert "(reached --max-steps 4, which still applies): nothing to do" in said
    assert "--max-steps (0: no limit) trains on" in said
    log = (run_dir / "log.jsonl").read_text().splitlines()
    (run_dir / "log.jsonl").write_text("\n".join(log[:-1]) + "\n")  # killed before the test
    _, result = run(run_dir, tiny_corpus, resume=True, max_steps=4, valid_every=100)
    assert result.test_bleu is not None and "test_bleu" in log_records(run_dir)[-1]
    before = torch.load(io.BytesIO(files["last.pt"]), weights_only=True)["model"]
    assert_same_weights(before, load_state(run_dir / "last.pt")["model"])  # no update made


def log_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# ---------------------------------------------------------------------------- data limits
def test_validation_pairs_longer_than_the_model_are_skipped_and_said(tmp_path, tiny_corpus):
    """A valid pair past max_positions used to crash validation (forced_pass's position slice)."""
    (tiny_corpus / "valid.tsv").write_text(
        "red blue\tblue red\n" + " ".join(["red"] * 40) + "\tred\n", encoding="utf-8"
    )
    log = io.StringIO()
    cfg = train_cfg(tiny_corpus, max_len=16)
    _, _, splits = prepare(
        tmp_path / "run",
        cfg,
        Console(file=log, width=300, log_path=False, soft_wrap=True),
        False,
        16,
    )
    assert len(splits["valid"].src) == 1 and splits["valid"].refs == ["blue red"]
    assert "skipped 1 valid pairs longer than the model's 15 tokens" in log.getvalue()


def test_max_len_above_the_models_positions_is_an_error(tmp_path, tiny_corpus):
    with pytest.raises(TformerError, match="--max-len 65 is more than the model's 64 positions"):
        run(tmp_path / "run", tiny_corpus, max_len=65)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- numerical guards
def poison_updates(monkeypatch, bad: set[int]) -> list[int]:
    """Make the loss NaN on the given 1-based calls of the training loss; returns the calls."""
    calls: list[int] = []

    def loss(logits, target, smoothing):
        calls.append(len(calls) + 1)
        value = label_smoothed_loss(logits, target, smoothing)
        return value * float("nan") if len(calls) in bad else value

    monkeypatch.setattr(trainer_module, "label_smoothed_loss", loss)
    return calls


def test_a_nan_loss_skips_its_update_and_is_counted_in_the_log(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    poison_updates(monkeypatch, {3})
    trainer, result = run(tmp_path / "run", tiny_corpus, max_steps=6, valid_every=100)
    assert result.state.step == 6 and trainer.state.skipped == 1
    skipped = [r for r in log_records(tmp_path / "run") if "skipped_update" in r]
    assert len(skipped) == 1 and skipped[0].pop("elapsed") > 0
    assert skipped == [{"step": 2, "epoch": 1, "skipped_update": "non-finite loss or gradient",
                        "skipped": 1}]  # fmt: skip
    last = load_state(tmp_path / "run" / "last.pt")["model"]
    assert all(torch.isfinite(t).all() for t in last.values())


def test_nonfinite_updates_in_a_row_stop_the_run_keeping_the_last_save(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    poison_updates(monkeypatch, set(range(11, 100)))  # from update 11 on, every loss is NaN
    with pytest.raises(TformerError, match=f"{MAX_NONFINITE} updates in a row had a non-finite"):
        run(tmp_path / "run", tiny_corpus, max_steps=30, valid_every=8)
    last = load_state(tmp_path / "run" / "last.pt")
    assert last["state"]["step"] == 8  # the validation's save; nothing saved after the NaNs
    assert all(torch.isfinite(t).all() for t in last["model"].values())
    records = log_records(tmp_path / "run")
    assert [r["skipped"] for r in records if "skipped_update" in r] == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------- resume
def test_resume_of_a_folder_without_last_pt_starts_from_step_zero(
    tmp_path, tiny_corpus, single_thread_trainer
):
    """A kill before the first save leaves config.json and tokenizer.json: resume starts over
    with the run's settings and ends where an uninterrupted run does."""
    straight, _ = run(tmp_path / "straight", tiny_corpus, max_steps=12, valid_every=100)
    run(tmp_path / "split", tiny_corpus, max_steps=4, valid_every=100)
    (tmp_path / "split" / "last.pt").unlink()
    (tmp_path / "split" / "model.pt").unlink()
    console = quiet_console()
    cfg = train_cfg(tiny_corpus, max_steps=12, valid_every=100)
    resumed = Trainer(tmp_path / "split", MODEL, cfg, resume=True, console=console)
    assert "has no last.pt (stopped before its first save): starting from step 0" in (
        console.file.getvalue()
    )
    assert not (tmp_path / "split" / "log.jsonl").read_text()  # the lost steps' records went
    resumed.run(quiet=True)
    assert_same_weights(
        load_state(tmp_path / "straight" / "last.pt")["model"],
        load_state(tmp_path / "split" / "last.pt")["model"],
    )
    assert resumed.state.step == straight.state.step == 12


def test_resume_of_a_trained_run_without_last_pt_is_refused_leaving_it_whole(
    tmp_path, tiny_corpus, single_thread_trainer
):
    """A trained run whose last.pt was deleted (to save space) cannot resume: starting over
    would overwrite its model.pt and log; the error points to --init-from instead."""
    run_dir = tmp_path / "run"
    run(run_dir, tiny_corpus, max_steps=4, valid_every=2)
    (run_dir / "last.pt").unlink()
    kept = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(TformerError, match=r"no last.pt .* cannot be resumed.*--init-from"):
        run(run_dir, tiny_corpus, resume=True, max_steps=8, valid_every=2)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == kept


def test_resume_of_a_run_another_process_trains_says_only_that(
    tmp_path, tiny_corpus, single_thread_trainer
):
    run_dir = tmp_path / "run"
    run(run_dir, tiny_corpus, max_steps=4, valid_every=100)
    for name in ("last.pt", "model.pt"):  # as before its first save: resume would start over
        (run_dir / name).unlink()
    holder = subprocess.Popen(  # another trainer: a process holding the run's lock
        [sys.executable, "-c",
         "import time\nfrom pathlib import Path\nfrom tformer_cli.report.runs import lock_run\n"
         f"lock = lock_run(Path({str(run_dir)!r}))\nprint('locked', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        console = quiet_console()
        cfg = train_cfg(tiny_corpus, max_steps=8, valid_every=100)
        with pytest.raises(TformerError, match="being trained by another process"):
            Trainer(run_dir, MODEL, cfg, resume=True, console=console)
    finally:
        holder.kill()
        holder.wait()
    assert "no last.pt" not in console.file.getvalue()  # nothing said before the refusal


def test_resume_drops_log_records_past_the_saved_step(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    monkeypatch.setattr(bookkeeping, "LOG_EVERY", 2)
    run(tmp_path / "run", tiny_corpus, max_steps=6, valid_every=100)
    log = tmp_path / "run" / "log.jsonl"
    with log.open("a") as f:  # what a killed run wrote after its save, and half a line
        f.write('{"step": 8, "loss": 1.0}\n{"step": 10, "lo')
    run(tmp_path / "run", tiny_corpus, resume=True, max_steps=10, valid_every=100)
    steps = [r["step"] for r in log_records(tmp_path / "run") if "loss" in r]
    assert steps == [2, 4, 6, 8, 10]
    assert all(r.get("loss") != 1.0 for r in log_records(tmp_path / "run"))


def test_resume_on_another_device_continues_with_a_note(
    tmp_path, tiny_corpus, single_thread_trainer
):
    """last.pt holds no generator state (each micro-batch seeds its own), so a run saved on
    CUDA resumes on CPU; it says that the kernels differ."""
    run(tmp_path / "run", tiny_corpus, max_steps=4, valid_every=100)
    path = tmp_path / "run" / "last.pt"
    last = load_state(path)
    assert "rng" not in last
    torch.save({**last, "device": "cuda"}, path)
    console = quiet_console()
    cfg = train_cfg(tiny_corpus, max_steps=8, valid_every=100)
    trainer = Trainer(tmp_path / "run", MODEL, cfg, resume=True, console=console)
    assert "saved on cuda, resumed on cpu" in console.file.getvalue()
    assert trainer.run(quiet=True).state.step == 8


# ---------------------------------------------------------------------------- SIGKILL
TRAIN_ARGS = [
    "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1", "--dropout", "0.1",
    "--vocab-size", "100", "--max-tokens", "96", "--lr", "3e-3", "--warmup", "5",
    "--valid-every", "8", "--valid-bleu-size", "2", "--max-steps", "24", "--epochs", "0",
    "--max-len", "64", "--seed", "7", "--device", "cpu", "--precision", "fp32", "--quiet",
]  # fmt: skip


def tformer_train(args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TFORMER_THREADS": "1"}
    env.pop("TFORMER_TEST_KILL_AT", None)
    if kill_at:
        env["TFORMER_TEST_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "tformer_cli", "train", *args], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_any_point_loses_at_most_the_work_since_the_last_save(tmp_path, tiny_corpus):
    """A real `tformer train` process is SIGKILLed three times: before its first save, inside a
    save (new last.pt written, not yet renamed), and after updates that were not saved yet (with
    --save-every so short that every update saves). Each time `--resume` goes on, and the final
    weights equal an uninterrupted run's bit for bit; the log never shows a step twice."""
    common = ["--data", str(tiny_corpus), "--runs-dir", str(tmp_path), *TRAIN_ARGS]
    assert tformer_train([*common, "--name", "straight"]).returncode == 0
    killed = tmp_path / "killed"
    resume = ["--resume", str(killed), "--quiet"]

    first = tformer_train([*common, "--name", "killed"], kill_at="update:3")
    assert first.returncode == -9 and not (killed / "last.pt").exists()
    assert (killed / "config.json").exists()

    inside = tformer_train(resume, kill_at="save:2")  # saves at steps 8 and 16: dies in the 2nd
    assert inside.returncode == -9, inside.stderr
    assert load_state(killed / "last.pt")["state"]["step"] == 8

    after = tformer_train([*resume, "--save-every", "1e-9"], kill_at="update:6")  # steps 9..14
    assert after.returncode == -9, after.stderr
    assert load_state(killed / "last.pt")["state"]["step"] == 13  # saved after 13, not after 14

    done = tformer_train(resume)
    assert done.returncode == 0, done.stderr
    for name in ("last.pt", "model.pt"):
        a, b = load_state(tmp_path / "straight" / name), load_state(killed / name)
        assert_same_weights(a.get("model", a), b.get("model", b))
    steps = [r["step"] for r in log_records(killed) if "valid_bleu" in r]
    assert steps == [8, 16, 24]
    assert not list(killed.glob(".*.tmp"))  # the save cut short left no temporary file behind


# ---------------------------------------------------------------------------- CUDA (skipped here)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_training_resumes_and_its_run_translates_on_cpu(tmp_path, tiny_corpus):
    """On a GPU: a run trained on CUDA (the device's precision: bf16 autocast or tf32) resumes
    there, stays finite, and its model.pt translates on CPU like any other run."""
    from tformer_cli.checkpoint import load_run
    from tformer_cli.decode.translate import translate_texts

    run(tmp_path / "run", tiny_corpus, device="cuda", precision="auto", max_steps=8)
    trainer, result = run(tmp_path / "run", tiny_corpus, resume=True, device="cuda", max_steps=16)
    assert trainer.device.type == "cuda" and result.state.step == 16
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    loaded = load_run(tmp_path / "run", device="cpu", precision="fp32")
    (translation,) = translate_texts(loaded, ["red blue green"])
    assert translation.source == "red blue green" and len(translation.hypotheses) == 1


# ---------------------------------------------------------------------------- --compile
@pytest.mark.slow
def test_compile_on_is_one_graph_for_every_batch_shape_and_trains_as_eager(
    tmp_path, tiny_corpus, single_thread_trainer, monkeypatch
):
    """``--compile on``: Dynamo traces ``forward_loss`` whole (fullgraph: the real-position
    selection and the hand-written loss break no graph), once for the batches of every shape
    (dynamic), and with dropout 0 trains to eager's weights; ``auto`` is eager. The
    aot_eager backend checks the graph and its autograd without Inductor's minutes of C++
    compiling (Inductor's numbers: ``COMPILE_PAYS``)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model, cfg = dataclasses.replace(MODEL, dropout=0.0), dict(max_steps=4, valid_every=100)
    eager = Trainer(tmp_path / "eager", model, train_cfg(tiny_corpus, **cfg), resume=False,
                    console=quiet_console())  # fmt: skip
    assert eager.forward is forward_loss
    eager.run(quiet=True)

    counter, frames = CompileCounterWithBackend("aot_eager"), []

    def aot_eager(fn, mode, auto, name, on_notice=None, **options):
        compiled = maybe_compile(fn, mode, auto, name, on_notice, **options, backend=counter,
                                 fullgraph=True)  # fmt: skip

        def counted(*args):
            out = compiled(*args)
            frames.append(counter.frame_count)
            return out

        return counted

    monkeypatch.setattr(trainer_module, "maybe_compile", aot_eager)
    torch._dynamo.reset()
    console = quiet_console()
    Trainer(tmp_path / "compiled", model, train_cfg(tiny_corpus, compile="on", **cfg),
            resume=False, console=console).run(quiet=True)  # fmt: skip
    said = console.file.getvalue()
    assert "compiled the training step in" in said and "failed" not in said
    assert len(frames) == 4 and frames[0] > 0 and set(frames) == {frames[0]}  # no recompile
    a, b = (load_state(tmp_path / n / "last.pt")["model"] for n in ("eager", "compiled"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)


def test_bad_compile_mode_is_a_one_line_error():
    with pytest.raises(TformerError, match="compile='yes': must be one of auto, on, off"):
        TrainConfig(compile="yes")


# ---------------------------------------------------------------------------- --tensorboard
def test_tensorboard_gets_the_numbers_of_the_log(tmp_path, tiny_corpus, single_thread_trainer):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    trainer = Trainer(tmp_path / "run", MODEL, train_cfg(tiny_corpus, max_steps=8, valid_every=4),
                      resume=False, console=quiet_console(), tensorboard=board)  # fmt: skip
    trainer.run(quiet=True)
    events = EventAccumulator(str(board))
    events.Reload()
    assert {"valid_bleu", "valid_loss", "test_bleu"} <= set(events.Tags()["scalars"])
    logged = [r["valid_loss"] for r in log_records(tmp_path / "run") if "valid_loss" in r]
    assert [e.step for e in events.Scalars("valid_loss")] == [4, 8]
    assert [e.value for e in events.Scalars("valid_loss")] == pytest.approx(logged, rel=1e-6)


def test_tensorboard_without_its_package_is_a_one_line_error_before_any_work(
    tmp_path, tiny_corpus, monkeypatch
):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(TformerError, match="--tensorboard needs the tensorboard package: pip"):
        Trainer(tmp_path / "run", MODEL, train_cfg(tiny_corpus), resume=False,
                console=quiet_console(), tensorboard=tmp_path / "tb")  # fmt: skip
    assert not (tmp_path / "run").exists()
