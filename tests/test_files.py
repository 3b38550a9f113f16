"""Tests for tformer_cli.files: atomic writes leave the old file or the new one, never half, and
durable ones sync the file before the rename and the folder after it."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write, atomic_write_text, give_usual_mode, umask


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
    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o644


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_the_usual_mode_is_opens_and_mkdirs_under_the_umask_which_it_keeps(tmp_path, mask):
    old = os.umask(mask)
    try:
        (tmp_path / "plain").write_text("x")  # what open() and mkdir give
        (tmp_path / "plain-dir").mkdir()
        os.close(os.open(tmp_path / "file", os.O_CREAT | os.O_WRONLY, 0o600))
        (tmp_path / "dir").mkdir(mode=0o700)
        for name in ("file", "dir"):
            give_usual_mode(tmp_path / name)
        assert umask() == mask
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes["file"] == modes["plain"] and modes["dir"] == modes["plain-dir"]
    assert (modes["file"], modes["dir"]) == (0o666 & ~mask, 0o777 & ~mask)


def test_writing_onto_a_folder_names_the_folder_not_a_temporary_file(tmp_path):
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(
        TformerError, match=f"cannot write {re.escape(str(tmp_path / 'a-folder'))}:"
    ):
        atomic_write_text(tmp_path / "a-folder", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["a-folder"]


@pytest.fixture
def disk_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Records ``("fsync", inode)`` and ``("replace", inode of the file renamed)``, in order."""
    calls: list[tuple[str, int]] = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd: int) -> None:
        calls.append(("fsync", os.fstat(fd).st_ino))
        fsync(fd)

    def record_replace(src, dst) -> None:
        calls.append(("replace", os.stat(src).st_ino))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    return calls


def test_the_file_is_synced_before_the_rename_and_its_folder_after(tmp_path, disk_calls):
    target = tmp_path / "run" / "model.pt"
    target.parent.mkdir()
    save(target, {"w": torch.ones(2)})
    file, folder = target.stat().st_ino, target.parent.stat().st_ino
    assert disk_calls == [("fsync", file), ("replace", file), ("fsync", folder)]


def test_folders_made_for_the_file_are_synced_into_their_parents(tmp_path, disk_calls):
    target = tmp_path / "run" / "checkpoints" / "step-000010.pt"
    atomic_write_text(target, "x")
    synced = [ino for call, ino in disk_calls if call == "fsync"]
    folders = [target.parent, tmp_path / "run", tmp_path]
    assert synced == [target.stat().st_ino, *(f.stat().st_ino for f in folders)]


def test_a_write_that_need_not_be_durable_is_not_synced(tmp_path, disk_calls):
    atomic_write_text(tmp_path / "out" / "translations.txt", "x\n", durable=False)
    assert [call for call, _ in disk_calls] == ["replace"]
    assert (tmp_path / "out" / "translations.txt").read_text(encoding="utf-8") == "x\n"


def test_a_failing_file_sync_is_an_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    atomic_write_text(target, "old")

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(TformerError, match=r"cannot write .*last\.pt: Input/output error"):
        atomic_write_text(target, "new")
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_folder_that_cannot_be_synced_does_not_fail_the_write(tmp_path, monkeypatch):
    """Some file systems refuse ``fsync`` on a folder (EINVAL); the file is whole by then."""
    fsync = os.fsync

    def files_only(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", files_only)
    atomic_write_text(tmp_path / "config.json", "{}\n")
    assert (tmp_path / "config.json").read_text(encoding="utf-8") == "{}\n"
