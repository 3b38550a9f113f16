"""Scheduled sampling for Transformers (Bengio et al., 2015; two-pass: Mihaylova & Martins, 2019).

Pass 1 decodes the batch with gold inputs and no gradient; pass 2, which carries the loss, reads
at each position the gold token with probability eps_i and otherwise the model's pass-1
prediction. eps_i, the teacher-forcing probability at update i, decays by a schedule.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tformer_cli.data.batching import Batch
from tformer_cli.data.tokenizer import BOS_ID, PAD_ID
from tformer_cli.device import autocast

DEFAULT_K = {"linear": 1e-4, "exp": 0.9995, "inverse-sigmoid": 500.0}


def teacher_forcing_prob(
    step: int, schedule: str, k: float | None = None, eps_min: float = 0.0, warmup: int = 0
) -> float:
    """eps_i after ``warmup`` updates of pure teacher forcing (i = step - warmup): linear
    max(eps_min, 1 - k*i), exp k**i (k <= 1), inverse-sigmoid k / (k + exp(i/k)) (k >= 1)."""
    if schedule == "off" or step < warmup:
        return 1.0
    k = DEFAULT_K[schedule] if k is None else k
    i = step - warmup
    if schedule == "linear":
        return max(eps_min, 1.0 - k * i)
    if schedule == "exp":
        return k**i
    return k / (k + math.exp(min(i / k, 700.0)))  # exp overflows a float past ~709


def model_predictions(logits: Tensor, mix: str, tau: float, generator: torch.Generator) -> Tensor:
    """Pass-1 tokens from logits (B, T, V): argmax, or a sample at temperature tau. (B, T).
    Never ``<pad>`` or ``<s>``, which decoding never emits either."""
    never = torch.tensor([PAD_ID, BOS_ID], device=logits.device)
    logits = logits.float().index_fill(-1, never, float("-inf"))  # (B, T, V)
    if mix == "argmax":
        return logits.argmax(dim=-1)
    probs = (logits / tau).softmax(dim=-1)  # (B, T, V)
    flat = torch.multinomial(probs.flatten(0, 1), 1, generator=generator)  # (B*T, 1)
    return flat.view(logits.shape[:2])


def mix_inputs(tgt_in: Tensor, predicted: Tensor, eps: float, generator: torch.Generator) -> Tensor:
    """Pass-2 decoder input: gold ``tgt_in`` (B, T) where a coin with P(gold) = eps says so,
    else the prediction made one position earlier. ``<s>`` and padding stay as they are."""
    shifted = torch.cat([tgt_in[:, :1], predicted[:, :-1]], dim=1)  # (B, T): prediction for slot t
    gold = torch.rand(tgt_in.shape, generator=generator, device=tgt_in.device) < eps
    gold |= (tgt_in == BOS_ID) | (tgt_in == PAD_ID)
    return torch.where(gold, tgt_in, shifted)


def sampled_inputs(
    model: torch.nn.Module,
    b: Batch,
    eps: float,
    mix: str,
    tau: float,
    generator: torch.Generator,
    dtype: torch.dtype | None,
) -> Tensor:
    """Pass 2's decoder input (B, T) for batch ``b``. Pass 1 runs without dropout or gradient,
    as at inference, and its random choices come from a ``generator`` of their own: with
    eps = 1 training equals plain teacher forcing."""
    model.eval()
    with torch.no_grad(), autocast(b.src.device, dtype):
        logits = model(b.src, b.tgt_in)  # (B, T, V)
    model.train()
    predicted = model_predictions(logits, mix, tau, generator)
    return mix_inputs(b.tgt_in, predicted, eps, generator)
