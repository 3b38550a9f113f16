"""Configs: validation, recipes (presets) and their merging with command-line options."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli import cli
from tformer_cli.config import ModelConfig, TrainConfig, from_dict, load_recipe
from tformer_cli.device import resolve_precision
from tformer_cli.errors import TformerError


def test_shipped_recipes_build_valid_configs():
    for name in ("toy", "multi30k"):
        recipe = load_recipe(name)
        from_dict(TrainConfig, recipe["train"])
        from_dict(ModelConfig, {"vocab_size": 8000, **recipe["model"]})


def test_toy_recipe_equals_the_built_in_defaults():
    recipe = load_recipe("toy")
    assert from_dict(TrainConfig, recipe["train"]) == TrainConfig()
    model = from_dict(ModelConfig, {"vocab_size": 1, **recipe["model"]})
    assert model == ModelConfig(vocab_size=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [("[model]\nwidth = 3\n", "unknown \\[model\\] settings width"),
     ("[optim]\nlr = 3\n", "unknown tables optim"), ("[model\n", "not valid TOML")],
)  # fmt: skip
def test_bad_recipe_files_give_one_line_errors(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(TformerError, match=message):
        load_recipe(str(path))


def test_unknown_recipe_name_lists_the_shipped_ones():
    with pytest.raises(TformerError, match="multi30k, toy"):
        load_recipe("nope")


@pytest.mark.parametrize("field", ["warmup", "max_tokens", "accum", "valid_every"])
def test_train_config_refuses_non_positive_counts(field):
    with pytest.raises(TformerError, match=field.replace("_", "-")):
        TrainConfig(**{field: 0})


@pytest.mark.parametrize("average", [-1, 1])
def test_train_config_refuses_averaging_fewer_than_two_checkpoints(average):
    with pytest.raises(TformerError, match="--average"):
        TrainConfig(average=average)


def test_model_config_needs_d_model_divisible_by_heads():
    with pytest.raises(TformerError, match="divisible"):
        ModelConfig(vocab_size=10, d_model=130, h=4)


def test_preset_values_apply_and_explicit_options_win(tmp_path, monkeypatch):
    """--preset multi30k sets pre-LN, d=256, de->en; --layers 1 given on the line wins."""
    captured = {}

    class FakeTrainer:
        def __init__(self, run_dir, model_cfg, train_cfg, **kwargs):
            captured.update(model=model_cfg, train=train_cfg)
            raise TformerError("stop here")

    monkeypatch.setattr("tformer_cli.train.trainer.Trainer", FakeTrainer)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", "--preset", "multi30k", "--layers", "1"])
    assert result.exit_code == 1 and "stop here" in result.output
    model, train = captured["model"], captured["train"]
    assert (model.d_model, model.norm, model.dropout) == (256, "pre", 0.3)
    assert model.n_encoder_layers == model.n_decoder_layers == 1
    assert (train.src_lang, train.tgt_lang, train.patience, train.average) == ("de", "en", 8, 5)
    assert json.dumps(train.lr) == "0.0007"


def test_auto_precision_is_fp32_for_narrow_models_and_explicit_choices_are_kept():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, d_model=128) is None
    assert resolve_precision("fp32", cpu, d_model=1024) is None
    assert resolve_precision("bf16", cpu, d_model=64) is torch.bfloat16
    with pytest.raises(TformerError):
        resolve_precision("fp16", cpu)


@pytest.fixture
def captured_trainer(monkeypatch):
    """Stops ``tformer train`` at the Trainer and keeps the configs it was given."""
    captured = {}

    class FakeTrainer:
        def __init__(self, run_dir, model_cfg, train_cfg, **kwargs):
            captured.update(run_dir=run_dir, model=model_cfg, train=train_cfg)
            raise TformerError("stop here")

    monkeypatch.setattr("tformer_cli.train.trainer.Trainer", FakeTrainer)
    return captured


def test_resume_keeps_the_runs_settings_and_takes_only_given_stopping_rules(
    tmp_path, captured_trainer
):
    from tformer_cli.checkpoint import RunConfig

    run = tmp_path / "run"
    saved = TrainConfig(max_steps=20, max_epochs=100, patience=8, lr=7e-4)
    RunConfig(ModelConfig(vocab_size=50, d_model=64), saved).save(run)
    (run / "last.pt").write_bytes(b"")
    runner = CliRunner()
    result = runner.invoke(cli.app, ["train", "--resume", str(run), "--quiet"])
    assert result.exit_code == 1 and "stop here" in result.output
    assert captured_trainer["train"] == saved and captured_trainer["model"].d_model == 64
    result = runner.invoke(
        cli.app, ["train", "--resume", str(run), "--max-steps", "40", "--lr", "1", "--d-model", "8"]
    )
    assert captured_trainer["train"] == TrainConfig(
        max_steps=40, max_epochs=100, patience=8, lr=7e-4
    )
    assert captured_trainer["model"].d_model == 64
    assert "--d-model, --lr ignored" in result.stderr
    result = runner.invoke(
        cli.app, ["train", "--resume", str(run), "--preset", "multi30k", "--name", "x"]
    )
    assert "--name, --preset ignored" in result.stderr
    assert captured_trainer["train"] == saved and captured_trainer["run_dir"] == run


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--d-model", "0"], "d_model must be at least 1"), (["--heads", "0"], "h must be"),
     (["--layers", "0"], "n_encoder_layers must be"), (["--dropout", "1.5"], "dropout must be"),
     (["--epochs", "-1"], "--epochs must be 0"), (["--max-steps", "-3"], "--max-steps"),
     (["--clip-norm=-1"], "--clip-norm must be 0 (off)"),
     (["--label-smoothing", "1.5"], "--label-smoothing must be in [0, 1)"),
     (["--valid-bleu-size", "0"], "--valid-bleu-size must be at least 1"),
     (["--ss-tau", "0"], "--ss-tau must be > 0"), (["--ss-min", "2"], "--ss-min must be in")],
)  # fmt: skip
def test_bad_model_and_stopping_values_are_one_line_errors(
    tmp_path, monkeypatch, captured_trainer, options, message
):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", *options, "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert message in result.stderr and "stop here" not in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [("[model]\nd_model = 'big'\n", "d_model must be of type int, not 'big'"),
     ("[train]\nmax_steps = 'x'\n", "max_steps must be of type int"),
     ("[train]\nlr = true\n", "lr must be of type float, not True")],
)  # fmt: skip
def test_recipe_values_of_the_wrong_type_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(TformerError, match=f"^{re.escape(str(path))}: {message}"):
        load_recipe(str(path))


def test_decode_config_refuses_negative_penalties_and_limits():
    from tformer_cli.config import DecodeConfig

    for bad in (dict(alpha=-1.0), dict(max_len_a=-1.0), dict(beam=0), dict(nbest=0)):
        with pytest.raises(TformerError):
            DecodeConfig(**bad)


def test_a_run_keeps_its_local_data_path_absolute(tmp_path, monkeypatch, captured_trainer):
    """So that eval and --resume find the data from any folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.tsv").write_text("a\tb\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["train", "--data", "mine.tsv", "--quiet"])
    assert "stop here" in result.output
    assert captured_trainer["train"].data == str(tmp_path / "mine.tsv")
