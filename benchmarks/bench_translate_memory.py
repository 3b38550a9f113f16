"""Peak memory of ``tformer translate`` on 1,000 and 100,000 lines, measured in one run.

``tformer translate`` reads, translates and writes ``--chunk-size`` lines at a time (2,000 by
default), so its memory should not grow with the input. Each setting runs
``python -m tformer_cli translate --greedy`` as a child process with a file of N lines on its
stdin (the pipe path) and its output to /dev/null, and reads the child's peak resident set size
from ``os.wait4``. Besides the default, each input also runs with a chunk as large as the whole
input: everything read and translated at once, as translate did before it streamed.

The run is a tiny untrained model made here in a temporary folder (BPE tokenizer trained on
the bundled toy corpus, 2+2 layers, d_model 64); the inputs cycle through the toy corpus's
English side; ``--max-len-a 0 --max-len-b 4`` keeps every translation at 4 tokens (an untrained
model never says ``</s>``), so the whole benchmark takes a few minutes on 2 cores. The children
run one torch thread (``TFORMER_THREADS``, unless set) for steadier wall times.

    python benchmarks/bench_translate_memory.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tformer_cli.checkpoint import RunConfig, atomic_torch_save
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.corpus import toy_corpus_dir
from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer
from tformer_cli.device import cpu_model
from tformer_cli.files import atomic_write_text
from tformer_cli.model import Transformer

SIZES = (1_000, 100_000)
DEFAULT_CHUNK = 2000
MAX_LEN = ["--max-len-a", "0", "--max-len-b", "4"]
# One torch thread unless told otherwise: on shared cores, two threads of small ops ran up to
# 5x slower whenever another job was busy, which made the wall times meaningless.
ENV = {**os.environ, "TFORMER_THREADS": os.environ.get("TFORMER_THREADS", "1")}


def make_run(folder: Path, sources: list[str]) -> Path:
    """A complete, untrained run folder: tokenizer.json, config.json and model.pt."""
    tok = train_tokenizer(sources, vocab_size=1000)
    save_tokenizer(tok, folder / "tokenizer.json")
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=64, h=4, d_ff=256, dropout=0.0)
    torch.manual_seed(0)
    RunConfig(cfg, TrainConfig(device="cpu", precision="fp32")).save(folder)
    atomic_torch_save(folder / "model.pt", Transformer(cfg).state_dict())
    return folder


def peak_rss_mb(run: Path, lines: Path, chunk_size: int) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of one ``tformer translate`` child process."""
    cmd = [
        sys.executable, "-m", "tformer_cli", "translate", "-m", str(run), "--greedy",
        "--device", "cpu", "--quiet", "--chunk-size", str(chunk_size), *MAX_LEN,
    ]  # fmt: skip
    start = time.perf_counter()
    with lines.open("rb") as stdin:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()

    toy = (toy_corpus_dir() / "train.tsv").read_text(encoding="utf-8").splitlines()
    sources = [line.split("\t")[0] for line in toy]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-translate-") as tmp:
        run = make_run(Path(tmp) / "run", sources)
        for n in SIZES:
            lines = Path(tmp) / f"in-{n}.txt"
            lines.write_text("".join(f"{sources[i % len(sources)]}\n" for i in range(n)))
            for chunk in (DEFAULT_CHUNK, n):
                rss, seconds = peak_rss_mb(run, lines, chunk)
                print(f"  {n:,} lines, --chunk-size {chunk:,}: {rss:,.0f} MB", file=sys.stderr)
                row = {"lines": n, "chunk_size": chunk, "peak_rss_mb": rss, "seconds": seconds}
                rows.append(row)

    machine = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    machine["threads"] = int(ENV["TFORMER_THREADS"])
    print(
        f"{machine['cpu']}, {machine['cores']} cores, {machine['threads']} torch thread(s),"
        f" torch {machine['torch']}, {machine['date']}"
    )
    print("| lines | --chunk-size | peak RSS | wall time | lines/s |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        how = "default" if r["chunk_size"] == DEFAULT_CHUNK else "all at once"
        print(
            f"| {r['lines']:,} | {r['chunk_size']:,} ({how}) | {r['peak_rss_mb']:,.0f} MB"
            f" | {r['seconds']:.1f} s | {r['lines'] / r['seconds']:,.0f} |"
        )

    def rss(n: int, chunk: int) -> float:
        return next(r["peak_rss_mb"] for r in rows if (r["lines"], r["chunk_size"]) == (n, chunk))

    small, large = SIZES
    streamed = rss(large, DEFAULT_CHUNK) / rss(small, DEFAULT_CHUNK)
    at_once = rss(large, large) / rss(small, small)
    print(
        f"peak RSS at {large:,} lines / at {small:,}: {streamed:.2f}x streaming,"
        f" {at_once:.2f}x all at once"
    )
    if args.json is not None:
        report = json.dumps({"machine": machine, "rows": rows}, indent=2)
        atomic_write_text(args.json, report + "\n")


if __name__ == "__main__":
    main()
