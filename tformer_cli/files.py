"""Atomic, durable file writes: a temporary file synced to disk, ``os.replace``, then the folder
synced, so that readers never see half a file and after a power cut the name points at the
whole new file or the old one; and a file's SHA-256."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from tformer_cli.errors import TformerError


def sync_file(path: Path) -> None:
    """``fsync`` the file at ``path``: its data and size reach the disk."""
    fd = os.open(path, os.O_RDWR)  # Windows syncs only files open for writing
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(folder: Path) -> None:
    """``fsync`` a folder, so that a rename into it survives a power cut; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def umask() -> int:
    """The process's file mode creation mask (read by setting it and back: there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def give_usual_mode(path: Path) -> None:
    """Give ``path`` the mode a plain ``open()`` or ``mkdir`` would, not ``mkstemp``'s."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask())


# What a storage fault raises: a full disk, a file-size limit, a quota, a read-only file system,
# a permission denied. Each ends a write with one line naming the file; nothing else is touched.
STORAGE_FAULTS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def storage_fault(e: BaseException) -> OSError | None:
    """The ``OSError`` behind ``e``: ``e``, its cause or context (``torch.save``'s
    ``RuntimeError``), or the one a Rust writer names (``(os error 27)``)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    rust = re.search(r"\(os error (\d+)\)", str(e))
    return OSError(int(rust[1]), os.strerror(int(rust[1]))) if rust else None


def write_error(path: Path, e: OSError) -> TformerError:
    """The one-line error of a failed write of ``path``."""
    reason = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        reason += " (free some space or lift the limit, then run the command again)"
    return TformerError(f"cannot write {path}: {reason}")


def atomic_write(path: Path, write: Callable[[Path], object], *, durable: bool = True) -> None:
    """Call ``write(tmp)`` then ``os.replace(tmp, path)``; ``durable``: sync the file before the
    rename and the folders after it (``False``: for outputs cheap to make again)."""
    made: list[Path] = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise write_error(path, e) from None
    os.close(fd)
    try:
        write(Path(tmp))
        give_usual_mode(Path(tmp))  # mkstemp makes 0600
        if durable:
            sync_file(Path(tmp))
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        fault = storage_fault(e) if isinstance(e, Exception) else None
        if fault is not None:
            raise write_error(path, fault) from None
        raise
    if durable:
        for folder in (path.parent, *(f.parent for f in made)):
            sync_dir(folder)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` as UTF-8 with ``atomic_write``."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), durable=durable)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB pieces."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for piece in iter(lambda: f.read(1 << 20), b""):
                digest.update(piece)
    except OSError as e:
        raise TformerError(f"cannot read {path}: {e.strerror or e}") from None
    return digest.hexdigest()
