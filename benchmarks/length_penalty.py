"""Choose beam search's length penalty on validation: BLEU of each run for each alpha.

Scores every run with beam search (`tformer eval`'s, stored results reused where current) for
each GNMT alpha, on the validation split by default, and prints the table with the mean over
the runs and the alpha of the best mean: the value for a recipe's `beam_alpha`. Test data play
no part unless --split test is asked for.

    python benchmarks/length_penalty.py runs/A runs/B --alphas 0.6 1.0 1.2 1.5
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch
from rich.console import Console

from tformer_cli.config import DecodeConfig
from tformer_cli.device import cpu_model
from tformer_cli.errors import TformerError
from tformer_cli.report.compare import run_names, score_run
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EvalRequest


def sweep(
    runs: list[Path], alphas: list[float], split: str, beam: int, threads: int
) -> dict[str, dict[float, float]]:
    """Beam BLEU of each run (by name) at each alpha."""
    err = Console(stderr=True)
    table: dict[str, dict[float, float]] = {}
    for name, run in zip(run_names(runs), runs, strict=True):
        for alpha in alphas:
            cfg = EvalConfig(DecodeConfig(beam=beam, alpha=alpha))
            asked = EvalRequest(split=split, config=cfg, device="cpu", threads=threads)
            _, stored = score_run(run, asked, keep=True, err=err, quiet=True)
            table.setdefault(name, {})[alpha] = stored.report["beam"]["bleu"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="Run folders.")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0, 1.2, 1.5])
    parser.add_argument("--split", default="valid", help="valid (default), test, train or all.")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: as tformer eval chooses.")
    parser.add_argument("--json", type=Path, help="Write the table as JSON here.")
    args = parser.parse_args()
    if args.beam < 2:
        parser.error("--beam must be at least 2: the penalty only changes beam search")
    try:
        table = sweep(args.runs, args.alphas, args.split, args.beam, args.threads)
    except TformerError as e:  # a missing or broken run, a negative alpha: one line
        parser.exit(1, f"Error: {e}\n")
    mean = {a: statistics.mean(row[a] for row in table.values()) for a in args.alphas}
    best = max(args.alphas, key=lambda a: mean[a])
    print(f"# {cpu_model()}, torch {torch.__version__}, {datetime.date.today()}")
    print(f"# {args.split} BLEU, beam {args.beam}, by GNMT length penalty alpha")
    print("| run | " + " | ".join(f"{a:g}" for a in args.alphas) + " |")
    print("|---|" + "---:|" * len(args.alphas))
    for name, row in [*table.items(), ("mean", mean)]:
        cells = [f"**{row[a]:.2f}**" if a == max(row, key=row.get) else f"{row[a]:.2f}"
                 for a in args.alphas]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"# best mean: alpha {best:g} ({mean[best]:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"split": args.split, "beam": args.beam, "bleu": table,
                                         "mean": mean, "best": best}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
