"""``tformer train --use``: the learner's loss and scheduled-sampling mix train the model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.learn.test_use import counted
from tformer_cli.api import training as api_training
from tformer_cli.cli import app
from tformer_cli.learn import use as use_module
from tformer_cli.learn.use import TRAINED, Use
from tformer_cli.training import loss as loss_module

TINY = [
    "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--vocab-size", "60",
    "--max-tokens", "96", "--warmup", "2", "--valid-every", "3", "--valid-bleu-size", "2",
    "--max-steps", "3", "--epochs", "0", "--seed", "7", "--device", "cpu", "--precision", "fp32",
    "--scheduled-sampling", "linear", "--ss-k", "0.2",
]  # fmt: skip


def trained(corpus: Path, runs: Path, name: str, *args: str) -> tuple[dict, str]:
    """``tformer train`` of the tiny corpus: the weights of its last.pt, and its stderr."""
    result = CliRunner().invoke(
        app, ["train", "--data", str(corpus), "--runs-dir", str(runs), "--name", name, *TINY, *args]
    )
    assert result.exit_code == 0, result.output
    state = torch.load(runs / name / "last.pt", map_location="cpu", weights_only=False)
    return state["model"], result.stderr


def test_train_use_trains_with_the_learner_s_loss_and_mix_as_tformer(
    tiny_corpus: Path, solutions_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFORMER_THREADS", "1")
    # tformer's own loss through autograd, as --use differentiates the learner's: the fused
    # gradient differs in rounding, which Adam scales up where a gradient is zero (K's bias)
    with monkeypatch.context() as unfused:
        unfused.setattr(loss_module, "FUSED_GRADIENT", False)
        own, _ = trained(tiny_corpus, tmp_path, "own")
    calls: Counter[str] = Counter()
    prepare = use_module.prepare

    def counting(path: Path, acting: tuple[str, ...]) -> Use:
        return counted(prepare(path, acting), calls)

    monkeypatch.setattr(api_training, "prepare", counting)  # the command trains as the API does
    yours, said = trained(tiny_corpus, tmp_path, "yours", "--use", str(solutions_file))
    assert "--compile off" in said and "using your label_smoothed_loss, mix_inputs" in said
    assert set(calls) == set(TRAINED) and calls["label_smoothed_loss"] >= 3, calls
    assert calls["mix_inputs"] == calls["label_smoothed_loss"]  # one of each per micro-batch
    assert own.keys() == yours.keys()
    for name, weights in own.items():
        assert torch.equal(yours[name], weights), name


def test_train_use_in_several_processes_is_a_usage_error(solutions_file: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--use", str(solutions_file), "--nproc", "2"])
    assert result.exit_code == 2 and "--use" in result.stderr


def test_python_train_use_trains_as_the_command_does(
    tiny_corpus: Path, solutions_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tformer_cli as tformer

    monkeypatch.setenv("TFORMER_THREADS", "1")
    command, _ = trained(tiny_corpus, tmp_path, "command", "--use", str(solutions_file))
    calls: Counter[str] = Counter()
    prepare = use_module.prepare
    monkeypatch.setattr(api_training, "prepare", lambda p, a: counted(prepare(p, a), calls))
    run = tformer.train(
        str(tiny_corpus), runs_dir=tmp_path, name="python", use=solutions_file, quiet=True,
        d_model=16, heads=2, d_ff=32, layers=1, vocab_size=60, max_tokens=96, warmup=2,
        valid_every=3, valid_bleu_size=2, max_steps=3, epochs=0, seed=7, device="cpu",
        precision="fp32", scheduled_sampling="linear", ss_k=0.2,
    )  # fmt: skip
    assert set(calls) == set(TRAINED) and calls["label_smoothed_loss"] >= 3, calls
    state = torch.load(run.path / "last.pt", map_location="cpu", weights_only=False)
    for name, weights in command.items():
        assert torch.equal(state["model"][name], weights), name


def test_python_train_use_of_a_missing_file_is_a_tformer_error(tmp_path: Path) -> None:
    import tformer_cli as tformer

    with pytest.raises(tformer.TformerError, match="no such file"):
        tformer.train(use=tmp_path / "missing.py", max_steps=1, runs_dir=tmp_path)
    assert not (tmp_path / "runs").exists() and list(tmp_path.iterdir()) == []
