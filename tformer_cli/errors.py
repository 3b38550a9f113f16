"""The one error type for user-facing failures: the CLI prints its message on one line; and its
kind for a setting out of its range, which each face names its own way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class TformerError(Exception):
    """A problem the user can fix (bad input, missing run, wrong option); never a bug."""


def first_line(e: BaseException) -> str:
    """An exception's message in one line (its first), or its type's name."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class Spelled(dict):  # type: ignore[type-arg]
    """The names of the settings a rule mentions (``{beam}``), as a face writes them."""

    def __init__(self, spell: Callable[[str], str]) -> None:
        super().__init__()
        self.spell = spell

    def __missing__(self, name: str) -> str:
        return self.spell(name)


class SettingError(TformerError):
    """A settings object's ``field`` holds a ``value`` against its ``rule`` ("must be in (0,
    1]", "needs {beam} >= 3": a rule names other settings in braces). Each face names the
    setting its own way: the command line ``--top-p``, the server ``top_p``, Python ``top_p=``
    (the message)."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field, self.value, self.rule = field, value, rule
        super().__init__(self.in_python())

    def explained(self, spell: Callable[[str], str] = str) -> str:
        """The value and the rule it breaks, the settings the rule names written by ``spell``:
        ``2.0 must be in (0, 1]``, ``3 needs --beam >= 3``."""
        return f"{self.value!r} {self.rule.format_map(Spelled(spell))}"

    @property
    def message(self) -> str:
        return self.explained()

    def in_python(self, keyword: Callable[[str], str] = str) -> str:
        """The message as the Python API says it, each setting by its ``keyword``:
        ``top_p=2.0: must be in (0, 1]``."""
        return f"{keyword(self.field)}={self.value!r}: {self.rule.format_map(Spelled(keyword))}"
