"""Tests for tformer_cli.training.setup: the settings of a new run (recipe, options, defaults)
and of a resumed one, the policy the CLI and the Python API share. Data set-up:
tests/training/test_trainer.py and tests/data/test_data_cache.py; fine-tuning:
tests/training/test_fine_tuning.py."""

from __future__ import annotations

import pytest

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.errors import TformerError
from tformer_cli.training.setup import new_configs, resume_options, resumed_configs


def test_given_options_win_over_the_recipe_and_the_defaults_fill_the_rest():
    recipe = {"model": {"d_model": 64, "h": 4}, "train": {"lr": 1e-3, "warmup": 50}}
    model, train = new_configs({"warmup": 10, "layers": 3, "vocab_size": 500}, recipe)
    assert (model.d_model, model.h, model.n_encoder_layers, model.n_decoder_layers) == (64, 4, 3, 3)
    assert (train.lr, train.warmup, train.vocab_size, model.vocab_size) == (1e-3, 10, 500, 500)
    assert train.max_tokens == TrainConfig().max_tokens and model.d_ff == ModelConfig(1).d_ff
    assert new_configs({}) == (ModelConfig(vocab_size=TrainConfig().vocab_size), TrainConfig())


def test_data_and_plain_files_together_are_refused(tmp_path):
    (tmp_path / "a.de").write_text("x\n")
    (tmp_path / "a.en").write_text("y\n")
    files = {"src_file": tmp_path / "a.de", "tgt_file": tmp_path / "a.en"}
    with pytest.raises(TformerError, match="give --data or --src-file/--tgt-file, not both"):
        new_configs({"data": "toy", **files})
    assert new_configs(files)[1].src_file == str(tmp_path / "a.de")


def test_a_resumed_run_takes_only_stopping_rules_save_interval_and_device():
    overrides, ignored = resume_options(
        {"epochs": 9, "max_steps": 5, "device": "cpu", "lr": 1.0, "layers": 4, "name": "x"}
    )
    assert overrides == {"max_epochs": 9, "max_steps": 5, "device": "cpu"}
    assert ignored == ["layers", "lr", "name"]


def test_resumed_configs_keep_the_runs_own_and_say_what_they_ignore(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = RunConfig(ModelConfig(vocab_size=40, d_model=32), TrainConfig(lr=1e-3, max_steps=8))
    saved.save(run)
    said = []
    model, train = resumed_configs(run, {"max_steps": 20}, ["lr"], said.append)
    assert model == saved.model and train == TrainConfig(lr=1e-3, max_steps=20)
    assert said == ["note: --lr ignored: a resumed run keeps its settings"]
    (run / "model.pt").write_bytes(b"")  # a trained run without last.pt
    with pytest.raises(TformerError, match=r"has a model\.pt but no last\.pt"):
        resumed_configs(run)
