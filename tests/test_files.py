"""Tests for tformer_cli.files: atomic writes leave the old file or the new one, never half."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write, atomic_write_text


def save(path: Path, obj: object) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def test_atomic_write_leaves_only_the_target_file(tmp_path):
    target = tmp_path / "sub" / "config.json"
    atomic_write_text(target, "hello\n")
    save(tmp_path / "sub" / "w.pt", {"x": torch.arange(3)})
    assert target.read_text(encoding="utf-8") == "hello\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["config.json", "w.pt"]
    assert torch.equal(torch.load(tmp_path / "sub" / "w.pt")["x"], torch.arange(3))


def test_failing_writer_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "model.pt"
    save(target, {"w": torch.ones(4)})
    before = target.read_bytes()

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(before[: len(before) // 2])
        raise OSError("disk full")

    with pytest.raises(TformerError, match=r"cannot write .*model\.pt: disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_interrupted_writer_leaves_no_temp_file(tmp_path):
    def interrupted(tmp: Path) -> None:
        tmp.write_text("partial", encoding="utf-8")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "last.pt", interrupted)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_to_an_unwritable_place_names_the_target(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    target = blocker / "sub" / "out.txt"  # a folder cannot be made inside a file
    with pytest.raises(TformerError, match=re.escape(f"cannot write {target}")):
        atomic_write_text(target, "hello")


def test_written_files_get_the_usual_permissions_not_mkstemps_0600(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o644


def test_writing_onto_a_folder_names_the_folder_not_a_temporary_file(tmp_path):
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(
        TformerError, match=f"cannot write {re.escape(str(tmp_path / 'a-folder'))}:"
    ):
        atomic_write_text(tmp_path / "a-folder", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["a-folder"]
