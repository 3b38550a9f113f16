"""The metadata of a config field that ``tformer train`` sets with an option, and building a
config from a table of values with one-line errors."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from tformer_cli.errors import TformerError


def option(help: str, name: str = "", *, path: bool = False, **bounds: Any) -> dict[str, Any]:
    """The metadata of a field that ``tformer train`` sets with an option: its ``help``, its
    name (default: the field's, as ``--name-with-dashes``), ``path``: a file or folder (a
    ``Path``), ``bounds``: the ``min``/``max`` of its value (``TRAIN_OPTIONS``)."""
    return {"option": name, "help": help, "path": path, "bounds": bounds}


MODES = ("auto", "on", "off")  # --compile


def check_mode(mode: str) -> str:
    """``mode`` if it is one of ``auto``, ``on``, ``off``; else a one-line error."""
    if mode not in MODES:
        raise TformerError(f"unknown --compile {mode!r}: use auto, on or off")
    return mode


C = TypeVar("C")


def from_dict(cls: type[C], values: dict[str, Any]) -> C:
    """Build a config dataclass, naming unknown keys instead of failing with a TypeError."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TformerError(f"unknown {cls.__name__} settings: {', '.join(unknown)}")
    for name, value in values.items():  # scalars: the type of the default (an int for a float)
        default = fields[name].default
        if default is dataclasses.MISSING or default is None:
            continue
        want = type(default)
        ok = isinstance(value, want) or (want is float and isinstance(value, int))
        if not ok or (isinstance(value, bool) and want is not bool):
            raise TformerError(f"{name} must be of type {want.__name__}, not {value!r}")
    return cls(**values)
