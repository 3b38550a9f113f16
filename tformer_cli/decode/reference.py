"""What the searches compute, in plain Python: the hypothesis, the length limit and penalty, and
the naive greedy and beam searches of one sentence, the whole prefix decoded again at every step.
``decode/search.py`` computes the same for a batch with the KV cache, held equal by the tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.model import Transformer


@dataclass(frozen=True)
class Hypothesis:
    """A translation: token ids (no ``<s>``/``</s>``), their summed log-probability ``logprob``
    (``</s>`` included when ``finished``), and the search's ``score`` (beam: length-normalised)."""

    tokens: list[int]
    logprob: float
    score: float
    finished: bool = True


def next_logprobs(logits: Tensor) -> Tensor:
    """log p(. | x, y_<t) (R, V), fp32, from the logits (R, V) of the last position; ``<pad>``
    and ``<s>`` are never generated (the others not renormalised)."""
    logp = logits.float().log_softmax(dim=-1)  # (R, V)
    logp[:, PAD_ID] = float("-inf")
    logp[:, BOS_ID] = float("-inf")
    return logp


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), |Y| with ``</s>``."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, cfg: DecodeConfig, max_positions: int) -> Tensor:
    """Per-sentence limit on generated tokens, ``</s>`` included: ``a * |src| + b``. Shape (B,)."""
    src_len = (src != PAD_ID).sum(dim=1)
    return (cfg.max_len_a * src_len + cfg.max_len_b).long().clamp(1, max_positions - 1)


def prefix_logprobs(
    model: Transformer, src: Tensor, tokens: list[int], cfg: DecodeConfig
) -> Tensor:
    """log p(. | x, y_1..y_t) (V,) from a pass over the whole prefix ``<s> y_1 .. y_t``; ``</s>``
    forbidden before ``cfg.min_len`` tokens."""
    y = torch.tensor([[BOS_ID, *tokens]], device=src.device)  # (1, t + 1)
    logp = next_logprobs(model(src, y)[:, -1])[0]  # the last position's: (V,)
    if len(tokens) < cfg.min_len:
        logp[EOS_ID] = float("-inf")
    return logp


def as_source(model: Transformer, source: list[int], cfg: DecodeConfig) -> tuple[Tensor, int]:
    """The source (1, S), ``</s>`` appended, and its limit on generated tokens."""
    src = torch.tensor([[*source, EOS_ID]], device=next(model.parameters()).device)
    return src, int(max_lengths(src, cfg, model.cfg.max_positions)[0])


@torch.inference_mode()
def greedy_search(model: Transformer, source: list[int], cfg: DecodeConfig) -> Hypothesis:
    """y_t = argmax_v p(v | x, y_<t) until ``</s>`` or the length limit, for one source (token
    ids without ``</s>``). The score is the log-probability."""
    src, limit = as_source(model, source, cfg)
    tokens: list[int] = []
    logprob = 0.0
    for _ in range(limit):
        logp = prefix_logprobs(model, src, tokens, cfg)  # (V,)
        best = int(logp.argmax())
        logprob += float(logp[best])
        if best == EOS_ID:
            return Hypothesis(tokens, logprob, logprob, finished=True)
        tokens.append(best)
    return Hypothesis(tokens, logprob, logprob, finished=False)


@torch.inference_mode()
def beam_search(model: Transformer, source: list[int], cfg: DecodeConfig) -> list[Hypothesis]:
    """The ``cfg.nbest`` best hypotheses of one source by ``logprob / lp(|Y|)``, best first.

    Each step scores every continuation of the k = ``cfg.beam`` live beams and keeps the best
    2k; those among the first k that end in ``</s>`` (or reach the length limit) finish, the
    best k others live on. The search stops when k have finished and no live beam can beat the
    k-th: a log-probability only falls as tokens are added, so the best score a beam can reach
    is its log-probability over lp at the length limit.
    """
    src, limit = as_source(model, source, cfg)
    k, alpha = cfg.beam, cfg.alpha
    live: list[tuple[float, list[int]]] = [(0.0, [])]  # (logprob, tokens), best first
    finished: list[Hypothesis] = []
    for t in range(limit):
        candidates = []  # (logprob, tokens, next token)
        for logprob, tokens in live:
            logp = prefix_logprobs(model, src, tokens, cfg)  # (V,)
            top, ids = logp.topk(min(2 * k, logp.numel()))  # (2k,): no beam needs more
            candidates += [
                (logprob + p, tokens, v) for p, v in zip(top.tolist(), ids.tolist(), strict=True)
            ]
        candidates = sorted((c for c in candidates if c[0] > float("-inf")), key=lambda c: -c[0])
        for logprob, tokens, v in candidates[:k]:
            if v == EOS_ID or t + 1 == limit:
                kept = tokens if v == EOS_ID else [*tokens, v]
                score = logprob / length_penalty(t + 1, alpha)
                finished.append(Hypothesis(kept, logprob, score, finished=v == EOS_ID))
        finished.sort(key=lambda h: -h.score)
        live = [(lp, [*tokens, v]) for lp, tokens, v in candidates[: 2 * k] if v != EOS_ID][:k]
        if not live or (
            len(finished) >= k
            and live[0][0] / length_penalty(limit, alpha) <= finished[k - 1].score
        ):
            break
    return finished[: cfg.nbest]


@torch.inference_mode()
def greedy_search_cached(model: Transformer, source: list[int], cfg: DecodeConfig) -> Hypothesis:
    """``greedy_search`` with the KV cache: the source is encoded once, and each step feeds the
    decoder only its newest token, whose keys and values the cache keeps for the steps after."""
    src, limit = as_source(model, source, cfg)
    memory, src_mask = model.encode(src)  # (1, S, d), (1, 1, 1, S): once
    cache = model.init_cache(memory, src_mask, limit)  # a slot for each token fed
    tokens: list[int] = []
    logprob, last = 0.0, BOS_ID
    for _ in range(limit):
        y = torch.tensor([[last]], device=src.device)  # (1, 1): the newest token only
        logp = next_logprobs(model.decode(y, None, None, cache)[:, -1])[0]  # (V,)
        if len(tokens) < cfg.min_len:
            logp[EOS_ID] = float("-inf")
        last = int(logp.argmax())
        logprob += float(logp[last])
        if last == EOS_ID:
            return Hypothesis(tokens, logprob, logprob, finished=True)
        tokens.append(last)
    return Hypothesis(tokens, logprob, logprob, finished=False)
