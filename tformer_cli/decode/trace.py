"""The step-through view of decoding: one sentence's greedy or beam search, recorded step by
step (each live hypothesis, its ``top`` next tokens and what became of them, its cross-attention
row), for teaching. The traced search is ``search.batched_greedy`` or ``search.batched_beam``
itself, observed by a ``Recorder``, so it ends with the same hypotheses and scores; the
cross-attention rows come after, from one teacher-forced pass over every recorded prefix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from tokenizers import Tokenizer
from torch import Tensor

from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID
from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.search import Models, as_list, batched_beam, batched_greedy
from tformer_cli.model import Transformer

KEPT, PRUNED, FINISHED = "kept", "pruned", "finished"


@dataclass(frozen=True)
class Candidate:
    """One of a hypothesis' most probable next tokens, the hypothesis' score with it, and what
    the search did with it."""

    token: int
    logprob: float
    score: float
    status: str  # kept (lives on), finished (ended in </s> or at the length limit), pruned


@dataclass
class Live:
    """A hypothesis expanded at one step: its id in the trace, the ``parent`` it continues
    (None at step 0), its tokens so far and summed log-probability."""

    number: int
    parent: int | None
    tokens: list[int]
    logprob: float
    candidates: list[Candidate] = field(default_factory=list)
    attention: Tensor | None = None  # (L, h, S): its cross-attention row for the next token


@dataclass(frozen=True)
class Trace:
    """A recorded search: ``steps[t]``, the hypotheses expanded at step t; ``final``, the
    untraced search's n-best list (``nbest`` = ``beam``)."""

    src: list[int]
    beam: int
    alpha: float
    steps: list[list[Live]]
    final: list[Hypothesis]

    def to_dict(self, tok: Tokenizer, source: str = "") -> dict:
        """Plain data with token pieces, for JSON (``tformer translate --trace``)."""
        piece = tok.id_to_token

        def live(h: Live) -> dict:
            cands = [
                {"token": piece(c.token), "id": c.token, "p": round(math.exp(c.logprob), 6),
                 "logprob": c.logprob, "score": c.score, "status": c.status}
                for c in h.candidates
            ]  # fmt: skip
            attention = [] if h.attention is None else h.attention.round(decimals=4).tolist()
            return {
                "id": h.number, "parent": h.parent, "tokens": [piece(i) for i in h.tokens],
                "logprob": h.logprob, "next": cands, "cross_attention": attention,
            }  # fmt: skip

        return {
            "source": source,
            "source_tokens": [*(piece(i) for i in self.src), "</s>"],
            "beam": self.beam,
            "alpha": self.alpha,
            "steps": [[live(h) for h in step] for step in self.steps],
            "final": [
                {
                    "tokens": [piece(i) for i in h.tokens],
                    "text": tok.decode(h.tokens),
                    "score": h.score,
                    "logprob": h.logprob,
                    "finished": h.finished,
                }
                for h in self.final
            ],
        }

    def to_json(self, tok: Tokenizer, source: str = "") -> str:
        return json.dumps(self.to_dict(tok, source), ensure_ascii=False)


def statuses(beam: Tensor, token: Tensor, ends: Tensor, pos: Tensor) -> dict:
    """(beam, token) -> status for the 2k candidates of a step: ``ends`` finished, ``pos``
    kept (the others were pruned)."""
    pairs = list(zip(beam.tolist(), token.tolist(), strict=True))
    out = {pair: FINISHED for pair, end in zip(pairs, ends.tolist(), strict=True) if end}
    return out | {pairs[j]: KEPT for j in pos.tolist()}


def record(lives: list[Live], logp: Tensor, base: Tensor, top: int, status: dict) -> None:
    """Each live hypothesis' ``top`` next tokens by log-probability, with what became of them."""
    values, tokens = logp.topk(min(top, logp.size(-1)), dim=-1)  # (R, top)
    for i, h in enumerate(lives):
        h.candidates = [
            Candidate(t, v, float(base[i]) + v, status.get((i, t), PRUNED))
            for v, t in zip(values[i].tolist(), tokens[i].tolist(), strict=True)
            if v > float("-inf")
        ]


class Recorder:
    """The steps of one sentence's search as it runs (its ``observe``), until the sentence is
    done (a GPU search may run a step past it)."""

    def __init__(self, top: int) -> None:
        self.top, self.done = top, False
        self.steps: list[list[Live]] = []
        self.lives = [Live(0, None, [], 0.0)]  # to expand at the next step
        self.final: list[Hypothesis] = []  # greedy's, its log-probability summed in Python

    def greedy(self, logp: Tensor, token: Tensor, alive: Tensor) -> None:
        """A step of ``batched_greedy``: the argmax ``token`` (1,) kept, or finished where it
        ends the row; the log-probabilities summed in Python."""
        if self.done:
            return
        (h,), best, self.done = self.lives, int(token[0]), not bool(alive[0])
        status = {(0, best): FINISHED if self.done else KEPT}
        record([h], logp, torch.tensor([h.logprob]), self.top, status)
        self.steps.append([h])
        logprob = h.logprob + float(logp[0, best])
        eos = best == EOS_ID
        self.lives = [Live(len(self.steps), h.number, h.tokens + [best] * (not eos), logprob)]
        self.final = [Hypothesis(self.lives[0].tokens, logprob, logprob, eos)]

    def beam(
        self, logp: Tensor, beam: Tensor, token: Tensor, ends: Tensor, pos: Tensor,
        scores: Tensor, done: Tensor,
    ) -> None:  # fmt: skip
        """A step of ``batched_beam`` (one sentence): the 2k best continuations (``beam``,
        ``token``: (1, 2k)), those that ``ends``, the k kept (``pos``) and their ``scores``."""
        if self.done:
            return
        lives, self.done = self.lives, bool(done[0])
        status = statuses(beam[0], token[0], ends[0], pos[0][scores[0].isfinite()])
        base = scores.new_tensor([h.logprob for h in lives])
        record(lives, logp[: len(lives)], base, self.top, status)
        self.steps.append(lives)
        count = sum(map(len, self.steps))
        rows, tokens = beam.gather(1, pos)[0].tolist(), token.gather(1, pos)[0].tolist()
        self.lives = [
            Live(count + j, lives[r].number, [*lives[r].tokens, tok], s)
            for j, (r, tok, s) in enumerate(zip(rows, tokens, scores[0].tolist(), strict=True))
            if s > float("-inf")
        ]


@torch.inference_mode()
def cross_rows(model: Transformer, src: Tensor, prefixes: Sequence[Sequence[int]]) -> Tensor:
    """The cross-attention row (L, h, S) of each prefix's next-token query against src (1, S),
    from one teacher-forced pass: (N, L, h, S)."""
    y = pad([[BOS_ID, *p] for p in prefixes]).to(src.device)  # (N, T)
    last = torch.tensor([len(p) for p in prefixes], device=src.device)  # (N,)
    model.record_attention(True)
    try:
        model(src.expand(len(prefixes), -1), y)
        weights = torch.stack([m.weights for m in model.attention_modules()["cross"]], dim=1)
    finally:
        model.record_attention(False)
    rows = weights[torch.arange(len(prefixes)), :, :, last]  # (N, L, h, S)
    return rows.float().cpu()


def trace_search(
    model: Models, src: Tensor, cfg: DecodeConfig, top: int = 5, compile: str = "auto"
) -> Trace:
    """The search of ``cfg`` (greedy for ``beam`` 1, else beam search with ``nbest = beam``) of
    one sentence src (1, S), each step recorded with each live hypothesis' ``top`` next tokens
    and its cross-attention row (the first model's, for an ensemble)."""
    models, seen = as_list(model), Recorder(top)
    if cfg.beam == 1:
        batched_greedy(models, src, replace(cfg, sampling=None), True, compile, observe=seen.greedy)
        final = seen.final
    else:
        beam = replace(cfg, nbest=cfg.beam)
        final = batched_beam(models, src, beam, True, compile, observe=seen.beam)[0]
    traced = Trace(src[0, :-1].tolist(), cfg.beam, cfg.alpha, seen.steps, final)
    lives = [h for step in traced.steps for h in step]
    for h, row in zip(lives, cross_rows(models[0], src, [h.tokens for h in lives]), strict=True):
        h.attention = row
    return traced
