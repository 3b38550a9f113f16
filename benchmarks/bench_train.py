"""Training throughput: target tokens/s and model-FLOPs utilisation (MFU), measured in one run.

The MFU denominator is a matmul ceiling measured in the same run (best of several large
square matmuls per precision), so the ratio is comparable across noisy machines. With the
`bench` extra installed, Hugging Face `MarianMTModel` at equal dimensions is trained on the
same batches with the same loss and optimizer, interleaved with ours round by round.

    python benchmarks/bench_train.py                 # toy default + 3+3 d=256 vocab 8k
    python benchmarks/bench_train.py --steps 20 --rounds 5
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.batching import Batch, make_batch
from tformer_cli.device import autocast, cpu_has_fast_bf16, setup_threads
from tformer_cli.model import Transformer
from tformer_cli.train.loss import label_smoothed_loss
from tformer_cli.train.trainer import make_optimizer, train_step

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def matmul_ceiling(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of an (n x n) @ (n x n) matmul."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def model_flops(cfg: ModelConfig, batches: list[Batch]) -> float:
    """Training FLOPs of one pass over ``batches``: 3x the forward matmul FLOPs (forward +
    backward), counted on real (non-pad) tokens; attention over the padded lengths S, T."""
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    total = 0.0
    for b in batches:
        S, T = b.src.size(1), b.tgt_in.size(1)
        n_src, n_tgt = int((b.src != 0).sum()), b.n_tgt_tokens
        enc = n_src * cfg.n_encoder_layers * 2 * (4 * d * d + 2 * d * f + 2 * S * d)
        dec = n_tgt * cfg.n_decoder_layers * 2 * (6 * d * d + 2 * d * f + 2 * T * d + 2 * S * d)
        cross_kv = n_src * cfg.n_decoder_layers * 2 * 2 * d * d
        total += enc + dec + cross_kv + n_tgt * 2 * d * V
    return 3 * total


def synthetic_batches(vocab: int, max_tokens: int, n: int, seed: int = 0) -> list[Batch]:
    """Batches like a length-bucketed caption corpus: ~8-30 tokens, budget ``max_tokens``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(8, 30)
        rows = max_tokens // (length + 1)
        src = [[rng.randrange(4, vocab) for _ in range(length)] for _ in range(rows)]
        tgt = [
            [rng.randrange(4, vocab) for _ in range(rng.randint(length - 3, length))] for _ in src
        ]
        out.append(make_batch(src, tgt))
    return out


@dataclass
class System:
    name: str
    step: Callable[[Batch, torch.dtype | None], None]


def tformer_system(cfg: ModelConfig) -> System:
    torch.manual_seed(0)
    model = Transformer(cfg)
    train_cfg = TrainConfig()
    optimizer = make_optimizer(model, train_cfg)
    device = torch.device("cpu")

    def step(b: Batch, dtype: torch.dtype | None) -> None:
        train_step(model, optimizer, [b], [b.tgt_in], b.n_tgt_tokens, train_cfg, device, dtype)

    return System("tformer", step)


def marian_system(cfg: ModelConfig) -> System | None:
    """Hugging Face MarianMTModel with our dimensions (post-LN, ReLU, tied, sinusoidal)."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    torch.manual_seed(0)
    hf_cfg = MarianConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers, encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function="relu", dropout=cfg.dropout, attention_dropout=0.0,
        activation_dropout=0.0, max_position_embeddings=cfg.max_positions, pad_token_id=0,
        eos_token_id=3, decoder_start_token_id=2, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip
    model: nn.Module = MarianMTModel(hf_cfg)
    train_cfg = TrainConfig()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(b: Batch, dtype: torch.dtype | None) -> None:
        model.train()
        with autocast(torch.device("cpu"), dtype):
            logits = model(
                input_ids=b.src, attention_mask=b.src != 0, decoder_input_ids=b.tgt_in
            ).logits  # (B, T, V)
        real = b.tgt_out != 0  # the same loss as ours, on the real positions
        loss = label_smoothed_loss(logits[real], b.tgt_out[real], train_cfg.label_smoothing)
        loss = loss / b.n_tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return System("HF Marian", step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face even if installed")
    args = parser.parse_args()
    setup_threads()
    precisions = ["fp32", "bf16"] if cpu_has_fast_bf16() else ["fp32"]
    ceilings = {p: matmul_ceiling(PRECISIONS[p] or torch.float32) for p in precisions}
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads,"
          f" torch {torch.__version__}")  # fmt: skip
    for p, c in ceilings.items():
        print(f"# matmul ceiling {p}: {c / 1e9:,.0f} GFLOP/s")
    shapes = {
        "toy default (2+2, d=128, V=1k)": ModelConfig(vocab_size=1000),
        "3+3, d=256, h=4, FFN 1024, V=8k": ModelConfig(
            vocab_size=8000, d_model=256, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3
        ),
    }
    print("| model | system | precision | target tok/s | ms/step | MFU | vs HF |")
    print("|---|---|---|---:|---:|---:|---:|")
    for label, cfg in shapes.items():
        batches = synthetic_batches(cfg.vocab_size, args.max_tokens, args.steps)
        flops = model_flops(cfg, batches)
        tokens = sum(b.n_tgt_tokens for b in batches)
        systems = [tformer_system(cfg)]
        hf = None if args.no_hf else marian_system(cfg)
        if hf is not None:
            systems.append(hf)
        seconds: dict[tuple[str, str], list[float]] = {}
        for p in precisions:
            for s in systems:
                s.step(batches[0], PRECISIONS[p])  # warm-up
        for _ in range(args.rounds):
            for p in precisions:
                for s in systems:
                    t = time.perf_counter()
                    for b in batches:
                        s.step(b, PRECISIONS[p])
                    seconds.setdefault((s.name, p), []).append(time.perf_counter() - t)
        for p in precisions:
            hf_time = statistics.median(seconds[("HF Marian", p)]) if hf else None
            for s in systems:
                t = statistics.median(seconds[(s.name, p)])
                ratio = f"{hf_time / t:.2f}x" if hf_time else "-"
                print(
                    f"| {label} | {s.name} | {p} | {tokens / t:,.0f}"
                    f" | {1000 * t / len(batches):.0f}"
                    f" | {flops / t / ceilings[p]:.1%} | {ratio} |"
                )


if __name__ == "__main__":
    main()
