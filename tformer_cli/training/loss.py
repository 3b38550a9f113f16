"""Label-smoothed cross-entropy (paper section 5.4) and its gradient written out.

With q = (1 - eps) * onehot(gold) + eps / V and p = softmax(z), the loss of a row is
-sum_v q_v log p_v = -(1 - eps) log p_gold - eps/V sum_v log p_v (``smoothed_nll``), and its
gradient with respect to the logits z is simply p - q. Autograd reaches the same numbers through
several vocabulary-sized temporaries (the log-softmax backward, the gather's zero-filled
gradient, the smoothing term's broadcast); on a CPU, where those passes over (tokens x V) memory
cost as much as the output layer's matmul, ``PMinusQ`` writes p - q in one buffer instead
(``FUSED_GRADIENT``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

FUSED_GRADIENT = True  # the backward writes p - q itself (``PMinusQ``); False: autograd's


def label_smoothed_loss(logits: Tensor, gold: Tensor, smoothing: float) -> Tensor:
    """Sum over rows of the cross-entropy between ``(1-eps) onehot(gold) + eps/V`` and
    ``softmax(logits)``: logits (N, V) in any float dtype (computed in fp32), gold (N,)."""
    if FUSED_GRADIENT:
        return PMinusQ.apply(logits, gold, smoothing)
    return smoothed_nll(log_probs(logits), gold, smoothing)


def log_probs(logits: Tensor) -> Tensor:
    """log softmax(z) (N, V), fp32 for bf16 or fp16 logits."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))


def smoothed_nll(logp: Tensor, gold: Tensor, eps: float) -> Tensor:
    """-sum_n [(1 - eps) log p_n(gold_n) + eps/V sum_v log p_n(v)], from logp (N, V)."""
    nll = -logp.gather(1, gold[:, None]).sum()  # -sum_n log p(gold_n)
    uniform = -logp.sum() / logp.size(-1)  # -sum_n mean_v log p(v)
    return (1 - eps) * nll + eps * uniform


class PMinusQ(torch.autograd.Function):
    """``smoothed_nll`` of the logits, whose backward is (p - q) * dL/dloss, written in the
    buffer of the saved log-probabilities."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, gold: Tensor, eps: float) -> Tensor:
        logp = log_probs(logits)  # (N, V)
        ctx.save_for_backward(logp, gold)
        ctx.eps, ctx.dtype = eps, logits.dtype
        return smoothed_nll(logp, gold, eps)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        logp, gold = ctx.saved_tensors
        eps, V = ctx.eps, logp.size(-1)
        g = logp.exp_()  # p, in the saved buffer: the log-probabilities are not needed again
        g.sub_(eps / V).scatter_add_(1, gold[:, None], g.new_full((g.size(0), 1), eps - 1))
        return g.mul_(grad).to(ctx.dtype), None, None  # (p - q) * dL/dloss
