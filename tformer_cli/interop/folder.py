"""A folder written whole or not at all: filled under a temporary name beside it, then renamed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tformer_cli.errors import TformerError
from tformer_cli.files import (
    STORAGE_FAULTS,
    give_usual_mode,
    storage_fault,
    sync_dir,
    write_error,
)


def write_folder(target: Path, fill: Callable[[Path], None], replace: bool = False) -> Path:
    """Call ``fill(tmp)`` on a new empty folder beside ``target``, then rename it to ``target``:
    an error or Ctrl-C on the way leaves nothing behind. What ``fill`` wrote gets the modes a
    plain ``open()`` or ``mkdir`` would give it. ``target`` must not exist (an empty
    folder may), unless ``replace``."""
    if target.exists() and not replace and not (target.is_dir() and not any(target.iterdir())):
        raise TformerError(f"{target} already exists: give a new folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    except OSError as e:
        raise write_error(target, e) from None
    try:
        fill(tmp)
        for path in (tmp, *tmp.rglob("*")):  # mkdtemp makes 0700, safetensors 0600
            if not path.is_symlink():
                give_usual_mode(path)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        fault = storage_fault(e) if isinstance(e, Exception) else None
        if fault is not None and fault.errno in STORAGE_FAULTS:  # a full disk: name the folder
            raise write_error(target, fault) from None
        raise
    sync_dir(target.parent)
    return target
