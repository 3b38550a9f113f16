"""One way to compile, shared by the decode step and the training step: ``--compile auto|on|off``
(``auto``: where the caller knows compiling pays). A compiled function falls back to eager, with
a one-line notice, when compiling fails; Inductor's cache lives under ``cache_root()``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from tformer_cli.config.fields import check_mode
from tformer_cli.errors import first_line

R = TypeVar("R")


def wanted(mode: str, auto: bool) -> bool:
    """Whether to compile: ``on`` yes, ``off`` no, ``auto`` what the caller decided (``auto``)."""
    return {"on": True, "off": False}.get(check_mode(mode), auto)


def cache_root() -> Path:
    """The folder of what compiling leaves for later runs: ``$XDG_CACHE_HOME/tformer``."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tformer"


class Compiled(Generic[R]):
    """``fn`` under ``torch.compile`` (timed: ``seconds``), or ``fn`` where that failed."""

    def __init__(
        self,
        fn: Callable[..., R],
        name: str,
        on_notice: Callable[[str], None] | None = None,
        **options: Any,
    ) -> None:
        self.eager, self.name = fn, name
        self.on_notice = on_notice or (lambda line: print(line, file=sys.stderr))
        self.compiled: Callable[..., R] | None = torch.compile(fn, **options)
        self.seconds: float | None = None  # compile time, once the first call has run
        self.notice: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if self.compiled is None:
            return self.eager(*args, **kwargs)
        start = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # Dynamo/Inductor errors, at the first call or a recompile
            self.compiled = None
            reason = first_line(e)[:160]
            self.notice = f"compiling the {self.name} failed ({reason}); running it eagerly"
            self.on_notice(self.notice)
            return self.eager(*args, **kwargs)
        if self.seconds is None:
            self.seconds = time.perf_counter() - start
            self.on_notice(f"compiled the {self.name} in {self.seconds:.1f} s")
        return out


def maybe_compile(
    fn: Callable[..., R],
    mode: str,
    auto: bool,
    name: str,
    on_notice: Callable[[str], None] | None = None,
    **options: Any,
) -> Callable[..., R]:
    """``Compiled(fn, ...)`` where ``wanted(mode, auto)``, else ``fn`` unchanged."""
    return Compiled(fn, name, on_notice, **options) if wanted(mode, auto) else fn
