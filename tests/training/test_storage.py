"""A full disk during training, made real with a file-size limit (``RLIMIT_FSIZE``: every write
past it fails with ``EFBIG``, as a full disk fails with ``ENOSPC``): one line naming the file,
the last complete files intact, and ``--resume`` with the limit lifted ends where a run that
never failed ends."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.training.test_trainer import run
from tformer_cli.checkpoint import RunConfig, load_state
from tformer_cli.errors import TformerError
from tformer_cli.report.runs import read_log
from tformer_cli.training import bookkeeping

pytestmark = pytest.mark.skipif(
    not hasattr(resource, "RLIMIT_FSIZE"), reason="no file-size limit on this platform"
)


@contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes fail with ``EFBIG`` (Python ignores ``SIGXFSZ``) until the
    block ends; the soft limit only, so that it can be lifted again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_at_the_second_last_pt_stops_in_one_line_and_resumes_to_the_same_weights(
    tmp_path: Path, tiny_corpus: Path, single_thread_trainer: None, monkeypatch
):
    straight, _ = run(tmp_path / "straight", tiny_corpus, max_steps=16, valid_every=8)
    save_last, saves = bookkeeping.save_last, []

    def second_fails(run_dir: Path, *args) -> None:  # the disk fills before the second save
        saves.append(run_dir)
        if len(saves) < 2:
            return save_last(run_dir, *args)
        with file_size_limit(4096):
            return save_last(run_dir, *args)

    monkeypatch.setattr(bookkeeping, "save_last", second_fails)
    run_dir = tmp_path / "full"
    with pytest.raises(TformerError) as failed:
        run(run_dir, tiny_corpus, max_steps=16, valid_every=8, save_every=0.0)
    message = str(failed.value)
    assert message.startswith(f"cannot write {run_dir / 'last.pt'}: File too large")
    assert "\n" not in message
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    first = load_state(run_dir / "last.pt")  # the first save, whole
    assert 0 < first["state"]["step"] < 16
    load_state(run_dir / "model.pt")  # the best weights so far, whole

    monkeypatch.setattr(bookkeeping, "save_last", save_last)
    resumed, result = run(run_dir, tiny_corpus, resume=True, max_steps=16, valid_every=8)
    assert result.state.step == 16
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_full_disk_while_the_corpus_is_copied_names_the_file(
    tmp_path: Path, tiny_corpus: Path, single_thread_trainer: None
):
    with file_size_limit(512), pytest.raises(TformerError) as failed:
        run(tmp_path / "run", tiny_corpus, max_steps=2)
    assert "cannot write " in str(failed.value) and ".arrow: " in str(failed.value)
    assert "File too large" in str(failed.value)


def test_a_full_disk_mid_log_line_stops_in_one_line_and_resume_cuts_the_torn_line(
    tmp_path: Path, tiny_corpus: Path, single_thread_trainer: None, monkeypatch
):
    straight, _ = run(tmp_path / "straight", tiny_corpus, max_steps=16, valid_every=8)
    log, run_dir = bookkeeping.TrainerBase._log, tmp_path / "full"

    def torn_at_validation(trainer, record: dict) -> None:  # the second: room for 5 bytes
        if "valid_bleu" not in record or trainer.state.step < 16:
            return log(trainer, record)
        path = run_dir / "log.jsonl"
        with file_size_limit((path.stat().st_size if path.exists() else 0) + 5):
            return log(trainer, record)

    monkeypatch.setattr(bookkeeping.TrainerBase, "_log", torn_at_validation)
    with pytest.raises(TformerError) as failed:
        run(run_dir, tiny_corpus, max_steps=16, valid_every=8, save_every=0.0)
    assert str(failed.value).startswith(f"cannot write {run_dir / 'log.jsonl'}: File too large")
    text = (run_dir / "log.jsonl").read_text(encoding="utf-8")
    assert not text.endswith("\n")  # torn
    assert read_log(run_dir) == [json.loads(line) for line in text.splitlines()[:-1]]

    monkeypatch.setattr(bookkeeping.TrainerBase, "_log", log)
    resumed, result = run(run_dir, tiny_corpus, resume=True, max_steps=16, valid_every=8)
    assert result.state.step == 16
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [8, 16]


def test_a_full_disk_at_config_json_keeps_the_old_one(tmp_path: Path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    before = (run_dir / "config.json").read_bytes()
    config = RunConfig.load(run_dir)
    bigger = dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=7))
    with file_size_limit(len(before) - 1), pytest.raises(TformerError) as failed:
        bigger.save(run_dir)
    assert str(failed.value).startswith(f"cannot write {run_dir / 'config.json'}: File too large")
    assert (run_dir / "config.json").read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.json",
        "model.pt",
        "tokenizer.json",
    ]
    bigger.save(run_dir)
    assert RunConfig.load(run_dir).train.max_steps == 7


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_a_read_only_run_folder_is_one_line_naming_the_file(tmp_path: Path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    before = (run_dir / "config.json").read_bytes()
    run_dir.chmod(0o555)
    try:
        with pytest.raises(TformerError) as failed:
            RunConfig.load(run_dir).save(run_dir)
    finally:
        run_dir.chmod(0o755)
    assert str(failed.value) == f"cannot write {run_dir / 'config.json'}: Permission denied"
    assert (run_dir / "config.json").read_bytes() == before
