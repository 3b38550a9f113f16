"""Tests for tformer_cli.checkpoint: config.json round trip, safe loads, runs, averaging."""

from __future__ import annotations

import dataclasses
import fractions
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import checkout_first_env
from tformer_cli.checkpoint import (
    RUN_FORMAT,
    RunConfig,
    atomic_torch_save,
    average_run,
    average_state_dicts,
    checkpoint_paths,
    latest_run,
    load_run,
    load_state,
    resolve_run,
    save_checkpoint,
)
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.decode.translate import translate_ids
from tformer_cli.errors import TformerError


# ---------------------------------------------------------------------------- config.json
def test_run_config_json_round_trip(tmp_path):
    cfg = RunConfig(
        ModelConfig(vocab_size=123, d_model=48, h=6, norm="pre", positional="learned"),
        TrainConfig(data="hf:bentrevett/multi30k", src_lang="de", lr=1e-3, max_steps=7),
    )
    cfg.save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert raw["model"]["d_model"] == 48 and raw["train"]["src_lang"] == "de"
    assert raw["format"] == RUN_FORMAT
    assert RunConfig.load(tmp_path) == cfg


def test_imported_from_is_kept_and_a_trained_runs_config_json_does_not_name_it(tmp_path):
    model = ModelConfig(vocab_size=10)
    RunConfig(model, TrainConfig()).save(tmp_path)
    assert "imported_from" not in json.loads((tmp_path / "config.json").read_text())
    assert RunConfig.load(tmp_path).imported_from is None
    RunConfig(model, TrainConfig(), imported_from="hf:x/y").save(tmp_path)
    assert RunConfig.load(tmp_path).imported_from == "hf:x/y"


def test_a_target_tokenizer_beside_the_run_must_fit_its_vocabulary(tmp_path, make_run):
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer

    run_dir, _ = make_run(tmp_path)
    assert load_run(run_dir, "cpu").tgt_tokenizer.to_str() == (
        load_run(run_dir, "cpu").tokenizer.to_str()
    )  # none: the shared one
    other = train_tokenizer(
        ["red blue green"] * 3, vocab_size=40, kind="wordlevel", min_frequency=1
    )
    save_tokenizer(other, run_dir / "target_tokenizer.json")
    with pytest.raises(TformerError, match=r"target_tokenizer\.json does not match config\.json"):
        load_run(run_dir, "cpu")


def test_run_config_from_another_format_is_refused(tmp_path):
    cfg = RunConfig(ModelConfig(vocab_size=10), TrainConfig())
    raw = dataclasses.asdict(cfg) | {"format": RUN_FORMAT + 1, "version": "9.9"}
    (tmp_path / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(TformerError, match="format"):
        RunConfig.load(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"format": 1, "version": "0", "model": {"d_model": 8}, "train": {}}',
        '{"format": 1, "version": "0", "model": {"vocab_size": 8, "colour": 1}, "train": {}}',
        '{"format": 1, "version": "0", "model": null, "train": {}}',
    ],
)
def test_corrupt_config_json_raises_tformer_error(tmp_path, content):
    (tmp_path / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(TformerError):
        RunConfig.load(tmp_path)


@pytest.mark.parametrize("content", ["null", "{}", "[1, 2]"])
def test_a_config_json_without_a_run_format_says_it_is_not_a_runs_config(tmp_path, content):
    (tmp_path / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(TformerError, match=r"is not a tformer run's config \(no run format"):
        RunConfig.load(tmp_path)


def test_non_utf8_config_json_raises_tformer_error(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"format": 1, "x": "\xff\xfe"}')
    with pytest.raises(TformerError):
        RunConfig.load(tmp_path)


def test_missing_config_json_says_it_is_not_a_run(tmp_path):
    with pytest.raises(TformerError, match="not a tformer run"):
        RunConfig.load(tmp_path)


# ---------------------------------------------------------------------------- weights
def test_load_state_round_trip_and_missing_file(tmp_path):
    state = {"a": torch.randn(2, 3), "b": torch.tensor([1, 2])}
    atomic_torch_save(tmp_path / "model.pt", state)
    loaded = load_state(tmp_path / "model.pt")
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    with pytest.raises(TformerError, match="missing"):
        load_state(tmp_path / "nope.pt")


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty"])
def test_load_state_on_a_corrupt_file_raises_tformer_error(tmp_path, kind):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(100)}, path)
    data = path.read_bytes()
    content = {"garbage": b"definitely not a checkpoint", "truncated": data[:200], "empty": b""}
    path.write_bytes(content[kind])
    with pytest.raises(TformerError, match=r"model\.pt"):
        load_state(path)


def test_load_state_names_the_damage_without_torchs_weights_only_advice(tmp_path):
    """A file that is no checkpoint, or one holding objects beyond tensors, is refused in our
    words: torch's hint to retry with ``weights_only=False`` would run code from the file."""
    path = tmp_path / "model.pt"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(TformerError, match=r"not a whole torch\.save archive") as info:
        load_state(path)
    torch.save({"w": torch.zeros(2), "when": fractions.Fraction(1, 3)}, path)
    with pytest.raises(TformerError, match="objects other than tensors") as other:
        load_state(path)
    assert "weights_only" not in str(info.value) + str(other.value)


def test_load_state_error_message_is_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(TformerError) as info:
        load_state(path)
    assert "\n" not in str(info.value)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_load_state_never_runs_code_from_a_checkpoint(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(TformerError):
        load_state(path)


# ---------------------------------------------------------------------------- finding runs
def test_latest_run_is_the_newest_time_stamped_run_of_a_name(tmp_path):
    """``tformer train`` without --name makes ``DATA-YYYYMMDD-HHMMSS``: the name alone is the
    newest by its stamp (not by the folder's time), and only whole stamps count."""
    for name in ("toy-20261126-093738", "toy-20261127-080000", "toy-20251231-235959"):
        (tmp_path / name).mkdir()
    os.utime(tmp_path / "toy-20251231-235959")  # touched last: the stamp still decides
    for other in ("toy-2", "toy-20261128-0900", "toyx-20261129-090000", "mytoy-20261129-090000"):
        (tmp_path / other).mkdir()
    (tmp_path / "toy-20261130-090000").write_text("a file, not a run")
    assert latest_run("toy", tmp_path) == tmp_path / "toy-20261127-080000"
    assert latest_run("small", tmp_path) is None
    assert latest_run("toy", tmp_path / "missing") is None


def test_the_time_stamp_is_the_one_train_writes(tmp_path):
    from tformer_cli.training.setup import new_run_dir

    made = new_run_dir(tmp_path, None, "toy")
    made.mkdir()
    assert latest_run("toy", tmp_path) == made


def test_resolve_run_takes_a_folder_a_name_or_a_name_of_time_stamped_runs(tmp_path):
    runs = tmp_path / "runs"
    for name in ("done", "toy-20261126-093738", "toy-20261127-080000"):
        (runs / name).mkdir(parents=True)
    assert resolve_run(runs / "done") == runs / "done"
    assert resolve_run(Path("done"), runs) == runs / "done"  # as translate -m done, from ./
    assert resolve_run(Path("toy"), runs) == runs / "toy-20261127-080000"  # make demo's runs
    assert resolve_run(Path("toy-20261126-093738"), runs) == runs / "toy-20261126-093738"
    (runs / "toy").mkdir()  # a run named toy wins over the stamped ones
    assert resolve_run(Path("toy"), runs) == runs / "toy"
    assert resolve_run(tmp_path) == tmp_path


@pytest.mark.parametrize(
    ("given", "message"),
    [("nope", r"^run folder nope does not exist \(nor \S*runs/nope, nor \S*runs/nope-YYYYMMDD-"),
     ("a/nope", r"^run folder a/nope does not exist: see tformer runs$"),
     ("file", "is a file")],
)  # fmt: skip
def test_resolve_run_names_what_it_looked_for(tmp_path, monkeypatch, given, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "toy-20261126-093738").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TformerError, match=message):
        resolve_run(Path(given), tmp_path / "runs")


def test_finding_a_run_imports_no_torch():
    """The command line checks each -m before torch loads (seconds): this module must allow it."""
    code = "import sys; import tformer_cli.checkpoint; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=checkout_first_env(), capture_output=True, text=True
    )
    assert done.stdout.strip() == "False", done.stderr


# ---------------------------------------------------------------------------- whole runs
def test_load_run_round_trip_gives_identical_translations(tmp_path, make_run):
    run_dir, model = make_run(tmp_path / "run", seed=3)
    run = load_run(run_dir, device="cpu", precision="fp32")
    assert not run.model.training
    assert run.model.cfg == model.cfg
    for name, p in model.state_dict().items():
        assert torch.equal(run.model.state_dict()[name], p), name
    assert run.model.generator.weight is run.model.src_embed.tokens.weight
    sources = [[4, 5, 6], [7], [8, 9, 10, 11, 12]]
    before = translate_ids(model, sources)
    after = translate_ids(run.model, sources)
    assert [r.hypotheses[0].tokens for r in after] == [r.hypotheses[0].tokens for r in before]
    # equal weights; the sums may differ in the last bits (AMD EPYC: -20.524183 vs -20.524181)
    logprobs = [r.hypotheses[0].logprob for r in before]
    assert [r.hypotheses[0].logprob for r in after] == pytest.approx(logprobs, rel=1e-5)


def test_load_run_rejects_weights_of_another_shape(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    other = ModelConfig(vocab_size=20, d_model=16, h=2, d_ff=32)
    from tformer_cli.model import Transformer

    atomic_torch_save(run_dir / "model.pt", Transformer(other).state_dict())
    with pytest.raises(TformerError, match=r"does not match config\.json"):
        load_run(run_dir, device="cpu", precision="fp32")


def test_load_run_rejects_a_tokenizer_of_another_size(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    cfg = RunConfig.load(run_dir)
    bigger = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size + 1)
    RunConfig(bigger, cfg.train).save(run_dir)
    with pytest.raises(TformerError, match="tokenizer"):
        load_run(run_dir, device="cpu", precision="fp32")


def test_load_run_with_a_corrupt_model_raises_tformer_error(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (run_dir / "model.pt").write_bytes(b"\x00" * 64)
    with pytest.raises(TformerError):
        load_run(run_dir, device="cpu", precision="fp32")


def test_a_model_pt_of_another_size_names_the_first_mismatch_in_one_line(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    raw = json.loads((run_dir / "config.json").read_text())
    raw["model"]["d_ff"] *= 2
    (run_dir / "config.json").write_text(json.dumps(raw))
    with pytest.raises(TformerError) as error:
        load_run(run_dir, device="cpu", precision="fp32")
    message = str(error.value)
    assert "model.pt does not match config.json: size mismatch for " in message
    assert "\n" not in message and not message.endswith(":")


def test_load_run_with_a_model_pt_that_is_not_a_state_dict_raises_tformer_error(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    torch.save(torch.zeros(3), run_dir / "model.pt")
    with pytest.raises(TformerError):
        load_run(run_dir, device="cpu", precision="fp32")


# ---------------------------------------------------------------------------- averaging
def test_averaging_two_state_dicts_gives_their_mean_in_each_dtype():
    a = {"w": torch.tensor([1.0, 2.0]), "h": torch.tensor([1.0, 3.0], dtype=torch.bfloat16)}
    b = {"w": torch.tensor([3.0, -2.0]), "h": torch.tensor([2.0, 5.0], dtype=torch.bfloat16)}
    mean = average_state_dicts([a, b])
    assert torch.equal(mean["w"], torch.tensor([2.0, 0.0]))
    assert torch.equal(mean["h"], torch.tensor([1.5, 4.0], dtype=torch.bfloat16))
    assert torch.equal(a["w"], torch.tensor([1.0, 2.0]))  # the inputs are left alone


def test_averaging_state_dicts_of_other_parameters_is_an_error():
    a = {"w": torch.zeros(2)}
    with pytest.raises(TformerError, match="different parameters"):
        average_state_dicts([a, {"v": torch.zeros(2)}])
    with pytest.raises(TformerError, match="shape of w"):
        average_state_dicts([a, {"w": torch.zeros(3)}])


def test_save_checkpoint_keeps_the_newest_in_step_order(tmp_path):
    for step in (250, 999_750, 500, 1_000_000):
        save_checkpoint(tmp_path, step, {"w": torch.full((1,), float(step))}, keep=3)
    names = [p.name for p in checkpoint_paths(tmp_path)]
    assert names == ["step-000500.pt", "step-999750.pt", "step-1000000.pt"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(names)


def test_average_run_writes_the_mean_of_the_newest_checkpoints(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))}, keep=5)
    paths, target = average_run(tmp_path, last=2)
    assert [p.name for p in paths] == ["step-000002.pt", "step-000003.pt"]
    assert target == tmp_path / "averaged.pt"
    assert torch.equal(load_state(target)["w"], torch.full((2,), 2.5))


def test_average_run_of_a_name_under_runs_writes_into_that_run(tmp_path):
    """``tformer average small`` wrote ./small/averaged.pt: the name was not resolved first."""
    runs = tmp_path / "runs"
    for step in (1, 2):
        save_checkpoint(runs / "small", step, {"w": torch.full((2,), float(step))}, keep=5)
    _, target = average_run(Path("small"), last=2, runs_dir=runs)
    assert target == runs / "small" / "averaged.pt" and target.is_file()


def test_average_run_needs_two_checkpoints(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, keep=5)
    with pytest.raises(TformerError, match=r"1 checkpoint.*at least 2"):
        average_run(tmp_path, last=5)


def test_a_run_stopped_between_its_tokenizer_and_its_config_says_so(tmp_path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    (run_dir / "config.json").unlink()
    with pytest.raises(TformerError, match=r"config.json is missing: the run's weights are there"):
        RunConfig.load(run_dir)  # not "train it again": that would overwrite a trained run
    (run_dir / "model.pt").unlink()
    with pytest.raises(TformerError, match=r"stopped before training began .* same --name"):
        RunConfig.load(run_dir)
    (run_dir / "tokenizer.json").unlink()
    with pytest.raises(TformerError, match=r"is not a tformer run \(no config.json\)"):
        RunConfig.load(run_dir)
