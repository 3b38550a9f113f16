"""The compiled CPU decode step built with Inductor's ``max_autotune`` (tformer's setting) and
without it, each against the eager step: greedy and beam search at 1 to 300 rows (sentences x
beams), on the random 3+3-layer d=256 model of ``bench_decode.py``. Each build goes to a fresh
cache folder, so its time is printed.

    python benchmarks/bench_step_autotune.py            # both settings, a few minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.decode import aot
from tformer_cli.decode.search import search
from tformer_cli.device import cpu_model, setup
from tformer_cli.model import Transformer

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import cpu_model_of, model_config, random_sources

SETTINGS = ((1, 1), (1, 32), (1, 300), (5, 1), (5, 32))  # (beams, sentences)


def seconds(
    model: Transformer, src: torch.Tensor, cfg: DecodeConfig, mode: str, rounds: int
) -> float:
    """Median time of ``rounds`` searches after one that builds or warms the step."""
    with torch.inference_mode():
        search(model, src, cfg, True, mode)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            search(model, src, cfg, True, mode)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32, help="tokens generated per sentence")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup()
    print(f"# {cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads,"
          f" {time.strftime('%Y-%m-%d')}; {args.length} tokens per sentence")  # fmt: skip
    cfg = model_config()
    model = cpu_model_of(cfg)
    print("\n| max_autotune | beams | sentences | rows | compiled tok/s | eager tok/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    shipped = dict(aot.INDUCTOR)
    for autotune in (True, False):
        aot.INDUCTOR = {**shipped, "max_autotune": autotune}
        with tempfile.TemporaryDirectory() as cache:
            os.environ["XDG_CACHE_HOME"] = cache  # a fresh folder: every step is built here
            for beams, n in SETTINGS:
                src = pad(random_sources(n, cfg.vocab_size, seed=0))
                dc = DecodeConfig(
                    beam=beams, max_len_a=0, max_len_b=args.length, min_len=args.length
                )
                on, off = (seconds(model, src, dc, m, args.rounds) for m in ("on", "off"))
                tok = n * args.length
                cells = [autotune, beams, n, beams * n, f"{tok / on:,.0f}", f"{tok / off:,.0f}"]
                print("| " + " | ".join(map(str, cells)) + f" | {off / on:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
