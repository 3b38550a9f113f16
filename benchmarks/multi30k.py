"""Multi30k de->en at a fixed time budget: the documented `tformer train --preset multi30k`
command, then `tformer eval` on test2016 (greedy and beam 5, sacrebleu BLEU and chrF).

Runs the installed `tformer` command as a subprocess, so what is measured is exactly what a user
types; prints each command, then a table: training wall time, updates, best validation BLEU (and
the checkpoint average's), validation BLEU at 5/10/15/30/60 minutes of training, test BLEU/chrF
greedy and beam 5, and the sacrebleu signatures. Then the speedrun record: the machine (CPU,
cores, its bf16 flags), torch, the commit, the budget, the seed, updates, target tokens, every
validation, with ``--target B`` when validation BLEU first reached B, and the row for the record
table of docs/results.md; ``--json FILE`` writes all of it. Options after ``--`` go to
`tformer train`.

    python benchmarks/multi30k.py                                 # 60 minutes of training
    python benchmarks/multi30k.py --minutes 14 --preset multi30k-15min
    python benchmarks/multi30k.py --minutes 14 --preset multi30k-15min --seed 7 --target 37 \
        --json speedrun.json                                      # a speedrun record
    python benchmarks/multi30k.py --minutes 14 -- --lr 1e-3 --warmup 100   # a variant
    python benchmarks/multi30k.py --minutes 0.5 --name m30k-smoke  # does it work?
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import tformer_cli
from tformer_cli.checkpoint import load_state
from tformer_cli.device import cpu_model

MARKS = (5, 10, 15, 30, 60)  # minutes of training at which validation BLEU is reported
BF16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}  # /proc/cpuinfo: name
Rows = list[tuple[str, str]]


# ---------------------------------------------------------------------------- running tformer
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


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and those after ``--`` (for `tformer train`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/multi30k", help="Multi30k folder")
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget")
    parser.add_argument("--preset", default="multi30k", help="the recipe (tformer train --preset)")
    parser.add_argument("--precision", default="auto", help="auto, fp32 or bf16")
    parser.add_argument("--seed", type=int, help="tformer train --seed (default: the recipe's)")
    parser.add_argument("--target", type=float, help="report when validation BLEU first >= this")
    parser.add_argument("--json", type=Path, help="write the speedrun record to this file")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--name", default=f"multi30k-{time.strftime('%Y%m%d-%H%M%S')}")
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra else 0)])
    if args.json is not None and not args.json.parent.is_dir():  # found out before training
        parser.error(f"--json {args.json}: no folder {args.json.parent}")
    return args, extra


def train_command(tformer: str, args: argparse.Namespace, extra: list[str]) -> list[str]:
    seed = [] if args.seed is None else ["--seed", str(args.seed)]
    return [
        tformer, "train", "--preset", args.preset, "--data", args.data, "--src", "de",
        "--tgt", "en", "--max-minutes", f"{args.minutes:g}", "--precision", args.precision,
        *seed, "--runs-dir", str(args.runs_dir), "--name", args.name, *extra,
    ]  # fmt: skip


# ---------------------------------------------------------------------------- the machine
def cpu_flags(cpuinfo: str) -> list[str]:
    """The bf16 matrix flags (AMX-BF16, AVX512-BF16) of a ``/proc/cpuinfo`` text's first
    ``flags`` line; none without one."""
    line = next((s for s in cpuinfo.splitlines() if s.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return [name for flag, name in BF16_FLAGS.items() if flag in have]


def machine() -> dict[str, Any]:
    """The CPU, the cores this process may run on, its bf16 flags, torch and Python."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        cpuinfo = ""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity else os.cpu_count()
    return {"cpu": cpu_model(), "cores": cores, "bf16_flags": cpu_flags(cpuinfo),
            "torch": torch.__version__, "python": platform.python_version()}  # fmt: skip


def machine_name(m: dict[str, Any]) -> str:
    flags = ", ".join(m["bf16_flags"]) or "no AMX-BF16 or AVX512-BF16"
    return f"{m['cpu']}, {m['cores']} cores, {flags}"


def git_commit(folder: Path) -> str | None:
    """The commit checked out at ``folder`` (short; ``-dirty`` with tracked files changed),
    None outside a git checkout."""
    try:
        head, changed = (
            subprocess.run(["git", "-C", str(folder), *cmd], capture_output=True, text=True)
            for cmd in (["rev-parse", "--short", "HEAD"], ["status", "--porcelain", "-uno"])
        )
    except OSError:  # no git
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


# ---------------------------------------------------------------------------- the record
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


def validations(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each validation in the log: its update, the training seconds of the weights it scored
    (the --max-minutes clock: earlier validations in, set-up out) and its greedy BLEU."""
    return [
        {"update": r["step"], "elapsed_s": r["elapsed"], "bleu": r["valid_bleu"]}
        for r in log
        if "valid_bleu" in r
    ]


def first_reach(points: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The first validation with BLEU >= ``target``. The target was crossed after the
    validation before it (update 0 for the first), so the resolution is the updates and
    seconds between the two. Not reached: the best BLEU of the validations (None: none)."""
    before = {"update": 0, "elapsed_s": 0.0, "bleu": None}
    for p in points:
        if p["bleu"] >= target:
            return {"target": target, "reached": True, **p, "before": before,
                    "resolution_updates": p["update"] - before["update"],
                    "resolution_s": p["elapsed_s"] - before["elapsed_s"]}  # fmt: skip
        before = p
    best = max((p["bleu"] for p in points), default=None)
    return {"target": target, "reached": False, "best": best, "validations": len(points)}


def test_scores(report: dict[str, Any] | None) -> dict[str, Any]:
    """test2016 BLEU and chrF greedy and beam 5 (None: not in the report) and the sacrebleu
    signatures, from the report of `tformer eval --json`."""
    found = {name: (report or {}).get(name) for name in ("greedy", "beam")}
    scores = {
        name: None if s is None else {"beam": s["beam"], "bleu": s["bleu"], "chrf": s["chrf"]}
        for name, s in found.items()
    }
    signed = found["greedy"] or found["beam"] or {}
    return {**scores, "bleu_signature": signed.get("bleu_signature"),
            "chrf_signature": signed.get("chrf_signature")}  # fmt: skip


def run_record(
    log: list[dict[str, Any]],
    report: dict[str, Any] | None,
    state: dict[str, Any],
    config: dict[str, Any],
    target: float | None = None,
) -> dict[str, Any]:
    """What the run did, from its log.jsonl records, last.pt's state, config.json and the eval
    report; what one of them lacks is None."""
    points = validations(log)
    return {
        "seed": config.get("train", {}).get("seed"),
        "updates": max((r["step"] for r in log), default=0),
        "target_tokens": state.get("tgt_tokens"),
        "training_s": state.get("elapsed"),
        "validations": points,
        "first_reach": None if target is None else first_reach(points, target),
        "test2016": test_scores(report),
    }


# ---------------------------------------------------------------------------- printing
def number(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def beam5(record: dict[str, Any], metric: str) -> str:
    search = record["test2016"]["beam"]
    return number(None if search is None else search[metric])


def recipe(record: dict[str, Any]) -> str:
    return shlex.join([record["preset"], *record["options"]])


def markdown_row(record: dict[str, Any]) -> str:
    """The record table's row: date, commit, machine, recipe, budget, seed, updates, test2016
    beam 5 BLEU and chrF."""
    cells = [
        record["date"], f"`{record['commit']}`" if record["commit"] else "n/a",
        machine_name(record["machine"]), f"`{recipe(record)}`",
        f"{record['budget_minutes']:g} min", number(record["seed"], "d"),
        f"{record['updates']:,}", beam5(record, "bleu"), beam5(record, "chrf"),
    ]  # fmt: skip
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def at(point: dict[str, Any]) -> str:
    """A validation: its update, training minutes and BLEU."""
    return (
        f"update {point['update']:,}, {point['elapsed_s'] / 60:.1f} min, BLEU {point['bleu']:.2f}"
    )


def reach_text(reach: dict[str, Any]) -> str:
    if not reach["reached"]:
        n = reach["validations"]
        return f"not reached (best {number(reach['best'])} in {n} validation{'s' * (n != 1)})"
    before = reach["before"]
    return (
        f"{at(reach)}; resolution {reach['resolution_updates']:,} updates"
        f" ({reach['resolution_s'] / 60:.1f} min): after"
        f" {'the start' if before['bleu'] is None else at(before)}"
    )


def record_rows(record: dict[str, Any]) -> Rows:
    """The speedrun record, a row for each of its numbers, every validation among them."""
    test, tokens, reach = record["test2016"], record["target_tokens"], record["first_reach"]
    both = [test["greedy"], test["beam"]]
    reached = (
        [] if reach is None else [(f"valid BLEU >= {reach['target']:g} first", reach_text(reach))]
    )
    return [
        ("date, commit", f"{record['date']}, {record['commit'] or 'n/a'}"),
        ("machine", machine_name(record["machine"])),
        ("torch", record["machine"]["torch"]),
        ("budget, seed", f"{record['budget_minutes']:g} min, seed {number(record['seed'], 'd')}"),
        ("updates, target tokens seen", f"{record['updates']:,}, {number(tokens, ',d')}"),
        *[(f"validation {i}", at(p)) for i, p in enumerate(record["validations"], 1)],
        *reached,
        ("test2016 BLEU greedy / beam 5", " / ".join(number(s and s["bleu"]) for s in both)),
        ("test2016 chrF greedy / beam 5", " / ".join(number(s and s["chrf"]) for s in both)),
        ("BLEU signature", test["bleu_signature"] or "n/a"),
        ("chrF signature", test["chrf_signature"] or "n/a"),
    ]  # fmt: skip


def run_rows(
    log: list[dict[str, Any]], elapsed: float, wall: dict[str, float], minutes: float
) -> Rows:
    """The run's times, speed and validation BLEU at the marks, from its log.jsonl records."""
    valid = [r["valid_bleu"] for r in log if "valid_bleu" in r]
    average = next((r for r in log if "kept" in r), None)
    timed = [(r["elapsed"], r["tgt_tokens_per_s"]) for r in log if "tgt_tokens_per_s" in r]
    first = median([tps for t, tps in timed if t <= elapsed / 4])
    last = median([tps for t, tps in timed if t > elapsed * 3 / 4])
    rows = [
        ("wall time, train + eval (first command's start to test score)",
         f"{(wall['train'] + wall['eval']) / 60:.1f} min"),
        ("tformer train wall time", f"{wall['train'] / 60:.1f} min"),
        ("training time (the --max-minutes clock)", f"{elapsed / 60:.1f} min"),
        ("target tokens/s (median of the log's records)",
         f"{median([tps for _, tps in timed]):,.0f}"),
        ("target tokens/s, first / last quarter of the training time",
         f"{first:,.0f} / {last:,.0f}"),
        *[(f"valid BLEU after {m} min", bleu_at(log, m)) for m in MARKS if m <= minutes + 1],
        ("best valid BLEU (greedy, one checkpoint)", f"{max(valid):.2f}" if valid else "n/a"),
    ]  # fmt: skip
    if average is not None:
        rows.append(
            (f"valid BLEU of the average of {len(average['averaged'])}",
             f"{average['average_bleu']:.2f} (model.pt: {average['kept']})")
        )  # fmt: skip
    return [*rows, ("tformer eval wall time (report: eval-test.json)", f"{wall['eval']:.0f} s")]


def print_rows(title: str, rows: Rows) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


# ---------------------------------------------------------------------------- main
def main() -> None:
    args, extra = parse(sys.argv[1:])
    date, here = time.strftime("%Y-%m-%d"), machine()
    commit = git_commit(Path(tformer_cli.__file__).parent)  # of the code about to train
    print(f"# {machine_name(here)}, torch {here['torch']}, Python {here['python']},"
          f" {time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    tformer, run_dir = tformer_command(), args.runs_dir / args.name
    train_s = run(train_command(tformer, args, extra))
    report_path = run_dir / "eval-test.json"
    eval_s = run(
        [tformer, "eval", "--model", str(run_dir), "--beam", "5", "--json", "--quiet"],
        stdout=report_path,
    )  # fmt: skip

    log, state = read_log(run_dir), load_state(run_dir / "last.pt")["state"]
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    report = json.loads(report_path.read_text(encoding="utf-8"))
    record = {
        "date": date, "commit": commit,
        "machine": here, "command": shlex.join(["python", "benchmarks/multi30k.py", *sys.argv[1:]]),
        "run": str(run_dir), "preset": args.preset, "options": extra,
        "budget_minutes": args.minutes, "wall_s": {"train": train_s, "eval": eval_s},
        **run_record(log, report, state, config, args.target),
    }  # fmt: skip
    record["markdown_row"] = markdown_row(record)
    print_rows(
        f"Multi30k de->en, --preset {args.preset} --max-minutes {args.minutes:g}"
        f" {shlex.join(extra)}: {run_dir}",
        run_rows(log, state["elapsed"], record["wall_s"], args.minutes),
    )
    print_rows("Speedrun record:", record_rows(record))
    print(
        f"\nThe record table's row (docs/results.md, Speedrun records):\n{record['markdown_row']}"
    )
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            sys.exit(f"cannot write {args.json}: {e.strerror}")
        print(f"record: {args.json}")


if __name__ == "__main__":
    main()
