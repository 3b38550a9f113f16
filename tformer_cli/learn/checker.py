"""How ``tformer learn check`` judges a learner's function: run beside tformer's own on each of
the exercise's cases, compared within ``TOLERANCE`` (shapes, dtypes and values, gradients where
the piece is trained), and never allowed to look at what a mask hides.

While an exercise is checked, the names of the other exercises in the learner's module point to
tformer's own functions: a learner's multi-head attention runs with tformer's ``attention``, so
one mistake fails one exercise. The first mismatch is reported with its inputs and, where the
learner's outputs match a known-wrong variant (``mistakes.py``), the mistake and its hint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import html
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Group
from rich.text import Text
from torch import Tensor, nn

from tformer_cli.config import DecodeConfig
from tformer_cli.errors import TformerError
from tformer_cli.learn.cases import Case, Exercise, randn
from tformer_cli.learn.exercises import BY_NAME, EXERCISES
from tformer_cli.learn.mistakes import BY_EXERCISE, MISTAKES, Mistake

TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}  # |got - expected| <= atol + rtol * |expected|
TOLERANCE_NOTE = "values agree within {atol} + {rtol} x |expected|".format(**TOLERANCE)
PASSED, FAILED, NOT_WRITTEN = "passed", "failed", "not written yet"
STYLE = {PASSED: "green", FAILED: "bold red", NOT_WRITTEN: "yellow"}
HTML_COLOUR = {PASSED: "green", FAILED: "#c00", NOT_WRITTEN: "#a60"}


@dataclass(frozen=True)
class Result:
    """One exercise's check: ``status`` passed, failed or not written yet; where it failed, the
    ``case``, its ``inputs``, the first mismatch (``problem``), the ``mistake`` recognised if
    any, and a ``hint``. ``solution``: tformer's function it was checked against."""

    exercise: str
    status: str
    solution: str
    case: str = ""
    inputs: str = ""
    problem: str = ""
    mistake: str = ""
    hint: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def row(self) -> tuple[str, str]:
        """The exercise's name, padded, and its status (with the mistake recognised)."""
        return f"{self.exercise:<22} ", self.status + (f": {self.mistake}" if self.mistake else "")

    def details(self) -> list[str]:
        """Under a failure: the case, its inputs, the first mismatch, the hint, the solution."""
        if self.status != FAILED:
            return []
        lines = [f"case: {self.case}", f"inputs: {self.inputs}", self.problem,
                 f"hint: {self.hint}", f"tformer's: {self.solution}"]  # fmt: skip
        return [f"    {line}" for line in lines]

    def lines(self) -> list[str]:
        return ["".join(self.row()), *self.details()]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __rich__(self) -> Text:
        name, status = self.row()
        head = Text(name) + Text(status, style=STYLE[self.status])
        return Text("\n").join([head, *(Text(line, style="dim") for line in self.details())])

    def _repr_html_(self) -> str:
        """A notebook's view: the row, its status coloured, and the details of a failure."""
        name, status = (html.escape(part) for part in self.row())
        details = "".join("\n" + html.escape(line) for line in self.details())
        return f'<pre>{name}<b style="color:{HTML_COLOUR[self.status]}">{status}</b>{details}</pre>'


@dataclass(frozen=True)
class Report:
    """The results of checking a file (``source``), one per exercise, in order."""

    source: str
    results: list[Result]

    @property
    def passed(self) -> bool:
        """Whether every exercise checked has passed (``learn check`` exits 0)."""
        return all(r.passed for r in self.results)

    def summary(self) -> str:
        statuses = [r.status for r in self.results]
        told = ", ".join(
            f"{statuses.count(s)} {s}" for s in (PASSED, FAILED, NOT_WRITTEN) if s in statuses
        )
        n = len(self.results)
        return f"{self.source}: {n} exercise{'s' * (n != 1)}, {told}"

    def lines(self) -> list[str]:
        rows = [line for r in self.results for line in r.lines()]
        return [*rows, "", self.summary(), TOLERANCE_NOTE]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __rich__(self) -> Group:
        summary = Text(self.summary(), style="bold")
        return Group(*self.results, Text(""), summary, Text(TOLERANCE_NOTE, style="dim"))

    def _repr_html_(self) -> str:
        rows = "".join(r._repr_html_() for r in self.results)
        return f"{rows}<p><b>{html.escape(self.summary())}</b></p>"


# ---------------------------------------------------------------------------- comparing
def difference(expected: Any, got: Any, where: str = "output") -> str | None:
    """The first way ``got`` differs from ``expected`` (type, length, shape, dtype, value beyond
    ``TOLERANCE``), as one line naming ``where``; None when they agree."""
    if isinstance(expected, Tensor):
        return tensor_difference(expected, got, where)
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where}: expected a dict, got {type(got).__name__}"
        found = (difference(v, got.get(k), label(where, k)) for k, v in expected.items())
        return next((d for d in found if d), None)
    if isinstance(expected, list | tuple):
        if not isinstance(got, list | tuple):
            return f"{where}: expected a {type(expected).__name__}, got {type(got).__name__}"
        if len(got) != len(expected):
            shown = f": expected {expected}, got {got}" if len(str(expected)) < 60 else ""
            return f"{where}: expected {len(expected)} items, got {len(got)}{shown}"
        found = (
            difference(e, g, f"{where}[{i}]")
            for i, (e, g) in enumerate(zip(expected, got, strict=True))
        )
        return next((d for d in found if d), None)
    if isinstance(expected, float) and not isinstance(got, bool):
        value = float(got) if isinstance(got, int | float) or is_scalar(got) else None
        if value is not None and math.isclose(value, expected, rel_tol=TOLERANCE["rtol"],
                                              abs_tol=TOLERANCE["atol"]):  # fmt: skip
            return None
        return f"{where}: expected {expected:.6g}, got {show(got)}"
    return None if got == expected else f"{where}: expected {show(expected)}, got {show(got)}"


def tensor_difference(expected: Tensor, got: Any, where: str) -> str | None:
    if got is None and where.startswith("the gradient"):
        return f"{where}: none, the output does not depend on it through autograd"
    if not isinstance(got, Tensor):
        return f"{where}: expected a tensor {tuple(expected.shape)}, got {show(got)}"
    if got.shape != expected.shape:
        return f"{where}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    if got.dtype != expected.dtype:
        return f"{where}: expected dtype {expected.dtype}, got {got.dtype}"
    at = first_difference(expected, got)
    if at is None:
        return None
    place = f" at {list(at)}" if at else ""
    return f"{where}{place}: expected {show(expected[at])}, got {show(got[at])}"


def first_difference(a: Tensor, b: Tensor) -> tuple[int, ...] | None:
    """The index of the first entry where ``b`` differs from ``a`` beyond ``TOLERANCE`` (exactly,
    for integers and booleans), or None; ``()`` for a scalar."""
    a, b = a.detach(), b.detach()
    ok = torch.isclose(b, a, **TOLERANCE, equal_nan=True) if a.is_floating_point() else a == b
    if bool(ok.all()):
        return None
    return tuple(int(i) for i in (~ok).nonzero()[0]) if ok.dim() else ()


def label(where: str, key: str) -> str:
    return key if where == "output" else f"{where}.{key}"


def is_scalar(x: Any) -> bool:
    return isinstance(x, Tensor) and x.numel() == 1


def show(x: Any) -> str:
    """A value, short: numbers to 4 decimals, a tensor by its shape."""
    if is_scalar(x):
        x = x.item()
    if isinstance(x, float):
        return f"{x:.4f}" if x == 0 or (math.isfinite(x) and abs(x) >= 1e-3) else f"{x:.4g}"
    if isinstance(x, Tensor):
        return f"a tensor {tuple(x.shape)}"
    return repr(x) if len(repr(x)) < 60 else f"a {type(x).__name__}"


def describe(exercise: Exercise, args: tuple[Any, ...]) -> str:
    """The inputs of a case, by the solution's parameter names: tensors by shape (and dtype
    when not float32), short values as they are."""
    names = list(inspect.signature(exercise.solution).parameters)
    return ", ".join(f"{name} {brief(value)}" for name, value in zip(names, args, strict=False))


def brief(value: Any) -> str:
    if isinstance(value, Tensor):
        dtype = "" if value.dtype in (torch.float32, torch.long) else f", {value.dtype}"
        return f"{tuple(value.shape)}{dtype}"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # AttentionWeights
        shapes = (f"{k} {tuple(v.shape)}" for k, v in zip(value._fields, value, strict=True))
        return f"({', '.join(shapes)})"
    if isinstance(value, nn.Module):
        return "(the check's small trained model)"
    if isinstance(value, DecodeConfig):
        changed = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                   if getattr(value, f.name) != f.default}  # fmt: skip
        return f"DecodeConfig({', '.join(f'{k}={v}' for k, v in changed.items())})"
    if callable(value) or isinstance(value, torch.Generator):
        return f"(a {type(value).__name__})"
    if len(repr(value)) <= 40 or not isinstance(value, list | tuple):
        return repr(value)[:40]
    return f"({len(value)} items)"


# ---------------------------------------------------------------------------- running
def observe(exercise: Exercise, case: Case, fn: Callable[..., Any]) -> Any:
    """What the check compares of ``fn`` run on ``case`` (``Case.kind``)."""
    if case.kind == "grad":
        return gradients(exercise, case, fn)
    args = case.args()
    if case.kind == "peek":
        assert case.hide is not None
        return case.seen(fn(*args)), case.seen(fn(*case.hide(case.args())))
    return exercise.observed(fn(*args), args)


def leaves(name: str, value: Any) -> list[tuple[str, Tensor]]:
    """The tensors in ``value``, labelled: ``weights.w_q`` in a named tuple, ``out[0]``."""
    if isinstance(value, Tensor):
        return [(name, value)]
    if isinstance(value, tuple | list):
        keys = getattr(value, "_fields", None) or [f"[{i}]" for i in range(len(value))]
        sep = "." if hasattr(value, "_fields") else ""
        return [
            leaf for k, v in zip(keys, value, strict=True) for leaf in leaves(f"{name}{sep}{k}", v)
        ]
    return []


def gradients(exercise: Exercise, case: Case, fn: Callable[..., Any]) -> dict[str, Any]:
    """d(sum of the outputs, each weighted by a fixed random tensor) / d(each ``trained``
    input), by name; None where no gradient reaches an input."""
    args = case.args()
    names = inspect.signature(exercise.solution).parameters
    inputs = {k: t.requires_grad_() for name, value in zip(names, args, strict=False)
              if name in case.trained for k, t in leaves(name, value)}  # fmt: skip
    outputs = [t for _, t in leaves("out", fn(*args)) if t.requires_grad]
    if not outputs:
        return {f"the gradient of {k}": None for k in inputs}
    total = sum((t * randn(*t.shape, seed=3, dtype=t.dtype)).sum() for t in outputs)
    found = torch.autograd.grad(total, list(inputs.values()), allow_unused=True)
    return {f"the gradient of {k}": g for k, g in zip(inputs, found, strict=True)}


@functools.cache
def expected(exercise: str, index: int) -> Any:
    """tformer's own observation of a case (computed once: the solution does not change)."""
    e = BY_NAME[exercise]
    return observe(e, e.cases[index], e.solution)


@functools.cache
def mutant(mistake: str, index: int) -> Any:
    """A mistake's observation of a case of its exercise, or the exception it raised."""
    m = next(m for m in MISTAKES if m.name == mistake)
    e = BY_NAME[m.exercise]
    try:
        return observe(e, e.cases[index], m.fn)
    except Exception as error:
        return error


def judge(exercise: Exercise, index: int, got: Any) -> str | None:
    """What is wrong with the observation ``got`` of case ``index``, or None."""
    case = exercise.cases[index]
    if case.kind == "sample":
        assert case.judge is not None
        return case.judge(case.args(), got)
    want = expected(exercise.name, index)
    if case.kind == "peek":
        return peeking(case, *got) or difference(want[0], got[0])
    return difference(want, got)


def peeking(case: Case, before: Any, after: Any) -> str | None:
    """How the output moved when only what ``case`` hides changed, or None."""
    if (
        not isinstance(before, Tensor)
        or not isinstance(after, Tensor)
        or before.shape != after.shape
    ):
        return None  # not a tensor of the right shape: the comparison with tformer's says so
    at = first_difference(before, after)
    if at is None:
        return None
    return (f"peeks at {case.hides}: changing only them moved the output at {list(at)} from"
            f" {show(before[at])} to {show(after[at])}")  # fmt: skip


def recognise(exercise: Exercise, observed: list[Any]) -> Mistake | None:
    """The named mistake whose outputs on the cases so far equal the learner's ``observed``
    (the last one the failing case), or None."""
    if exercise.cases[len(observed) - 1].kind == "sample":
        return None
    for m in BY_EXERCISE.get(exercise.name, []):
        ok = all(
            exercise.cases[i].kind == "sample"
            or (
                not isinstance(mutant(m.name, i), Exception)
                and difference(mutant(m.name, i), got) is None
            )
            for i, got in enumerate(observed)
        )
        if ok:
            return m
    return None


MISSING = object()


@contextlib.contextmanager
def lower_pieces(namespace: dict[str, Any], exercise: Exercise) -> Iterator[None]:
    """For the time of a check, tformer's own function in ``namespace`` (the learner's module)
    under the name of each other exercise, so that a mistake in a piece fails only its own."""
    saved = {e.name: namespace.get(e.name, MISSING) for e in EXERCISES if e is not exercise}
    namespace.update({e.name: e.solution for e in EXERCISES if e is not exercise})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def check_function(exercise: Exercise, fn: Callable[..., Any]) -> Result:
    """Run ``fn`` on every case of ``exercise``, with tformer's lower pieces, until the first
    mismatch."""
    observed: list[Any] = []
    with lower_pieces(getattr(inspect.unwrap(fn), "__globals__", {}), exercise):
        for i, case in enumerate(exercise.cases):
            try:
                got = observe(exercise, case, fn)
            except NotImplementedError:
                if i == 0:
                    return Result(exercise.name, NOT_WRITTEN, exercise.where)
                problem = "raised NotImplementedError: a part is not written yet"
                return failure(exercise, case, problem, None)
            except Exception as error:
                message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
                return failure(exercise, case, f"raised {type(error).__name__}: {message}", None)
            observed.append(got)
            problem = judge(exercise, i, got)
            if problem:
                return failure(exercise, case, problem, recognise(exercise, observed))
    return Result(exercise.name, PASSED, exercise.where)


def failure(exercise: Exercise, case: Case, problem: str, mistake: Mistake | None) -> Result:
    hint = mistake.hint if mistake else generic_hint(exercise, case)
    return Result(exercise.name, FAILED, exercise.where, case.label,
                  describe(exercise, case.args()), problem, mistake.title if mistake else "",
                  hint)  # fmt: skip


def generic_hint(exercise: Exercise, case: Case) -> str:
    if case.kind == "peek":
        return (f"The output must not depend on {case.hides}: add the mask to the scores before"
                " the softmax, where -inf becomes a weight of exactly 0.")  # fmt: skip
    if case.kind == "grad":
        return ("The values are right but not their gradients: keep every step differentiable"
                " (no .detach(), .item(), .numpy(), torch.no_grad or in-place writes to an"
                " input).")  # fmt: skip
    return exercise.hint


# ---------------------------------------------------------------------------- files
LEARNER_MODULE = "tformer_learner"


def learner_file(path: Path) -> Path:
    """``path``, or the exercises.py (else solutions.py) in the folder ``path``."""
    if path.is_dir():
        for name in ("exercises.py", "solutions.py"):
            if (path / name).is_file():
                return path / name
        raise TformerError(f"{path} holds no exercises.py: start with tformer learn start {path}")
    if not path.is_file():
        raise TformerError(f"no such file or folder: {path}")
    return path


def load(file: Path) -> dict[str, Any]:
    """The names a learner's file defines, after running it as a module."""
    spec = importlib.util.spec_from_file_location(LEARNER_MODULE, file)
    if spec is None or spec.loader is None:
        raise TformerError(f"{file} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[LEARNER_MODULE] = module  # where dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise TformerError(f"{file}, line {e.lineno}: {e.msg}") from None
    except Exception as e:
        raise TformerError(f"{file} fails as it loads: {type(e).__name__}: {e}") from None
    finally:
        sys.modules.pop(LEARNER_MODULE, None)
    return vars(module)


def find(name: str) -> Exercise:
    if name not in BY_NAME:
        raise TformerError(f"no exercise {name!r}: the exercises are {', '.join(BY_NAME)}")
    return BY_NAME[name]


def check_file(path: Path, only: str | None = None) -> Report:
    """Check every function of the learner's file (or folder) ``path``, or the one ``only``
    names; an exercise whose function is missing is not written yet."""
    if only is not None:
        find(only)  # an unknown name is said before the file is read
    file = learner_file(path)
    return check_namespace(load(file), str(file), only)


def check_namespace(namespace: dict[str, Any], source: str, only: str | None = None) -> Report:
    """Check every function of ``namespace`` (a learner's module, or a notebook's globals)
    named after an exercise, or the one ``only`` names; ``source``: what the report names."""
    exercises = [find(only)] if only else list(EXERCISES)
    results = []
    for exercise in exercises:
        fn = namespace.get(exercise.name)
        if callable(fn):
            results.append(check_function(exercise, fn))
        else:
            results.append(Result(exercise.name, NOT_WRITTEN, exercise.where))
    return Report(source, results)


def check(target: Callable[..., Any] | str | Path, name: str | None = None) -> Result | Report:
    """``check(fn)`` or ``check(fn, "attention")``: the ``Result`` of one function, checked as
    the exercise ``name`` (default: its own name); ``check(path)``: the ``Report`` of a file or
    folder, every exercise or the one ``name`` gives."""
    if callable(target):
        return check_function(find(name or target.__name__), target)
    return check_file(Path(target), name)
