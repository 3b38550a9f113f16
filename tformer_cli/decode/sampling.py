"""Sampling the next token from the decoder's log-probabilities: temperature, top-k, nucleus
(top-p, Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration") and epsilon
sampling (Hewitt et al. 2022, "Truncation Sampling as Language Model Desmoothing"); a pure
function over a batch of rows that never syncs with the host.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def sample_next(
    logp: Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    epsilon: float | None,
    generator: torch.Generator,
) -> Tensor:
    """Draw one token per row of ``logp`` (R, V): fp32 log-probabilities, each row with at least
    one finite entry; -inf entries (forbidden tokens) are never drawn. Returns (R,) long.

    The filters apply in the order temperature, top-k, top-p, epsilon, each to the distribution
    the previous one left (renormalised), as in Hugging Face's ``generate``. The draw is the
    Gumbel-max trick as an exponential race (no input check to sync with the host): with
    ``q_v ~ Exp(1)`` i.i.d., ``argmax_v p_v / q_v`` is ``v`` with probability ``p_v``.
    """
    # Temperature: log p_T = log softmax(log p / T); the max is subtracted first so that the top
    # token stays finite (0 / T) even when T is tiny.
    logp = ((logp - logp.amax(dim=-1, keepdim=True)) / temperature).log_softmax(dim=-1)  # (R, V)
    if top_k is not None and top_k < logp.size(-1):
        kept, idx = logp.topk(top_k, dim=-1)  # (R, k): exactly k, even with ties
        logp = torch.full_like(logp, -math.inf).scatter(-1, idx, kept).log_softmax(dim=-1)
    if top_p is not None and top_p < 1:
        p_sorted, idx = logp.exp().sort(dim=-1, descending=True)  # (R, V)
        mass_before = F.pad(p_sorted.cumsum(dim=-1)[:, :-1], (1, 0))  # (R, V): exclusive cumsum
        drop = torch.zeros_like(idx, dtype=torch.bool).scatter(-1, idx, mass_before >= top_p)
        logp = logp.masked_fill(drop, -math.inf).log_softmax(dim=-1)  # keeps the top (mass 0)
    if epsilon:
        drop = (logp.exp() < epsilon) & (logp < logp.amax(dim=-1, keepdim=True))  # (R, V): not top
        logp = logp.masked_fill(drop, -math.inf)
    q = torch.empty_like(logp).exponential_(generator=generator)  # (R, V) ~ Exp(1)
    tiny = torch.finfo(q.dtype).tiny  # q = 0 (rare on CPU) would give -inf + inf = nan
    return (logp - q.clamp_min(tiny).log()).argmax(dim=-1)  # (R,): argmax p / q
