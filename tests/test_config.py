"""Configs: validation, recipes (presets) and their merging with command-line options."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli import cli
from tformer_cli.config import RECIPES, ModelConfig, TrainConfig, from_dict, load_recipe
from tformer_cli.device import resolve_precision
from tformer_cli.errors import SettingError, TformerError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES.glob("*.toml")))
def test_shipped_recipes_build_configs_holding_every_value_of_their_toml_file(name):
    """Every setting of the file reaches the config unchanged; the rest keep their defaults."""
    text = (RECIPES / f"{name}.toml").read_text(encoding="utf-8")
    tables = tomllib.loads(text)
    recipe = load_recipe(name)
    configs = {
        "model": from_dict(ModelConfig, {"vocab_size": 8000, **recipe["model"]}),
        "train": from_dict(TrainConfig, recipe["train"]),
    }
    defaults = {"model": ModelConfig(vocab_size=8000), "train": TrainConfig()}
    assert set(tables) == {"model", "train"}
    for table, values in tables.items():
        assert values, f"[{table}] of {name}.toml is empty"
        for field in dataclasses.fields(configs[table]):
            want = values.get(field.name, getattr(defaults[table], field.name))
            got = getattr(configs[table], field.name)
            assert got == want and type(got) is type(want), (table, field.name, got, want)


def test_multi30k_15min_recipe_is_the_multi30k_one_with_the_chosen_trials_options():
    """docs/results.md: the 15-minute recipe is trial C (over the earlier multi30k recipe:
    --max-tokens 2048 --dropout 0.1 --valid-every 400, 14 minutes) with averaging off, the
    speedrun's learning rate (--lr 2e-3 --warmup 300) and a decoder of 2 layers; nothing else
    may differ (a missing max_epochs once stopped it at the default 6 epochs)."""
    long, short = load_recipe("multi30k"), load_recipe("multi30k-15min")
    chosen = {"max_tokens": 2048, "lr": 2e-3, "warmup": 300, "valid_every": 400,
              "max_minutes": 14.0, "average": 0}  # fmt: skip
    assert short["model"] == {**long["model"], "dropout": 0.1, "n_decoder_layers": 2}
    assert short["train"] == {**long["train"], **chosen}


def test_multi30k_recipe_is_the_documented_one():
    """The README's recipe, trial F of the 60-minute trials: shared BPE 8k, 3+3 pre-LN layers,
    d=256, 4 heads, FFN 1024, tied embeddings, dropout 0.3, label smoothing 0.1, 2,048-token
    batches, lr 1e-3 with 300 warm-up steps, validation on all 1,014 val sentences every 500
    updates, patience 8, the average of the last 5 checkpoints, de->en."""
    recipe = load_recipe("multi30k")
    model = from_dict(ModelConfig, {"vocab_size": 8000, **recipe["model"]})
    train = from_dict(TrainConfig, recipe["train"])
    assert (model.d_model, model.h, model.d_ff) == (256, 4, 1024)
    assert (model.n_encoder_layers, model.n_decoder_layers, model.norm) == (3, 3, "pre")
    assert (model.dropout, model.tie_embeddings, model.positional) == (0.3, True, "sinusoidal")
    assert (train.vocab_size, train.tokenizer_kind, train.max_tokens) == (8000, "bpe", 2048)
    assert (train.lr, train.warmup, train.label_smoothing) == (1e-3, 300, 0.1)
    assert (train.valid_every, train.valid_bleu_size, train.patience) == (500, 1014, 8)
    assert (train.average, train.max_epochs) == (5, 100)
    assert (train.src_lang, train.tgt_lang, train.data) == ("de", "en", "toy")


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
    with pytest.raises(TformerError, match="multi30k, multi30k-15min, multi30k-student, toy"):
        load_recipe("nope")


@pytest.mark.parametrize("field", ["warmup", "max_tokens", "accum", "valid_every"])
def test_train_config_refuses_non_positive_counts(field):
    with pytest.raises(SettingError, match=f"^{field}=0: must be at least 1$") as error:
        TrainConfig(**{field: 0})
    assert (error.value.field, error.value.value) == (field, 0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"seed": -1}, r"seed=-1: must be in \[0, 9223372036854775807\]"),
     ({"seed": 2**63}, "seed=9223372036854775808: must be in"),
     ({"vocab_size": 1_000_001}, r"vocab_size=1000001: must be in \[1, 1000000\]")],
)  # fmt: skip
def test_train_config_refuses_what_a_recipe_may_hold_past_the_cli_bounds(settings, message):
    with pytest.raises(TformerError, match=message):
        TrainConfig(**settings)
    TrainConfig(seed=2**63 - 1, vocab_size=1_000_000)  # the bounds themselves are fine


@pytest.mark.parametrize(
    ("average", "rule"), [(-1, "must be at least 0"), (1, "must be 0 (off) or at least 2")]
)
def test_train_config_refuses_averaging_fewer_than_two_checkpoints(average, rule):
    with pytest.raises(SettingError, match=re.escape(f"average={average}: {rule}")):
        TrainConfig(average=average)


@pytest.mark.parametrize(
    ("alpha", "rule"), [(-0.1, "must be at least 0"), (math.nan, "must be a finite number")]
)
def test_train_config_refuses_a_negative_or_nan_beam_alpha(alpha, rule):
    with pytest.raises(SettingError, match=f"^beam_alpha={alpha}: {rule}$"):
        TrainConfig(beam_alpha=alpha)


def test_model_config_needs_d_model_divisible_by_heads():
    with pytest.raises(SettingError, match=r"^h=4: must divide d_model \(130\)$") as error:
        ModelConfig(vocab_size=10, d_model=130, h=4)
    assert error.value.explained(lambda f: f"--{f}") == "4 must divide --d_model (130)"


def test_preset_values_apply_and_explicit_options_win(tmp_path, monkeypatch):
    """--preset multi30k sets pre-LN, d=256, de->en; --layers 1 given on the line wins."""
    captured = {}

    class FakeTrainer:
        def __init__(self, run_dir, model_cfg, train_cfg, **kwargs):
            captured.update(model=model_cfg, train=train_cfg)
            raise TformerError("stop here")

    monkeypatch.setattr("tformer_cli.training.trainer.Trainer", FakeTrainer)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", "--preset", "multi30k", "--layers", "1"])
    assert result.exit_code == 1 and "stop here" in result.output
    model, train = captured["model"], captured["train"]
    assert (model.d_model, model.norm, model.dropout) == (256, "pre", 0.3)
    assert model.n_encoder_layers == model.n_decoder_layers == 1
    assert (train.src_lang, train.tgt_lang, train.patience, train.average) == ("de", "en", 8, 5)
    assert json.dumps(train.lr) == "0.001"


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

    monkeypatch.setattr("tformer_cli.training.trainer.Trainer", FakeTrainer)
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


def panel(text: str) -> str:
    """Typer's usage panel as one line: its box drawn away, its wrapped lines joined."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--d-model", "0"], "'--d-model': Input should be greater than or equal to 1"),
     (["--heads", "0"], "'--heads': Input should be greater than or equal to 1"),
     (["--layers", "0"], "'--layers': Input should be greater than or equal to 1"),
     (["--dropout", "1.5"], "'--dropout': Value error, 1.5 must be in [0, 1)"),
     (["--epochs", "-1"], "'--epochs'"), (["--max-steps", "-3"], "'--max-steps'"),
     (["--clip-norm=-1"], "'--clip-norm': Value error, -1.0 must be at least 0"),
     (["--label-smoothing", "1.5"], "'--label-smoothing': Value error, 1.5 must be in [0, 1)"),
     (["--valid-bleu-size", "0"], "'--valid-bleu-size'"),
     (["--ss-tau", "0"], "'--ss-tau': Value error, 0.0 must be above 0"),
     (["--ss-min", "2"], "'--ss-min': Value error, 2.0 must be in [0, 1]"),
     (["--lr", "nan"], "'--lr': Value error, nan must be a finite number"),
     (["--max-minutes", "inf"], "'--max-minutes': Value error, inf must be a finite number"),
     (["--heads", "3", "--d-model", "32"], "'--heads': 3 must divide --d-model (32)"),
     (["--average", "1"], "'--average': 1 must be 0 (off) or at least 2 checkpoints"),
     (["--decay", "cosine"], "'--decay': 'cosine' needs --max-minutes or --max-steps")],
)  # fmt: skip
def test_bad_model_and_stopping_values_are_usage_errors_naming_the_option(
    tmp_path, monkeypatch, captured_trainer, options, message
):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["train", *options, "--quiet"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Usage:" in result.stderr and f"Invalid value for {message}" in panel(result.stderr)
    assert "stop here" not in result.output and not (tmp_path / "runs").exists()


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

    bad_values = (dict(alpha=-1.0), dict(max_len_a=-1.0), dict(beam=0), dict(nbest=0),
                  dict(alpha=math.nan), dict(max_len_a=math.inf))  # fmt: skip
    for bad in bad_values:
        with pytest.raises(SettingError, match=f"^{next(iter(bad))}="):
            DecodeConfig(**bad)
    for name in ("alpha", "max_len_a", "max_len_b", "min_len"):  # named by the field
        with pytest.raises(SettingError, match=f"^{name}=-1: must be at least 0$"):
            DecodeConfig(**{name: -1})


def test_the_decode_options_keep_nbest_within_the_beam_unless_they_draw():
    from tformer_cli.config import DecodeConfig, DecodeOptions

    with pytest.raises(SettingError, match=r"^nbest=3: needs beam >= 3$") as error:
        DecodeOptions(beam=2, nbest=3)
    assert error.value.message == "3 needs beam >= 3"  # the server's detail, after "nbest: "
    assert DecodeOptions(beam=2, nbest=3, sample=True).search(0.6).nbest == 3
    assert DecodeOptions(beam=2, nbest=3, mbr=3).search(0.6).nbest == 3
    assert DecodeConfig(beam=2, nbest=3).nbest == 3  # the search itself ranks more than a beam


@pytest.mark.parametrize("name, value", [("temperature", 0.5), ("top_k", 3), ("top_p", 0.9)])
def test_a_sampling_option_where_nothing_is_drawn_is_refused_by_name(name, value):
    from tformer_cli.config import DecodeOptions

    with pytest.raises(SettingError, match=rf"^{name}={value}: needs sample or mbr"):
        DecodeOptions(**{name: value})
    drawn = DecodeOptions(**{name: value}, mbr=4).search(0.6)  # MBR over samples draws them
    assert (drawn.beam, getattr(drawn.sampling, name)) == (1, value)
    with pytest.raises(SettingError, match=f"^{name}="):  # MBR over the beam's n-best does not
        DecodeOptions(**{name: value}, mbr=4, mbr_from="beam")


def test_a_setting_of_the_wrong_type_is_refused_by_name():
    from tformer_cli.config import DecodeOptions, EvalOptions, TraceOptions

    for cls, bad, rule in [(DecodeOptions, {"beam": "5"}, "must be a whole number"),
                           (DecodeOptions, {"beam": True}, "must be a whole number"),
                           (DecodeOptions, {"sample": 1}, "must be True or False"),
                           (TraceOptions, {"alpha": "x"}, "must be a number"),
                           (EvalOptions, {"limit": 1.0}, "must be a whole number")]:  # fmt: skip
        with pytest.raises(SettingError, match=f"^{next(iter(bad))}=.*: {rule}$"):
            cls(**bad)
    assert TraceOptions(alpha=1).alpha == 1  # a whole number is a number


@pytest.mark.parametrize(
    ("min_len", "a", "b", "cut"),
    [(0, 1.5, 10, None), (13, 1.5, 10, 1), (12, 1.5, 10, None), (500, 1.5, 10, 326),
     (10, 0.0, 10, math.inf), (9, 0.0, 10, None)],
)  # fmt: skip
def test_min_len_cut_is_the_longest_source_whose_limit_it_passes(min_len, a, b, cut):
    """A source of n tokens (and its </s>) is translated to at most int(a * (n + 1) + b)."""
    from tformer_cli.config import DecodeConfig

    cfg = DecodeConfig(min_len=min_len, max_len_a=a, max_len_b=b)
    assert cfg.min_len_cut() == cut
    capped = [n for n in range(1, 1000) if int(a * (n + 1) + b) <= min_len]
    assert capped == ([] if cut is None else list(range(1, int(min(cut, 999)) + 1)))


@pytest.mark.parametrize("field", ["n_encoder_layers", "h", "d_ff"])
def test_model_sizes_below_one_name_the_field(field):
    with pytest.raises(SettingError, match=rf"^{field}=0: must be at least 1$"):
        ModelConfig(vocab_size=10, **{field: 0})


def test_a_missing_recipe_file_is_named_as_a_file():
    with pytest.raises(TformerError, match=r"^recipe file nosuch\.toml does not exist$"):
        load_recipe("nosuch.toml")


def test_a_run_keeps_its_local_data_path_absolute(tmp_path, monkeypatch, captured_trainer):
    """So that eval and --resume find the data from any folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.tsv").write_text("a\tb\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["train", "--data", "mine.tsv", "--quiet"])
    assert "stop here" in result.output
    assert captured_trainer["train"].data == str(tmp_path / "mine.tsv")


# ---------------------------------------------------------------------------- parallel files
def write_lines(path, lines: list[str]):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def parallel_files(tmp_path, monkeypatch):
    """train.de/train.en and dev.de/dev.en in a folder beside the working folder."""
    files = tmp_path / "wmt"
    files.mkdir()
    for stem, n in (("train", 30), ("dev", 3)):
        write_lines(files / f"{stem}.de", [f"ein satz {i}" for i in range(n)])
        write_lines(files / f"{stem}.en", [f"a sentence {i}" for i in range(n)])
    monkeypatch.chdir(tmp_path)
    return files


def test_src_and_tgt_files_are_kept_as_absolute_paths_and_data_says_files(
    parallel_files, captured_trainer
):
    options = ["--src-file", "wmt/train.de", "--tgt-file", "wmt/train.en", "--quiet"]
    result = CliRunner().invoke(cli.app, ["train", *options])
    assert "stop here" in result.output
    train = captured_trainer["train"]
    assert (train.data, train.src_file, train.tgt_file) == (
        "files",
        str(parallel_files / "train.de"),
        str(parallel_files / "train.en"),
    )
    assert train.valid_src_file is None and train.valid_tgt_file is None
    assert captured_trainer["run_dir"].name.startswith("files-")
    valid = ["--valid-src-file", "wmt/dev.de", "--valid-tgt-file", "wmt/dev.en"]
    CliRunner().invoke(cli.app, ["train", *options, *valid])
    train = captured_trainer["train"]
    assert (train.valid_src_file, train.valid_tgt_file) == (
        str(parallel_files / "dev.de"),
        str(parallel_files / "dev.en"),
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--src-file", "wmt/train.de", "--tgt-file", "wmt/train.en", "--data", "toy"],
      "give --data or --src-file/--tgt-file, not both"),
     (["--src-file", "wmt/train.de", "--tgt-file", "wmt/nope.en"], "wmt/nope.en: no such file"),
     (["--valid-src-file", "wmt/nope.de", "--valid-tgt-file", "wmt/dev.en"],
      "wmt/nope.de: no such file")],
)  # fmt: skip
def test_bad_parallel_file_options_are_one_line_errors_before_training(
    parallel_files, captured_trainer, options, message
):
    result = CliRunner().invoke(cli.app, ["train", *options, "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0]
    assert "stop here" not in result.output and not captured_trainer


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--src-file", "wmt/train.de"], "'--src-file': 'wmt/train.de' goes with --tgt-file"),
     (["--tgt-file", "wmt/train.en"], "'--tgt-file': 'wmt/train.en' goes with --src-file"),
     (["--valid-src-file", "wmt/dev.de"], "'--valid-src-file': 'wmt/dev.de' goes with"
      " --valid-tgt-file")],
)  # fmt: skip
def test_a_parallel_file_without_its_pair_is_a_usage_error(
    parallel_files, captured_trainer, options, message
):
    result = CliRunner().invoke(cli.app, ["train", *options, "--quiet"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for {message}" in panel(result.stderr)
    assert not captured_trainer


def test_a_config_json_from_before_the_parallel_file_fields_still_loads(tmp_path):
    from tformer_cli.checkpoint import RunConfig

    RunConfig(ModelConfig(vocab_size=50), TrainConfig(src_lang="de")).save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for field in ("src_file", "tgt_file", "valid_src_file", "valid_tgt_file"):
        del raw["train"][field]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert RunConfig.load(tmp_path).train == TrainConfig(src_lang="de")


def test_train_options_are_declared_once_beside_their_fields():
    """``--layers`` sets both stacks; every option of the configs is one of ``tformer train``'s,
    with the field's default."""
    from tformer_cli.cli.train import Own, Train
    from tformer_cli.config import TRAIN_OPTIONS

    layers = TRAIN_OPTIONS["layers"]
    assert (layers.table, layers.fields) == ("model", ("n_encoder_layers", "n_decoder_layers"))
    assert (TRAIN_OPTIONS["epochs"].fields, TRAIN_OPTIONS["heads"].fields) == (
        ("max_epochs",),
        ("h",),
    )
    own = [f.name for f in dataclasses.fields(Own)]
    assert [f.name for f in dataclasses.fields(Train)] == [*TRAIN_OPTIONS, *own]
    assert not set(own) & set(TRAIN_OPTIONS)
    assert TRAIN_OPTIONS["seed"].default == TrainConfig().seed
