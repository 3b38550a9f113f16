"""One step of batched greedy decoding after the model's: each row's next token and the rows'
bookkeeping, run by the search loop (``search.batched_greedy``) and inside the compiled CPU
step (``aot``) alike."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer_cli.data.tokenizer import EOS_ID, PAD_ID


def ban_eos(logp: Tensor, banned: Tensor) -> Tensor:
    """``logp`` (R, V) with ``</s>`` at -inf, in place, where ``banned`` (a 0-dim bool, so that
    one compiled step serves every step index)."""
    eos = logp[:, EOS_ID]  # (R,)
    logp[:, EOS_ID] = torch.where(banned, float("-inf"), eos)
    return logp


def advance(
    best: Tensor, best_logp: Tensor, alive: Tensor, logprob: Tensor, steps: Tensor,
    limits: Tensor, t: Tensor | int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The rows after choosing ``best`` (R,) of log-probability ``best_logp`` as their ``t``-th
    token: each row's token (``<pad>`` once finished), summed log-probability, count of tokens
    (``</s>`` included) and whether it is still live, each (R,)."""
    logprob = torch.where(alive, logprob + best_logp, logprob)
    token = torch.where(alive, best, PAD_ID)
    steps = torch.where(alive, t, steps)
    alive = alive & (best != EOS_ID) & (limits > t)
    return token, logprob, steps, alive
