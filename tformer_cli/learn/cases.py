"""What an exercise of ``tformer learn`` is: tformer's own function to write again (``Exercise``),
and the inputs its check runs it on (``Case``), with the helpers that build them.

An ``Exercise`` names tformer's function (``solution``): the check runs it beside the learner's on
the same ``Case`` inputs (random ones, edge cases, masked ones where hiding an input must not
change the output, gradients where the piece is trained), and a later ``--use`` knows which of
tformer's functions a passing one replaces. The learner's stub is the solution's signature with
the exercise's ``task`` as its docstring (``stubs.py``), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tformer_cli.data.tokenizer import PAD_ID

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """One input of a check, built afresh by ``args()`` for each function run on it.

    ``kind``: ``value`` (the output, compared with tformer's); ``grad`` (the gradients of the
    ``trained`` arguments under a fixed random weighting of the output); ``peek`` (the ``seen``
    part of the output must not change when ``hide`` changes only the inputs that ``hides``
    names, which the function must not look at; then compared with tformer's); ``sample`` (a
    random output, judged on its own by ``judge``: a message, or None when right)."""

    label: str
    args: Callable[[], Args]
    kind: str = "value"
    trained: tuple[str, ...] = ()
    hide: Callable[[Args], Args] | None = None
    seen: Callable[[Any], Any] = lambda out: out
    hides: str = ""
    judge: Callable[[Args, Any], str | None] | None = None


@dataclass(frozen=True)
class Exercise:
    """A function to write: tformer's ``solution``, under the same name. ``observed`` picks what
    of a run is compared (the output by default); ``helpers`` are names of the solution's module
    that the stub file imports for it; ``hint`` explains a mismatch that no named mistake does."""

    solution: Callable[..., Any]
    section: str
    title: str
    task: str
    hint: str
    cases: tuple[Case, ...]
    helpers: tuple[str, ...] = ()
    observed: Callable[[Any, Args], Any] = lambda out, args: out

    @property
    def name(self) -> str:
        return self.solution.__name__

    @property
    def where(self) -> str:
        """``tformer_cli/model/attention.py: attention``: tformer's function the check runs."""
        return f"{self.solution.__module__.replace('.', '/')}.py: {self.name}"


# ---------------------------------------------------------------------------- inputs
def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def words(lengths: list[int], seed: int = 0, vocab: int = 10) -> Tensor:
    """Rows of word ids (>= 4) of the given lengths, right-padded with ``<pad>`` (0): (B, S)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    return out


def changed(x: Tensor, where: Tensor, seed: int = 99) -> Tensor:
    """``x`` with the entries ``where`` (broadcast) moved by a large random amount."""
    return torch.where(where, x + 5 * randn(*x.shape, seed=seed, dtype=x.dtype), x)


MISSING = "(no such attribute)"


def fields(obj: Any, *names: str) -> dict[str, Any]:
    """The attributes ``names`` of ``obj``, ``MISSING`` for those it lacks."""
    return {name: getattr(obj, name, MISSING) for name in names}


def last_row(x: Tensor, axis: int) -> Tensor:
    """A mask of the last entry along ``axis`` of ``x`` (-2 or 1), broadcastable to ``x``."""
    n = x.size(axis)
    return (torch.arange(n) == n - 1)[:, None]
