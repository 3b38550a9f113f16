"""Translations written to a full disk: ``translate -o FILE`` under a file-size limit
(``RLIMIT_FSIZE``, as in tests/training/test_storage.py) and to a full standard output
(``/dev/full``, ``ENOSPC``); and the compiled-step cache's record of build times, written through
its atomic-write helper. One line naming what could not be written, exit 1, nothing half written
left in place, and the same command with room to write works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import checkout_first_env
from tests.training.test_storage import file_size_limit
from tformer_cli.cli import app, err
from tformer_cli.compile import cache_root
from tformer_cli.decode.fast import aot

runner = CliRunner()


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """One torch thread, no TFORMER_DEBUG, and a stderr wide enough for a line not to wrap."""
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.setattr(err, "_width", 1000, raising=False)


def test_translate_o_to_a_full_disk_keeps_the_old_file_and_says_so_in_one_line(
    tmp_path: Path, make_run
):
    run_dir, _ = make_run(tmp_path / "run")
    target = tmp_path / "out.txt"
    target.write_text("the old translations\n", encoding="utf-8")
    args = ["translate", "a b c", "-m", str(run_dir), "-o", str(target), "--device", "cpu", "-q"]
    with file_size_limit(0):
        failed = runner.invoke(app, args)
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert failed.stderr.splitlines() == [
        f"Error: cannot write {target}: File too large (free some space or lift the limit,"
        " then run the command again)"
    ]
    assert target.read_text(encoding="utf-8") == "the old translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "run"]

    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert target.read_text(encoding="utf-8") != "the old translations\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this platform")
def test_translate_to_a_full_standard_output_says_so_in_one_line(tmp_path: Path, make_run):
    run_dir, _ = make_run(tmp_path / "run")
    command = [sys.executable, "-m", "tformer_cli", "translate", "-m", str(run_dir), "-q"]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            command, input=b"a b c\nd e\n", stdout=full, stderr=subprocess.PIPE,
            env=checkout_first_env(TFORMER_THREADS="1", COLUMNS="200"), timeout=120,
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "Error: cannot write to standard output: No space left on device"
    ]


def test_a_full_disk_loses_a_build_time_and_nothing_else(
    tmp_path: Path, tiny_model, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = tiny_model()
    aot.record_build(model, 1, 12.0)
    builds = cache_root() / "steps" / aot.BUILDS
    before = builds.read_bytes()
    with file_size_limit(len(before) - 1):
        aot.record_build(model, 4, 30.0)  # the cache is for speed: a failed write is no error
    assert builds.read_bytes() == before
    assert os.listdir(builds.parent) == [aot.BUILDS]
    aot.record_build(model, 4, 30.0)
    assert aot.build_seconds(model, 1) == 12.0 and aot.build_seconds(model, 4) == 30.0
