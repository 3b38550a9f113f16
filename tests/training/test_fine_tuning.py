"""Fine-tuning and tokenizer reuse: ``tformer train --init-from RUN`` and ``--tokenizer-file``."""

from __future__ import annotations

import json
import shutil

import torch
from typer.testing import CliRunner

from tests.training.test_trainer import quiet_console, run, train_cfg
from tformer_cli.checkpoint import RunConfig, load_run, load_state
from tformer_cli.cli import app
from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer
from tformer_cli.decode.translate import translate_texts
from tformer_cli.model.fast import column_major
from tformer_cli.training.trainer import Trainer

runner = CliRunner()


def test_a_model_made_by_init_from_translates_as_the_source_run_before_its_first_update(
    tmp_path, tiny_corpus, single_thread_trainer
):
    source = tmp_path / "source"
    run(source, tiny_corpus)
    config = RunConfig.load(source)
    cfg = train_cfg(
        tiny_corpus, init_from=str(source), tokenizer_file=str(source / "tokenizer.json")
    )
    tuned = Trainer(tmp_path / "tuned", config.model, cfg, resume=False, console=quiet_console())
    weights = load_state(source / "model.pt")
    assert all(torch.equal(v, weights[k]) for k, v in tuned.model.state_dict().items())
    assert (tmp_path / "tuned" / "tokenizer.json").read_bytes() == (
        source / "tokenizer.json"
    ).read_bytes()
    loaded = load_run(source, "cpu")
    texts = ["a b c", "d e"]
    tuned.model.eval()
    mine = translate_texts(
        loaded.__class__(**{**loaded.__dict__, "model": column_major(tuned.model)}), texts
    )
    assert [t.translations for t in mine] == [
        t.translations for t in translate_texts(loaded, texts)
    ]


def test_init_from_takes_the_runs_model_and_refuses_a_contradicting_option(
    tmp_path, tiny_corpus, single_thread_trainer
):
    source = tmp_path / "source"
    run(source, tiny_corpus)
    args = ["train", "--data", str(tiny_corpus), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    result = runner.invoke(app, [*args, "--init-from", str(source), "--d-model", "64"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--d-model 64 contradicts" in result.output and "32" in result.output
    result = runner.invoke(app, [*args, "--init-from", str(tmp_path / "nowhere")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    (tmp_path / "broken").mkdir()
    result = runner.invoke(app, [*args, "--init-from", str(tmp_path / "broken")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    mismatched = tmp_path / "mismatched"  # its model.pt no longer fits its config.json
    shutil.copytree(source, mismatched)
    raw = json.loads((mismatched / "config.json").read_text())
    raw["model"]["d_ff"] *= 2
    (mismatched / "config.json").write_text(json.dumps(raw))
    result = runner.invoke(app, [*args, "--init-from", str(mismatched)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "model.pt does not match config.json: size mismatch" in result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    ok = runner.invoke(
        app, [*args, "--init-from", str(source), "--max-steps", "2", "--name", "tuned"]
    )
    assert ok.exit_code == 0, ok.output
    tuned = RunConfig.load(tmp_path / "runs" / "tuned")
    assert tuned.model == RunConfig.load(source).model
    assert tuned.train.init_from == str(source.resolve())


def test_a_tokenizer_file_without_the_special_tokens_is_a_one_line_error(tmp_path, tiny_corpus):
    path = tmp_path / "tokenizer.json"
    save_tokenizer(train_tokenizer(["a b c"] * 3, 20, "wordlevel", min_frequency=1), path)
    path.write_text(path.read_text().replace('"<pad>"', '"<nope>"'))  # no <pad> left
    args = ["train", "--data", str(tiny_corpus), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    result = runner.invoke(app, [*args, "--tokenizer-file", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "special tokens must be <pad>=0" in result.output and "<pad>=None" in result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
