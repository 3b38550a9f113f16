"""One step of batched greedy decoding after the model's: the choice of each row's next token and
the rows' bookkeeping. The search loop (``search.batched_greedy``) runs it as tensor operations;
the compiled CPU step (``aot``) runs the same function inside its library, so that a greedy step
is one call with no Python between the model and the choice."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer_cli.data.tokenizer import EOS_ID, PAD_ID


def ban_eos(logp: Tensor, banned: Tensor) -> Tensor:
    """``logp`` (R, V) with ``</s>`` at -inf where ``banned`` (a 0-dim bool: the output is still
    shorter than ``min_len``), in place; a tensor condition, so that one compiled step serves
    every step index."""
    eos = logp[:, EOS_ID]  # (R,)
    logp[:, EOS_ID] = torch.where(banned, float("-inf"), eos)
    return logp


def advance(
    best: Tensor, best_logp: Tensor, alive: Tensor, logprob: Tensor, steps: Tensor,
    limits: Tensor, t: Tensor | int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The rows after choosing ``best`` (R,) of log-probability ``best_logp`` (R,) as their
    ``t``-th token: the token each row outputs (``<pad>`` once finished), its sum of
    log-probabilities, its count of tokens (``</s>`` included) and whether it is still live
    (not ended by ``</s>`` nor by its length limit ``limits``), each (R,)."""
    logprob = torch.where(alive, logprob + best_logp, logprob)
    token = torch.where(alive, best, PAD_ID)
    steps = torch.where(alive, t, steps)
    alive = alive & (best != EOS_ID) & (limits > t)
    return token, logprob, steps, alive
