"""A learner's functions inside a trained model (``--use FILE``): every exercise the file passes
is swapped in for tformer's own while the model translates or is evaluated, on the eager step
with the explicit attention (the compiled step, the fused kernel and CTranslate2 would bypass
them); and, for ``tformer train --use``, the loss and the scheduled-sampling mix while it trains.

The swap patches the names tformer calls: the module-level functions (``attention``, the masks,
``write_cache``; the training step's ``label_smoothed_loss``, with the fused gradient off, and
``mix_inputs``), the fused-kernel switch, and the forward of the modules whose equation has a
functional form (``Embeddings`` with the position table of ``sinusoidal_positions``,
``Residual``, ``FeedForward``), routed through it for the time of the swap only. The other
exercises act in checking only.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer_cli.learn.checker import PASSED, Report, check_namespace, learner_file, load
from tformer_cli.learn.exercises import EXERCISES
from tformer_cli.model import attention as attention_module
from tformer_cli.model import fast
from tformer_cli.model import transformer as transformer_module
from tformer_cli.model.layers import Embeddings, FeedForward, Residual
from tformer_cli.training import loss as loss_module
from tformer_cli.training import scheduled_sampling, trainer

# The module-level names that the model and the training step call, by exercise: (module, name).
CALLED: dict[str, tuple[Any, str]] = {
    "attention": (attention_module, "attention"),
    "causal_mask": (attention_module, "causal_mask"),
    "padding_mask": (transformer_module, "padding_mask"),
    "write_cache": (attention_module, "write_cache"),
    "label_smoothed_loss": (trainer, "label_smoothed_loss"),
    "mix_inputs": (scheduled_sampling, "mix_inputs"),
}
# The exercises whose functional form a module's forward is routed through.
ROUTED = ("sinusoidal_positions", "layer_norm", "residual", "feed_forward", "embed")
TRAINED = ("label_smoothed_loss", "mix_inputs")
"""The exercises that act in training (``tformer train --use``)."""
ACTING = tuple(e.name for e in EXERCISES if e.name in (*CALLED, *ROUTED) and e.name not in TRAINED)
"""The exercises that act in translation; the others act in training or in checking only."""


@dataclass(frozen=True)
class Use:
    """The learner's file (``report``: its check) and the functions that act (in translation,
    ``ACTING``; in training, ``TRAINED``): ``functions`` by exercise name, the learner's where
    the file passes it, else tformer's."""

    report: Report
    functions: dict[str, Callable[..., Any]]

    @property
    def learners(self) -> list[str]:
        """The exercises whose learner's function acts, in order."""
        return [
            r.exercise for r in self.report.results if r.passed and r.exercise in self.functions
        ]

    def line(self) -> str:
        """``using your attention, causal_mask (passed); tformer's own for: ...``."""
        own = ", ".join(name for name in self.functions if name not in self.learners) or "nothing"
        if not self.learners:
            return f"using none of your functions; tformer's own for: {own}"
        return f"using your {', '.join(self.learners)} (passed); tformer's own for: {own}"


EAGER_NOTE = (
    "--use: the eager step with the explicit attention (--compile off, no fused kernel),"
    " which calls your functions"
)
TRAINING_NOTE = (
    "--use: the eager training step (--compile off, the loss's fused gradient off), which calls"
    " your label_smoothed_loss and mix_inputs"
)


def prepare(learner: Path | dict[str, Any], acting: tuple[str, ...] = ACTING) -> Use:
    """Check the learner's file (or folder), or a notebook's ``globals()``, and pick the
    functions of ``acting`` (default: those of translation; ``TRAINED``: of training): the
    learner's where it passes, tformer's own elsewhere (``swapped``
    puts those under the learner's names too, so that a passing function calls tformer's
    where the learner's own lower piece fails)."""
    if isinstance(learner, dict):
        namespace, source = learner, "your functions"
    else:
        file = learner_file(learner)
        namespace, source = load(file), str(file)
    report = check_namespace(namespace, source)
    passed = {r.exercise for r in report.results if r.status == PASSED}
    return Use(
        report,
        {e.name: namespace[e.name] if e.name in passed else e.solution for e in EXERCISES
         if e.name in acting},
    )  # fmt: skip


@contextlib.contextmanager
def swapped(use: Use | None) -> Iterator[None]:
    """For the time of the block, tformer computes with ``use``'s functions: the names it calls
    patched (each function's lower pieces too), every attention on its explicit path, and the
    embeddings, sublayers and FFNs routed through their functional forms; the loss with the
    fused gradient off, so that autograd differentiates the learner's. All is put back after.
    ``use`` None: nothing swapped."""
    with contextlib.ExitStack() as undo:
        if use is None:
            yield
            return
        fns: dict[str, Any] = dict(use.functions)
        if "label_smoothed_loss" in fns:
            fns["FUSED_GRADIENT"] = False
            undo.enter_context(patched(loss_module, "FUSED_GRADIENT", False))
        for name, fn in use.functions.items():
            if name in CALLED:
                undo.enter_context(patched(*CALLED[name], fn))
        for fn in use.functions.values():  # each calls the others' swapped forms
            namespace = inspect.unwrap(fn).__globals__
            for name in fns.keys() & namespace.keys():
                undo.enter_context(patched_name(namespace, name, fns[name]))
        if any(name in fns for name in ROUTED):
            undo.enter_context(patched(fast, "fused_attention", never_fused))
            for cls, forward in routed_forwards(fns).items():
                undo.enter_context(patched(cls, "forward", forward))
        yield


def never_fused(q: Tensor, explicit: bool = False) -> bool:
    """``fast.fused_attention`` while swapped: every attention on the explicit path, which
    calls ``attention``."""
    return False


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` set to ``value`` for the time of the block."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextlib.contextmanager
def patched_name(namespace: dict[str, Any], name: str, value: Any) -> Iterator[None]:
    """``namespace[name]`` (a module's globals) set to ``value`` for the time of the block."""
    saved = namespace[name]
    namespace[name] = value
    try:
        yield
    finally:
        namespace[name] = saved


def routed_forwards(fns: dict[str, Callable[..., Any]]) -> dict[type, Callable[..., Tensor]]:
    """The forward of each module with a functional form, computed by that form (inference:
    no dropout). An FFN of another activation than ReLU keeps its own forward."""
    own_ffn = FeedForward.forward
    tables: dict[tuple[Any, ...], Tensor] = {}  # sinusoidal_positions' tables, by shape

    def positions(self: Embeddings) -> Tensor:
        if self.is_learned:
            return self.learned
        own = self.sinusoid
        key = (*own.shape, own.dtype, own.device)
        if key not in tables:
            tables[key] = fns["sinusoidal_positions"](*own.shape).to(own)
        return tables[key]

    def embeddings(self: Embeddings, tokens: Tensor, slots: Tensor | None = None) -> Tensor:
        pe = positions(self) if slots is None else positions(self).index_select(0, slots)
        return fns["embed"](tokens, self.tokens.weight, pe)

    def residual(self: Residual, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return fns["residual"](x, sublayer, self.norm.weight, self.norm.bias, self.pre_norm)

    def feed_forward(self: FeedForward, x: Tensor) -> Tensor:
        if self.act is not torch.relu:
            return own_ffn(self, x)
        return fns["feed_forward"](
            x, self.w_1.weight, self.w_1.bias, self.w_2.weight, self.w_2.bias
        )

    return {Embeddings: embeddings, Residual: residual, FeedForward: feed_forward}
