"""A full disk during training, made real with a file-size limit (``RLIMIT_FSIZE``: every write
past it fails with ``EFBIG``, as a full disk fails with ``ENOSPC``): one line naming the file,
the last complete files intact, and ``--resume`` with the limit lifted ends where a run that
never failed ends."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.training.test_trainer import run
from tformer_cli.checkpoint import load_state
from tformer_cli.errors import TformerError
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
