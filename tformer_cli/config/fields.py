"""How a settings field is declared (``setting``: its help, spellings, values), the values it
may hold (``Range``, ``OneOf``, ``Pattern``), and their checks with one-line errors."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, TypeVar, get_args, get_type_hints

from tformer_cli.errors import SettingError, TformerError


def shown(x: float) -> str:
    """A bound as a rule writes it: ``1``, ``0.0001``, ``9223372036854775807``."""
    return str(x) if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """The values of a number setting: finite, from ``low`` to ``high`` (``None``: no bound),
    each end included unless ``low_open``/``high_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def rule(self) -> str:
        """The rule a value outside the range breaks: ``must be in (0, 1]``."""
        low, high = self.low, self.high
        if low is not None and high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"must be in {left}{shown(low)}, {shown(high)}{right}"
        if low is not None:
            return f"must be {'above' if self.low_open else 'at least'} {shown(low)}"
        if high is not None:
            return f"must be {'below' if self.high_open else 'at most'} {shown(high)}"
        return "must be a finite number"

    def refuses(self, value: float) -> str | None:
        """The rule ``value`` breaks, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        low, high = self.low, self.high
        below = low is not None and (value <= low if self.low_open else value < low)
        above = high is not None and (value >= high if self.high_open else value > high)
        return self.rule if below or above else None


@dataclass(frozen=True)
class OneOf:
    """The values of a setting of a fixed set: ``choices``."""

    choices: tuple[str, ...]

    @property
    def rule(self) -> str:
        return f"must be one of {', '.join(self.choices)}"

    def refuses(self, value: str) -> str | None:
        return None if value in self.choices else self.rule


@dataclass(frozen=True)
class Pattern:
    """The values of a text setting of a fixed form: ``pattern`` (a regular expression), which
    ``rule`` says in words."""

    pattern: str
    rule: str

    def refuses(self, value: str) -> str | None:
        return None if re.fullmatch(self.pattern, value) else self.rule


Values = Range | OneOf | Pattern


def option(
    help: str, name: str = "", *, flags: tuple[str, ...] = (), path: bool = False,
    values: Values | None = None, argument: bool = False, hidden: bool = False, metavar: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The metadata of a field that a face sets: its ``help``; ``name``: a train option's name
    when not the field's (``layers``); ``flags``: the command line's spellings (default
    ``--name-with-dashes``; ``--x/--no-x`` for a setting on by default); ``path``: a file or
    folder; ``values``: those it may hold (``check_values``, and each face's parser);
    ``argument``: the command line's positional argument (``hidden``: an old spelling, shown
    as ``metavar``)."""
    return {"option": name, "help": help, "flags": flags, "path": path, "values": values,
            "argument": argument, "hidden": hidden, "metavar": metavar}  # fmt: skip


def setting(default: Any, help: str, name: str = "", **meta: Any) -> Any:
    """A field that a face sets: its ``default`` (``MISSING``: required) and ``option``'s
    metadata."""
    return dataclasses.field(default=default, metadata=option(help, name, **meta))


def values(allowed: Values) -> dict[str, Values]:
    """The metadata of a field that may hold ``allowed`` and no option of train sets."""
    return {"values": allowed}


def values_of(config: type, name: str) -> Values:
    """The values that ``config``'s field ``name`` declares: an option that sets it takes them."""
    return next(f.metadata["values"] for f in dataclasses.fields(config) if f.name == name)


def same_as(config: type, name: str, help: str = "") -> Any:
    """A field declared as ``config``'s field ``name`` is (default, spellings, values), with its
    own ``help`` if given."""
    declared = next(f for f in dataclasses.fields(config) if f.name == name)
    meta = {**declared.metadata, "help": help or declared.metadata["help"]}
    return dataclasses.field(default=declared.default, metadata=meta)


TYPE_NAMES = {bool: "True or False", int: "a whole number", float: "a number"}


def kind_of(hint: Any) -> type | None:
    """The scalar type of a field's type hint (``int | None``: ``int``), or None."""
    return next((k for k in TYPE_NAMES if k is hint or k in get_args(hint)), None)


def refused_kind(kind: type | None, value: Any) -> str | None:
    """The rule ``value`` breaks as a setting of ``kind`` (``True`` is no beam, ``"5"`` no
    number), or None."""
    if kind is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    return f"must be {TYPE_NAMES[kind]}"


def check_values(config: Any) -> None:
    """A ``SettingError`` for the first field of ``config`` whose value (``None`` aside) is not
    of its type or not one of the ``values`` it declares."""
    hints = get_type_hints(type(config))
    for f in dataclasses.fields(config):
        allowed, value = f.metadata.get("values"), getattr(config, f.name)
        if value is None:
            continue
        rule = refused_kind(kind_of(hints[f.name]), value)
        if rule is None and allowed is not None:
            rule = allowed.refuses(value)
        if rule is not None:
            raise SettingError(f.name, value, rule)


class Checked:
    """A settings dataclass that refuses, once made, a value ``check_values`` refuses."""

    def __post_init__(self) -> None:
        check_values(self)


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
