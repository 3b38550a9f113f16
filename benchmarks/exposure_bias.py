"""Does scheduled sampling reduce exposure bias? A rerunnable experiment on the toy corpus.

Trains two models with the same seed and the same number of updates: one with teacher forcing
only, one with scheduled sampling (pure teacher forcing for --ss-warmup updates, then a linear
decay of the teacher-forcing probability to --ss-min). Evaluates both with `tformer eval`'s
report on the toy test split and on its longest quarter (by reference length), and prints the
numbers side by side. Scheduled sampling costs one extra forward pass per update, so its
wall-clock time is higher at equal updates (both times are printed).

    python benchmarks/exposure_bias.py                 # ~2 x 4 minutes on 2 CPU cores
    python benchmarks/exposure_bias.py --steps 400     # a quick look
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from tformer_cli.checkpoint import load_run
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.corpus import load_corpus
from tformer_cli.data.split import Split
from tformer_cli.data.tokenizer import encode
from tformer_cli.device import inference
from tformer_cli.report.evaluation import EvalConfig, EvalReport, evaluate_split
from tformer_cli.training.trainer import Trainer

ROWS: list[tuple[str, Callable[[EvalReport], float | None]]] = [
    ("greedy BLEU", lambda r: r.greedy.bleu),
    ("beam-5 BLEU", lambda r: r.beam.bleu if r.beam else None),
    ("TF accuracy (%)", lambda r: 100 * r.tf.acc if r.tf.acc is not None else None),
    ("TF perplexity", lambda r: r.tf.ppl),
    ("tf_bleu", lambda r: r.exposure_gap.tf_bleu),
    ("bleu_gap (tf_bleu - greedy)", lambda r: r.exposure_gap.bleu_gap),
    ("err_clean (%)", lambda r: _pct(r.accumulation.err_clean)),
    ("err_self (%)", lambda r: _pct(r.accumulation.err_self)),
    ("excess_error_pct", lambda r: r.accumulation.excess_error_pct),
    ("prefix-noise paired drop q=0->0.25 (pts)", lambda r: _pct(r.prefix_noise.paired_drop)),
    ("length decay_ratio", lambda r: r.length_decay.decay_ratio),
]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def train(run_dir: Path, steps: int, seed: int, **ss: object) -> float:
    """Train the default toy model for ``steps`` updates; returns the training seconds."""
    cfg = TrainConfig(max_steps=steps, max_epochs=0, seed=seed, valid_every=250, **ss)  # type: ignore[arg-type]
    start = time.perf_counter()
    quiet = Console(file=io.StringIO())
    Trainer(run_dir, ModelConfig(vocab_size=0), cfg, resume=False, console=quiet).run(quiet=True)
    return time.perf_counter() - start


def report(run_dir: Path, longest: bool) -> EvalReport:
    run = load_run(run_dir)
    test = load_corpus("toy")["test"]
    src, refs = list(test["src"]), list(test["tgt"])
    tgt = encode(run.tokenizer, refs)
    order = sorted(range(len(tgt)), key=lambda i: len(tgt[i]))
    keep = order[3 * len(order) // 4 :] if longest else order
    data = Split(
        encode(run.tokenizer, [src[i] for i in keep]),
        [tgt[i] for i in keep],
        [refs[i] for i in keep],
    )
    with inference(run.device, run.dtype):
        return evaluate_split(run.model, run.tokenizer, data, EvalConfig())[0]


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="updates for each model")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--ss-warmup", type=int, default=300)
    parser.add_argument("--ss-min", type=float, default=0.7)
    parser.add_argument("--out", type=Path, default=Path("runs/exposure-bias"))
    args = parser.parse_args()
    if args.steps <= args.ss_warmup:
        raise SystemExit(
            f"--steps {args.steps} <= --ss-warmup {args.ss_warmup}: scheduled sampling would never"
            " start (pass a smaller --ss-warmup)"
        )
    slope = (1 - args.ss_min) / max(1, args.steps - args.ss_warmup)
    ss = dict(scheduled_sampling="linear", ss_k=slope, ss_min=args.ss_min, ss_warmup=args.ss_warmup)
    runs = {"TF": args.out / "tf", "SS": args.out / "ss"}
    for path in runs.values():
        if (path / "model.pt").exists():
            raise SystemExit(f"{path} exists: remove {args.out} or pass --out")
    seconds = {
        "TF": train(runs["TF"], args.steps, args.seed),
        "SS": train(runs["SS"], args.steps, args.seed, **ss),
    }
    reports = {
        (name, longest): report(path, longest)
        for name, path in runs.items()
        for longest in (False, True)
    }
    print(f"# toy corpus, {args.steps} updates each, seed {args.seed}; SS: linear eps from 1 to"
          f" {args.ss_min} over updates {args.ss_warmup}..{args.steps}, argmax mixing")  # fmt: skip
    print(f"# training time: TF {seconds['TF']:.0f} s, SS {seconds['SS']:.0f} s")
    n_all, n_long = reports[("TF", False)].sizes.sentences, reports[("TF", True)].sizes.sentences
    heads = [
        f"{m} ({part})" for part in (f"test, {n_all}", f"longest {n_long}") for m in ("TF", "SS")
    ]
    print("| metric | " + " | ".join(heads) + " |")
    print("|---|---:|---:|---:|---:|")
    for label, get in ROWS:
        cells = [fmt(get(reports[(m, lng)])) for lng in (False, True) for m in ("TF", "SS")]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
