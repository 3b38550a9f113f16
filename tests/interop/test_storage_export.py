"""Exports to a full disk (a file-size limit, ``RLIMIT_FSIZE``, as in
tests/training/test_storage.py): one line naming the folder, no half export at the target or
beside it, and the same command with the limit lifted exports whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.conftest import assert_one_line_error, cli
from tests.training.test_storage import file_size_limit
from tformer_cli.cli import err


@pytest.mark.parametrize(("kind", "made"), [("hf", "config.json"), ("ctranslate2", "model.bin")])
def test_an_export_to_a_full_disk_leaves_no_folder_and_a_rerun_exports(
    tmp_path: Path, toy_run: Path, kind: str, made: str, monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip({"hf": "transformers", "ctranslate2": "ctranslate2"}[kind])
    monkeypatch.setattr(err, "_width", 1000, raising=False)
    target = tmp_path / "out"
    with file_size_limit(4096):
        failed = cli("export", "-m", toy_run, "--to", kind, "-o", target)
    assert_one_line_error(failed, f"cannot write {target}: File too large")
    assert not list(tmp_path.iterdir())
    done = cli("export", "-m", toy_run, "--to", kind, "-o", target)
    assert done.exit_code == 0, done.output
    assert (target / made).is_file()
