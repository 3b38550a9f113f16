"""Atomic file writes: a temporary file in the target's folder, then ``os.replace``, so that
readers never see half a file and an interrupted write leaves the old file whole."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tformer_cli.errors import TformerError


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` then ``os.replace(tmp, path)``: readers never see half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise TformerError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise TformerError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
