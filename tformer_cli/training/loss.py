"""Label-smoothed cross-entropy (paper section 5.4) with its gradient written out.

With q = (1 - eps) * onehot(gold) + eps / V and p = softmax(z), the loss of a row is
-sum_v q_v log p_v and its gradient with respect to the logits z is simply p - q. Autograd
through ``F.cross_entropy(label_smoothing=...)`` reaches the same numbers through several
vocabulary-sized temporaries (an fp32 copy of the logits, a zero-filled NLL gradient, the
smoothing term's broadcast, the log-softmax backward); on CPU, where those passes over
(tokens x V) memory cost as much as the output layer's matmul, writing p - q directly in one
buffer saves most of them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class _LabelSmoothedNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, gold: Tensor, eps: float) -> Tensor:
        dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 logits: fp32
        logp = torch.log_softmax(logits, dim=-1, dtype=dtype)  # (N, V)
        V = logp.size(-1)
        nll = -logp.gather(1, gold[:, None]).sum()  # -sum_n log p(gold_n)
        uniform = -logp.sum() / V  # -sum_n mean_v log p(v)
        ctx.save_for_backward(logp, gold)
        ctx.eps, ctx.dtype = eps, logits.dtype
        return (1 - eps) * nll + eps * uniform

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        logp, gold = ctx.saved_tensors
        eps, V = ctx.eps, logp.size(-1)
        g = logp.exp_()  # p, in the saved buffer: the log-probabilities are not needed again
        g.sub_(eps / V).scatter_add_(1, gold[:, None], g.new_full((g.size(0), 1), eps - 1))
        return g.mul_(grad).to(ctx.dtype), None, None  # (p - q) * dL/dloss


def label_smoothed_loss(logits: Tensor, gold: Tensor, smoothing: float) -> Tensor:
    """Sum over rows of the cross-entropy between ``(1-eps) onehot(gold) + eps/V`` and
    ``softmax(logits)``: logits (N, V) in any float dtype (computed in fp32), gold (N,)."""
    return _LabelSmoothedNLL.apply(logits, gold, smoothing)
