"""Multi30k de->en at a fixed time budget: the documented `tformer train --preset multi30k`
command, then `tformer eval` on test2016 (greedy and beam 5, sacrebleu BLEU and chrF).

Runs the installed `tformer` command as a subprocess, so what is measured is exactly what a user
types; prints each command, then a table: training wall time, updates, best validation BLEU (and
the checkpoint average's), validation BLEU at 5/10/15/30/60 minutes of training, test BLEU/chrF
greedy and beam 5, and the sacrebleu signatures. Options after ``--`` go to `tformer train`.

    python benchmarks/multi30k.py                                 # 60 minutes of training
    python benchmarks/multi30k.py --minutes 14 --preset multi30k-15min
    python benchmarks/multi30k.py --minutes 14 -- --lr 1e-3 --warmup 100   # a variant
    python benchmarks/multi30k.py --minutes 0.5 --name m30k-smoke  # does it work?
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tformer_cli.checkpoint import load_state
from tformer_cli.device import cpu_model

MARKS = (5, 10, 15, 30, 60)  # minutes of training at which validation BLEU is reported


def tformer_command() -> str:
    """The `tformer` script beside this Python (a venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("tformer")
    found = str(beside) if beside.is_file() else shutil.which("tformer")
    if found is None:
        sys.exit("tformer is not installed: pip install -e . first")
    return found


def run(cmd: list[str], stdout: Path | None = None) -> float:
    """Run ``cmd`` (printed first), its output to ours or to ``stdout``; its wall time in s."""
    print("$", shlex.join(cmd) + (f" > {stdout}" if stdout else ""), flush=True)
    start = time.perf_counter()
    with open(stdout, "w", encoding="utf-8") if stdout else contextlib.nullcontext() as out:
        done = subprocess.run(cmd, stdout=out, check=False)
    if done.returncode:
        sys.exit(f"{cmd[0]} {cmd[1]} failed with exit code {done.returncode}")
    return time.perf_counter() - start


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "log.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def median(values: list[float]) -> float:
    """The middle value (the upper one of an even count); nan for none."""
    return sorted(values)[len(values) // 2] if values else math.nan


def bleu_at(log: list[dict[str, Any]], minutes: float) -> str:
    """The last validation BLEU recorded within ``minutes`` of training, and when it was."""
    done = [r for r in log if "valid_bleu" in r and r["elapsed"] <= minutes * 60 + 1]
    if not done:
        return "n/a"
    r = done[-1]
    return f"{r['valid_bleu']:.2f} (update {r['step']}, {r['elapsed'] / 60:.1f} min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/multi30k", help="Multi30k folder")
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget")
    parser.add_argument("--preset", default="multi30k", help="the recipe (tformer train --preset)")
    parser.add_argument("--precision", default="auto", help="auto, fp32 or bf16")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--name", default=f"multi30k-{time.strftime('%Y%m%d-%H%M%S')}")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra else 0)])

    print(f"# {cpu_model()}, torch {torch.__version__}, Python {platform.python_version()},"
          f" {time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    tformer, run_dir = tformer_command(), args.runs_dir / args.name
    train_s = run(
        [tformer, "train", "--preset", args.preset, "--data", args.data, "--src", "de",
         "--tgt", "en", "--max-minutes", f"{args.minutes:g}", "--precision", args.precision,
         "--runs-dir", str(args.runs_dir), "--name", args.name, *extra]
    )  # fmt: skip
    report_path = run_dir / "eval-test.json"
    eval_s = run(
        [tformer, "eval", "--model", str(run_dir), "--beam", "5", "--json", "--quiet"],
        stdout=report_path,
    )  # fmt: skip

    log = read_log(run_dir)
    valid = [r["valid_bleu"] for r in log if "valid_bleu" in r]
    average = next((r for r in log if "kept" in r), None)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    greedy, beam = report["greedy"], report["beam"]
    elapsed = load_state(run_dir / "last.pt")["state"]["elapsed"]
    timed = [(r["elapsed"], r["tgt_tokens_per_s"]) for r in log if "tgt_tokens_per_s" in r]
    speeds = [tps for _, tps in timed]
    first = median([tps for t, tps in timed if t <= elapsed / 4])
    last = median([tps for t, tps in timed if t > elapsed * 3 / 4])
    rows = [
        ("wall time, train + eval (first command's start to test score)",
         f"{(train_s + eval_s) / 60:.1f} min"),
        ("tformer train wall time", f"{train_s / 60:.1f} min"),
        ("training time (the --max-minutes clock)", f"{elapsed / 60:.1f} min"),
        ("updates", f"{max(r['step'] for r in log)}"),
        ("target tokens/s (median of the log's records)",
         f"{median(speeds):,.0f}"),
        ("target tokens/s, first / last quarter of the training time",
         f"{first:,.0f} / {last:,.0f}"),
        *[(f"valid BLEU after {m} min", bleu_at(log, m)) for m in MARKS if m <= args.minutes + 1],
        ("best valid BLEU (greedy, one checkpoint)", f"{max(valid):.2f}" if valid else "n/a"),
    ]  # fmt: skip
    if average is not None:
        rows.append(
            (f"valid BLEU of the average of {len(average['averaged'])}",
             f"{average['average_bleu']:.2f} (model.pt: {average['kept']})")
        )  # fmt: skip
    rows += [
        ("test2016 BLEU greedy / beam 5", f"{greedy['bleu']:.2f} / {beam['bleu']:.2f}"),
        ("test2016 chrF greedy / beam 5", f"{greedy['chrf']:.2f} / {beam['chrf']:.2f}"),
        ("tformer eval wall time (report: eval-test.json)", f"{eval_s:.0f} s"),
        ("BLEU signature", greedy["bleu_signature"]),
        ("chrF signature", greedy["chrf_signature"]),
    ]
    width = max(len(name) for name, _ in rows)
    options = shlex.join(extra)
    print(f"\nMulti30k de->en, --preset {args.preset} --max-minutes {args.minutes:g} {options}:"
          f" {run_dir}")  # fmt: skip
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
