"""One thread or two for a CPU search of few rows: the measurement behind ``ONE_THREAD_ROWS``
(``tformer_cli/decode/fast/__init__.py: search_threads``).

The benchmark model of ``bench_decode.py`` (3+3 layers, d=256, 4 heads, FFN 1024, vocab 8k,
random weights, prepared as ``tformer translate`` runs it), 64 tokens forced per sentence,
searched with torch's CPU threads set to each count in turn (the one-thread rule switched off),
rounds interleaved; tok/s, medians.

    python benchmarks/bench_threads.py --rows 1 2 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import EOS_ID
from tformer_cli.decode import fast as thread_policy
from tformer_cli.decode.search import search
from tformer_cli.device import cpu_model, setup
from tformer_cli.model import Transformer

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import cpu_model_of, model_config


def sources(n: int, vocab: int, seed: int) -> torch.Tensor:
    """n random sentences of 20 tokens and ``</s>``."""
    rng = random.Random(seed)
    return torch.tensor([[rng.randrange(4, vocab) for _ in range(20)] + [EOS_ID] for _ in range(n)])


def tok_per_s(
    model: Transformer, src: torch.Tensor, beam: int, compile: str, threads: int
) -> float:
    cfg = DecodeConfig(beam=beam, max_len_a=0, max_len_b=64, min_len=64)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    for _ in range(4):
        search(model, src, cfg, compile=compile)
    return 4 * 64 * src.size(0) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compile", nargs="+", default=["on", "off"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    setup()
    thread_policy.ONE_THREAD_ROWS = 0  # the counts asked, not the rule's
    cfg = model_config()
    model = cpu_model_of(cfg)  # as translate runs it
    print(f"# CPU {cpu_model()}, torch {torch.__version__}, {time.strftime('%F')}")
    settings = [(rows, beam) for rows in args.rows for beam in (1, 5) if rows % beam == 0]
    times: dict[tuple, list[float]] = {}
    for _ in range(args.rounds + 1):  # the first round builds and warms up: not counted
        for rows, beam in settings:
            src = sources(rows // beam, cfg.vocab_size, rows)
            for mode in args.compile:
                for threads in args.threads:
                    rate = tok_per_s(model, src, beam, mode, threads)
                    times.setdefault((rows, beam, mode, threads), []).append(rate)
    print("| rows | search | --compile | " + " | ".join(f"{t} thread(s)" for t in args.threads)
          + f" | {args.threads[0]} vs {args.threads[-1]} |")  # fmt: skip
    print("|---:|---|---|" + "---:|" * (len(args.threads) + 1))
    for rows, beam in settings:
        for mode in args.compile:
            rates = [statistics.median(times[(rows, beam, mode, t)][1:]) for t in args.threads]
            cells = " | ".join(f"{r:,.0f}" for r in rates)
            name = "greedy" if beam == 1 else f"beam {beam}"
            print(f"| {rows} | {name} | {mode} | {cells} | {rates[0] / rates[-1]:.2f}x |")


if __name__ == "__main__":
    main()
