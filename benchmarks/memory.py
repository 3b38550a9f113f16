"""Peak memory of ``tformer train`` by phase, for the toy and for Multi30k's 15-minute recipe.

Each recipe trains in a child process of its own (this script again, with ``--child``), as
``tformer train`` does (``tformer_cli.setup()`` first, then the command's own steps), with a
thread that reads ``/proc/self/status`` every 50 ms. The run's methods are wrapped here to name
its phases: set-up (imports, model, optimizer), data (corpus, tokenizer, encoding: the data
cache), the first updates, steady training, validation (teacher-forced loss and greedy
decoding), the test split's score. For each phase it prints the peak resident set (``VmHWM``,
reset at each phase's start through ``/proc/self/clear_refs``, so exact), the peak of its
anonymous part (``RssAnon``: the heap, tensors, allocator caches) and of its file-backed part
(``RssFile``: mapped libraries and data files, shared with other processes), sampled, and
glibc's heap at the phase's end (allocated, and free: kept for reuse or holes); then the
whole run's, whose peak RSS is the ``peak memory`` that ``tformer train`` reports (its
``ru_maxrss``; here reset with ``VmHWM``, so the run's own line is not). Linux only.

    python benchmarks/memory.py                                   # toy, then Multi30k (14 min)
    python benchmarks/memory.py --recipe multi30k-15min --minutes 3 --data path/to/multi30k
    python benchmarks/memory.py --recipe toy --max-steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
FIRST_UPDATES = 25  # the updates counted as "first updates": allocator and kernel warm-up


def status() -> dict[str, float]:
    """``FIELDS`` of ``/proc/self/status``, in MiB."""
    text = Path("/proc/self/status").read_text(encoding="ascii")
    return {k: int(re.search(rf"^{k}:\s+(\d+)", text, re.M).group(1)) / 1024 for k in FIELDS}


def heap() -> tuple[float, float]:
    """glibc's heap now, in MiB: (allocated, free: kept for reuse); NaNs off glibc."""
    from tformer_cli.device import MallInfo2, glibc

    libc = glibc()
    if libc is None:
        return math.nan, math.nan
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def reset_peak() -> None:
    """Set ``VmHWM`` back to the resident set now (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


@dataclass
class Phase:
    rss: float = 0.0  # peak VmRSS (VmHWM since the phase's start)
    anon: float = 0.0  # peak RssAnon, sampled
    file: float = 0.0  # peak RssFile, sampled
    end: float = 0.0  # VmRSS when the phase last ended
    used: float = 0.0  # glibc's heap then: allocated
    free: float = 0.0  # and free (kept for reuse, or holes no block fits)
    seconds: float = 0.0


@dataclass
class PhaseProbe:
    """Charges the memory a thread samples to the phase the process is in (``phase``)."""

    every: float = 0.05
    phases: dict[str, Phase] = field(default_factory=dict)
    now: str = "set-up"

    def __post_init__(self) -> None:
        self.lock, self.since, self.stop = threading.Lock(), time.perf_counter(), False
        reset_peak()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.stop:
            with self.lock:
                self._charge(status())
            time.sleep(self.every)

    def _charge(self, s: dict[str, float]) -> Phase:
        p = self.phases.setdefault(self.now, Phase())
        p.rss, p.anon, p.file = (
            max(p.rss, s["VmHWM"]),
            max(p.anon, s["RssAnon"]),
            max(p.file, s["RssFile"]),
        )
        return p

    def switch(self, name: str) -> str:
        """Close the current phase (its peak and end) and enter ``name``; the one left."""
        with self.lock:
            s, t = status(), time.perf_counter()
            p = self._charge(s)
            p.end, p.seconds = s["VmRSS"], p.seconds + t - self.since
            p.used, p.free = heap()
            left, self.now, self.since = self.now, name, t
            reset_peak()
        return left

    @contextlib.contextmanager
    def phase(self, name: str, then: str | None = None) -> Iterator[None]:
        """In phase ``name``, then back in the one before (or in ``then``: a phase re-entered
        starts at the resident set of the moment, so set-up is never re-entered)."""
        left = self.switch(name)
        try:
            yield
        finally:
            self.switch(then or left)

    def report(self) -> str:
        self.switch("end")
        self.stop = True
        head = (f"{'peak RSS':>9} {'anon':>7} {'file':>7} {'RSS after':>9} {'heap used':>9}"
                f" {'free':>7} {'s':>6}")  # fmt: skip
        rows = [f"  {'phase':<14} {head}"]
        for name, p in self.phases.items():
            if name not in ("after", "end"):
                rows.append(f"  {name:<14} {p.rss:9,.0f} {p.anon:7,.0f} {p.file:7,.0f}"
                            f" {p.end:9,.0f} {p.used:9,.0f} {p.free:7,.0f}"
                            f" {p.seconds:6.0f}")  # fmt: skip
        shown = [p for name, p in self.phases.items() if name not in ("after", "end")]
        peaks = [max(getattr(p, k) for p in shown) for k in ("rss", "anon", "file")]
        rows.append(f"  {'whole run':<14} {peaks[0]:9,.0f} {peaks[1]:7,.0f} {peaks[2]:7,.0f}")
        return "\n".join(rows)


def wrap(
    owner: Any, name: str, phase: Callable[..., str | None], probe: PhaseProbe, then: str = ""
) -> None:
    """Run ``owner.name`` in the phase ``phase(*args)`` names (None: the phase it is called
    in), then go back to the phase it was called in, or to ``then``."""
    method = getattr(owner, name)

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        named = phase(*args, **kwargs)
        with probe.phase(named, then or None) if named else contextlib.nullcontext():
            return method(*args, **kwargs)

    setattr(owner, name, wrapped)


def train(args: argparse.Namespace) -> None:
    """Train ``args.child`` (a recipe) in this process, its phases charged by a probe."""
    probe = PhaseProbe()
    import tformer_cli
    from tformer_cli.api.training import run_training, train_settings, training_log
    from tformer_cli.training import bookkeeping, trainer

    tformer_cli.setup()
    steps = [0]

    def step_phase(*_: Any) -> str:
        steps[0] += 1
        return "first updates" if steps[0] <= FIRST_UPDATES else "training"

    wrap(bookkeeping, "load_data", lambda *_: "data", probe)
    wrap(trainer.Trainer, "run", lambda *_, **__: "training", probe, then="after")
    wrap(trainer.Trainer, "_step", step_phase, probe)
    wrap(trainer.Trainer, "validate", lambda *_: "validation", probe)
    wrap(trainer.Trainer, "greedy_bleu", lambda _, split, *__: split == "test" and "test", probe)
    given: dict[str, Any] = {"max_minutes": args.minutes} if args.minutes else {}
    given |= {"max_steps": args.max_steps} if args.max_steps else {}
    given |= {"data": args.data} if args.data and args.child != "toy" else {}
    log = training_log(quiet=True)
    with tempfile.TemporaryDirectory() as runs:
        model_cfg, train_cfg, run_dir = train_settings(
            given, preset=args.child, resume=None, name="memory", runs_dir=Path(runs), log=log
        )
        if args.cache:  # the data cache of an earlier run: no corpus read, no tokenizer trained
            (Path(runs) / ".cache").symlink_to(Path(args.cache).resolve())
        run_training(run_dir, model_cfg, train_cfg, resume=False, log=log, quiet=True)
        print(f"{args.child}: {probe.report()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=("toy", "multi30k-15min", "both"), default="both")
    parser.add_argument("--data", default="../shared/data/multi30k", help="Multi30k folder")
    parser.add_argument("--minutes", type=float, default=0.0, help="Multi30k: 0 = the recipe's")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N updates (0: no)")
    parser.add_argument("--cache", help="a data cache folder (runs/.cache) to read, not build")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train(args)
        return
    import torch

    from tformer_cli.device import cpu_model

    print(f"# {cpu_model()}, torch {torch.__version__}, Python {platform.python_version()},"
          f" {time.strftime('%Y-%m-%d %H:%M')}; MiB", flush=True)  # fmt: skip
    recipes = ("toy", "multi30k-15min") if args.recipe == "both" else (args.recipe,)
    for recipe in recipes:
        cmd = [sys.executable, __file__, "--child", recipe, "--data", args.data,
               "--max-steps", str(args.max_steps)]  # fmt: skip
        cmd += ["--minutes", str(args.minutes)] if recipe != "toy" else []
        cmd += ["--cache", args.cache] if args.cache else []
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
