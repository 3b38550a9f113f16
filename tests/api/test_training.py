"""``train``, ``runs`` and a trained run's evaluation and history, from Python: the same run
folder and settings as ``tformer train`` with the same options."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import tformer_cli as tformer
from tformer_cli import TformerError
from tformer_cli.cli import app

TINY = dict(
    d_model=32, heads=4, d_ff=64, layers=1, vocab_size=60, max_tokens=96, warmup=2,
    valid_every=4, valid_bleu_size=2, max_steps=4, epochs=0, device="cpu", precision="fp32",
)  # fmt: skip
TINY_ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


@pytest.fixture
def trained(tiny_corpus, tmp_path, single_thread_trainer):
    return tformer.train(
        str(tiny_corpus), runs_dir=tmp_path / "runs", name="api", quiet=True, **TINY
    )


def test_train_makes_the_run_the_command_makes(trained, tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["train", "--data", str(tiny_corpus), "--name", "cli", "--quiet", *TINY_ARGS]
    )
    assert result.exit_code == 0, result.output
    ours = json.loads((trained.path / "config.json").read_text(encoding="utf-8"))
    theirs = json.loads((tmp_path / "runs" / "cli" / "config.json").read_text(encoding="utf-8"))
    assert ours == theirs
    assert trained.path == tmp_path / "runs" / "api" and (trained.path / "model.pt").is_file()


def test_history_evaluate_and_runs_of_a_trained_run(trained, tmp_path):
    records = trained.history()
    assert records[0]["step"] >= 1 and any("valid_loss" in r for r in records)
    assert "<svg" in trained.curves()._repr_html_()
    before = set(trained.path.rglob("*"))
    report = trained.evaluate(limit=3, beam=2)
    assert set(trained.path.rglob("*")) == before  # nothing written unless asked
    data = report.to_dict()
    assert data["sizes"]["sentences"] == 3 and data["beam"]["beam"] == 2
    assert "BLEU" in report._repr_html_()
    assert torch.get_num_threads() == 1  # evaluation's thread count is put back
    assert [r.name for r in tformer.runs(tmp_path / "runs")] == ["api"]


def test_resume_keeps_the_run_s_settings_and_takes_a_new_stopping_rule(
    trained, single_thread_trainer
):
    resumed = tformer.train(resume=trained.path, max_steps=6, d_model=64, quiet=True)
    assert resumed.config.model.d_model == 32 and resumed.config.train.max_steps == 6
    assert any(r.get("step") == 6 for r in resumed.history())


def test_an_unknown_option_or_recipe_is_a_tformer_error(tmp_path):
    with pytest.raises(TformerError, match="no such train option"):
        tformer.train(warmupp=3)
    with pytest.raises(TformerError, match="recipe"):
        tformer.train(recipe="no-such.toml", runs_dir=tmp_path)
