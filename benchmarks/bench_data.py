"""The data pipeline's set-up time and memory as the corpus grows (issue 40).

Makes corpora of 0.3M, 1M and 3M pairs from the Multi30k training files (sentence pairs
joined two by two, ~26 words a side, as WMT's are; written under ``--work``, never into the
repository), then runs ``tformer train --src-file X.de --tgt-file X.en`` on each to the
validation after its first ``--steps`` updates, three times: cache cold, cache warm, and cache
warm under ``--nproc 2``. It prints the wall time of each stage (read, tokenizer training,
encoding, the updates and their validation, timed from the log lines as they appear), pairs
per second of set-up, and the peak memory: ``/usr/bin/time``'s maximum RSS of one process, and
the process tree's summed RSS and RssAnon (``/proc``, sampled every 50 ms), and the tree's RSS
and RssAnon when the set-up ends (the data loaded, before the first update). The run is stopped
once its validation is logged (the test-set BLEU of an untrained model is no part of set-up).

    python benchmarks/bench_data.py --multi30k MULTI30K_FOLDER --sizes 0.3M 1M
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SIZES = {"0.3M": 300_000, "1M": 1_000_000, "3M": 3_000_000}
# the first log line of each stage's end, in order; the set-up ends at "model"
MARKS = (
    ("read", "read the corpus"),
    ("tokenizer", "tokenizer"),
    ("encoding", "tokenized data"),
    ("model", "model "),
    ("updates", "stopped:"),
)


def make_corpus(n: int, folder: Path, multi30k: Path) -> Path:
    """``folder/pairs-<n>.{de,en}``: pair k joins the lines i = k mod m and (i + 1 + k div m)
    mod m of ``multi30k/train.{de,en}``, so that every pair differs up to m(m-1) pairs."""
    stem = folder / f"pairs-{n}"
    if stem.with_suffix(".en").is_file():
        return stem
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        lines = (multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        m = len(lines)
        with open(stem.with_suffix(f".{lang}.tmp"), "w", encoding="utf-8") as f:
            for k in range(n):
                i = k % m
                f.write(f"{lines[i]} {lines[(i + 1 + k // m) % m]}\n")
        os.replace(stem.with_suffix(f".{lang}.tmp"), stem.with_suffix(f".{lang}"))
    return stem


@dataclass
class Memory:
    """Peaks of the process tree's summed VmRSS and RssAnon (kB), sampled from /proc."""

    rss: int = 0
    anon: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def watch(self, root: int) -> None:
        while not self.stop.wait(0.05):
            rss = anon = 0
            for pid in tree(root):
                fields = status(pid)
                rss, anon = rss + fields.get("VmRSS", 0), anon + fields.get("RssAnon", 0)
            self.rss, self.anon = max(self.rss, rss), max(self.anon, anon)


def tree(root: int) -> list[int]:
    """``root`` and its descendants (``/proc/PID/task/TID/children``)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):  # the task ended meanwhile
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def status(pid: int) -> dict[str, int]:
    """The kB figures of ``/proc/PID/status``."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, _, v in (x.partition(":") for x in lines) if "kB" in v}


def train(stem: Path, runs: Path, name: str, steps: int, nproc: int) -> dict[str, float]:
    """One ``tformer train`` to its first validation: seconds at each mark, and the memory."""
    maxrss = runs / f"{name}.maxrss"
    cmd = ["/usr/bin/time", "-f", "%M", "-o", str(maxrss), sys.executable, "-m", "tformer_cli",
           "train", "--src-file", f"{stem}.de", "--tgt-file", f"{stem}.en", "--vocab-size",
           "8000", "--max-steps", str(steps), "--valid-every", str(steps), "--valid-bleu-size",
           "1", "--runs-dir", str(runs), "--name", name, "--nproc", str(nproc)]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    memory = Memory()
    threading.Thread(target=memory.watch, args=(proc.pid,), daemon=True).start()
    seen: dict[str, float] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        for stage, mark in MARKS:
            if stage not in seen and mark in line:
                seen[stage] = time.perf_counter() - start
        if "model" in seen and "setup_rss_mb" not in seen:  # the data loaded, no update yet
            now = [status(pid) for pid in tree(proc.pid)]
            seen["setup_rss_mb"] = sum(f.get("VmRSS", 0) for f in now) / 1024
            seen["setup_anon_mb"] = sum(f.get("RssAnon", 0) for f in now) / 1024
        if "stopped:" in line:
            break
    memory.stop.set()
    for pid in tree(proc.pid)[1:]:  # the test BLEU of an untrained model is not set-up
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()  # /usr/bin/time reports its child's peak
    if "updates" not in seen:
        raise SystemExit(f"{name}: the run ended before its validation: {cmd}")
    seen["maxrss_mb"] = int(maxrss.read_text().split()[-1]) / 1024 if maxrss.exists() else 0
    seen["tree_rss_mb"], seen["tree_anon_mb"] = memory.rss / 1024, memory.anon / 1024
    return seen


def row(label: str, pairs: int, t: dict[str, float]) -> str:
    """One line of the table: each stage's own seconds (a stage not logged: -)."""
    cells, last = [], 0.0
    for stage, _ in MARKS:
        if stage in t:
            cells.append(f"{t[stage] - last:9.1f}")
            last = t[stage]
        else:
            cells.append(f"{'-':>9}")
    rate = pairs / t["model"]
    memory = f"{t['maxrss_mb']:8.0f} {t['tree_rss_mb']:8.0f} {t['tree_anon_mb']:8.0f}"
    memory += f" {t['setup_rss_mb']:8.0f} {t['setup_anon_mb']:8.0f}"
    setup = f"{t['model']:7.1f} | {rate:9,.0f}"
    return f"| {label:<14} | {pairs:>9,} | {' | '.join(cells)} | {setup} | {memory} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=10, help="updates before the validation")
    parser.add_argument("--multi30k", type=Path, required=True, help="folder of train.de/en")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tformer-bench-data"))
    parser.add_argument("--no-nproc", action="store_true", help="skip the --nproc 2 run")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    stages = " | ".join(f"{s:>9}" for s, _ in MARKS)
    memory = " maxRSS  treeRSS treeAnon setupRSS setupAnon (MB)"
    print(f"| run            |     pairs | {stages} |  set-up |   pairs/s | {memory} |")
    for size in args.sizes:
        pairs = SIZES[size]
        stem = make_corpus(pairs, args.work, args.multi30k)
        runs = args.work / f"runs-{pairs}"
        shutil.rmtree(runs, ignore_errors=True)
        runs.mkdir(parents=True)
        print(row(f"{size} cold", pairs, train(stem, runs, "cold", args.steps, 1)), flush=True)
        print(row(f"{size} warm", pairs, train(stem, runs, "warm", args.steps, 1)), flush=True)
        if not args.no_nproc:
            t = train(stem, runs, "nproc2", args.steps, 2)
            print(row(f"{size} --nproc 2", pairs, t), flush=True)
        shutil.rmtree(runs, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
