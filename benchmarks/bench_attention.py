"""Fused or explicit attention in a CPU decoding step: the measurement behind ``EXPLICIT_ROWS``
(``tformer_cli/model/fast.py``).

First the attention alone, at the shapes a decoding step of the benchmark model (4 heads,
d_k 64) gives it: self-attention of one query a row over a ``span`` of a KV buffer of 128 slots,
and cross-attention of a sentence's beams over 25 source positions; microseconds a call,
``F.scaled_dot_product_attention`` against ``softmax(Q K^T / sqrt(d_k) + M) V``. Then the eager
search on the model of ``bench_decode.py`` (random weights, 64 tokens forced), with the explicit
path at and above ``EXPLICIT_ROWS`` rows (as shipped) and switched off, rounds interleaved;
tok/s, medians.

    python benchmarks/bench_attention.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.decode.search import search
from tformer_cli.device import cpu_model, setup
from tformer_cli.model import attention as attention_module
from tformer_cli.model import fast as model_fast

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import cpu_model_of, model_config, random_sources

SHAPES = ((1, 1, 32), (5, 1, 32), (32, 1, 32), (64, 1, 16), (64, 1, 64), (160, 1, 16))
SHAPES += ((160, 1, 64), (300, 1, 32), (1, 5, 25), (32, 5, 25))  # (rows, queries, keys)
SEARCHES = ((1, 32), (5, 8), (5, 32), (1, 300))  # (beams, sentences)


def microseconds(fn: Callable[..., object], *args: object, calls: int = 300) -> float:
    for _ in range(10):
        fn(*args)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def kernels() -> None:
    print("\n| rows | queries a row | keys | fused us | explicit us | explicit vs fused |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rows, queries, keys in SHAPES:
        buffer = torch.randn(2, rows, 4, 128, 64)  # K, V slots of a cache, as the step reads
        k, v = buffer.narrow(3, 0, keys).unbind(0)  # (rows, h, keys, d_k)
        q = torch.randn(rows, 4, queries, 64)
        mask = torch.zeros(queries, keys)
        mask[:, keys // 2 :] = float("-inf")  # half the slots not yet filled
        with torch.no_grad():
            fused = microseconds(F.scaled_dot_product_attention, q, k, v, mask)
            explicit = microseconds(attention_module.attention, q, k, v, mask)
        cells = f"{rows} | {queries} | {keys} | {fused:.0f} | {explicit:.0f}"
        print(f"| {cells} | {fused / explicit:.2f}x |")


def searches(rounds: int) -> None:
    cfg = model_config()
    model = cpu_model_of(cfg)
    shipped, times = model_fast.EXPLICIT_ROWS, {}
    for _ in range(rounds):
        for beams, n in SEARCHES:
            src = pad(random_sources(n, cfg.vocab_size, seed=0))
            dc = DecodeConfig(beam=beams, max_len_a=0, max_len_b=64, min_len=64)
            for rows in (shipped, 10**9):
                model_fast.EXPLICIT_ROWS = rows
                start = time.perf_counter()
                search(model, src, dc, compile="off")
                times.setdefault((beams, n, rows), []).append(time.perf_counter() - start)
    model_fast.EXPLICIT_ROWS = shipped
    print(f"\n| search | rows | explicit from {shipped} rows | fused only | explicit vs fused |")
    print("|---|---:|---:|---:|---:|")
    for beams, n in SEARCHES:
        on, off = (n * 64 / statistics.median(times[(beams, n, r)]) for r in (shipped, 10**9))
        name = "greedy" if beams == 1 else f"beam {beams}"
        print(f"| {name}, {n} sentences | {beams * n} | {on:,.0f} | {off:,.0f} | {on / off:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    setup()
    print(
        f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__},"
        f" {time.strftime('%Y-%m-%d')}"
    )
    kernels()
    searches(args.rounds)


if __name__ == "__main__":
    main()
