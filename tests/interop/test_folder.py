"""write_folder: a folder appears whole, or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from tformer_cli.errors import TformerError
from tformer_cli.interop.folder import write_folder


def test_a_folder_appears_whole_and_an_error_leaves_nothing(tmp_path):
    def fill(tmp):
        (tmp / "a").write_text("1")

    assert write_folder(tmp_path / "out", fill) == tmp_path / "out"
    assert (tmp_path / "out" / "a").read_text() == "1"

    def fail(tmp):
        (tmp / "half").write_text("?")
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        write_folder(tmp_path / "other", fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_existing_folder_is_refused_unless_empty_or_replaced(tmp_path):
    (tmp_path / "out").mkdir()
    write_folder(tmp_path / "out", lambda tmp: (tmp / "a").write_text("1"))  # was empty
    with pytest.raises(TformerError, match="already exists"):
        write_folder(tmp_path / "out", lambda tmp: None)
    write_folder(tmp_path / "out", lambda tmp: (tmp / "b").write_text("2"), replace=True)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["b"]


def test_what_the_fill_writes_gets_the_modes_open_and_mkdir_would_give(tmp_path):
    def fill(tmp):  # as safetensors writes its file, and mkdtemp its folder
        os.close(os.open(tmp / "model.safetensors", os.O_CREAT | os.O_WRONLY, 0o600))
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "a").write_text("1")

    umask = os.umask(0o022)
    try:
        out = write_folder(tmp_path / "out", fill)
    finally:
        os.umask(umask)
    modes = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
    assert modes == {"model.safetensors": 0o644, "sub": 0o755, "sub/a": 0o644}
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
