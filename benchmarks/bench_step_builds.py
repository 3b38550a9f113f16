"""The two builds of the compiled CPU decode step against the eager step, at 1 to 300 rows
(sentences x beams): the build for few rows (Inductor's own C++ matrix kernels, tuned by
``max_autotune`` at the export's few rows) and the build for many (MKL's kernels, as the eager
step calls them, and attention as the explicit ops): the measurement behind ``FEW_ROWS``
(``tformer_cli/decode/fast/cpu.py``). The random 3+3-layer d=256 model of ``bench_decode.py``,
tokens forced, rounds interleaved, medians; the builds go to a fresh cache folder, so their
times are printed.

    python benchmarks/bench_step_builds.py            # a few minutes
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
from tformer_cli.decode.fast import cpu
from tformer_cli.decode.search import search
from tformer_cli.device import cpu_model, setup
from tformer_cli.model import Transformer

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import cpu_model_of, model_config, random_sources

SETTINGS = ((1, 1), (1, 2), (1, 5), (1, 8), (1, 16), (1, 32), (1, 300), (5, 1), (5, 32))
BUILDS = {"few": 10**9, "many": 0, "eager": None}  # FEW_ROWS that forces each build


def tok_per_s(model: Transformer, src: torch.Tensor, cfg: DecodeConfig, build: str) -> float:
    few_rows = BUILDS[build]
    cpu.FEW_ROWS = few_rows if few_rows is not None else cpu.FEW_ROWS
    start = time.perf_counter()
    search(model, src, cfg, True, "off" if few_rows is None else "on")
    return src.size(0) * cfg.max_len_b / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=48, help="tokens generated per sentence")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup()
    print(f"# {cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads,"
          f" {time.strftime('%Y-%m-%d')}; {args.length} tokens per sentence")  # fmt: skip
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()  # a fresh folder: every step built here
    model, shipped, times = cpu_model_of(model_config()), cpu.FEW_ROWS, {}
    with torch.inference_mode():
        for r in range(args.rounds + 1):  # the first round builds and warms up
            for beams, n in SETTINGS:
                src = pad(random_sources(n, 8000, seed=0))
                cfg = DecodeConfig(beam=beams, max_len_a=0, max_len_b=args.length,
                                   min_len=args.length)  # fmt: skip
                for build in BUILDS:
                    tok = tok_per_s(model, src, cfg, build)
                    if r:
                        times.setdefault((beams, n, build), []).append(tok)
    cpu.FEW_ROWS = shipped
    print(f"\n| search | rows | few rows tok/s | many rows tok/s | eager tok/s | few vs many |"
          f" chosen (FEW_ROWS {shipped}) vs eager |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for beams, n in SETTINGS:
        few, many, eager = (statistics.median(times[(beams, n, b)]) for b in BUILDS)
        chosen = few if beams * n <= shipped else many
        name = "greedy" if beams == 1 else f"beam {beams}"
        cells = f"{name}, {n} sentences | {beams * n} | {few:,.0f} | {many:,.0f} | {eager:,.0f}"
        print(f"| {cells} | {few / many:.2f}x | {chosen / eager:.2f}x |")


if __name__ == "__main__":
    main()
