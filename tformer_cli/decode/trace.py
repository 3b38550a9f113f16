"""The step-through view of decoding: one sentence's greedy or beam search, recorded step by
step (each live hypothesis, its ``top`` most probable next tokens and what became of them, and
its cross-attention row), for teaching.

The traced search runs the same cached step (``search.Rows``) and the same tensor operations as
``search.greedy_search`` and ``search.beam_search`` for one sentence, so it ends with the same
hypotheses and scores; the fast searches themselves are untouched (tracing off costs nothing).
The cross-attention rows come afterwards from one teacher-forced pass over every recorded
prefix, so the traced step computes exactly what the untraced one does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer
from torch import Tensor

from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.decode.reference import Hypothesis, length_penalty, max_lengths
from tformer_cli.decode.search import Models, Rows, as_list
from tformer_cli.model import Transformer

KEPT, PRUNED, FINISHED = "kept", "pruned", "finished"


@dataclass(frozen=True)
class Candidate:
    """One of a hypothesis' most probable next tokens: its log-probability, the hypothesis'
    score with it (beam: summed log-probability), and what the search did with it."""

    token: int
    logprob: float
    score: float
    status: str  # kept (lives on), finished (ended in </s> or at the length limit), pruned


@dataclass
class Live:
    """A hypothesis expanded at one step: ``number`` (its id in the trace), the ``parent``
    it continues (None at step 0), its tokens so far and summed log-probability."""

    number: int
    parent: int | None
    tokens: list[int]
    logprob: float
    candidates: list[Candidate] = field(default_factory=list)
    attention: Tensor | None = None  # (L, h, S): its cross-attention row for the next token


@dataclass(frozen=True)
class Trace:
    """A recorded search: ``steps[t]`` holds the hypotheses expanded at step t; ``final``, the
    n-best list the untraced search returns (``nbest`` = ``beam``)."""

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


def statuses(k: int, beam: Tensor, token: Tensor, ends: Tensor, pos: Tensor) -> dict:
    """(beam, token) -> status for the 2k candidates of a step: ``ends`` finished, ``pos`` (the
    live ones chosen) kept; every other continuation was pruned."""
    out = {}
    for j, (b, t) in enumerate(zip(beam.tolist(), token.tolist(), strict=True)):
        if ends[j]:
            out[(b, t)] = FINISHED
    for j in pos.tolist():
        out[(int(beam[j]), int(token[j]))] = KEPT
    return out


def record(lives: list[Live], logp: Tensor, base: Tensor, top: int, status: dict) -> None:
    """Each live hypothesis' ``top`` next tokens by log-probability, with what became of them."""
    values, tokens = logp.topk(min(top, logp.size(-1)), dim=-1)  # (R, top)
    for i, h in enumerate(lives):
        h.candidates = [
            Candidate(t, v, float(base[i]) + v, status.get((i, t), PRUNED))
            for v, t in zip(values[i].tolist(), tokens[i].tolist(), strict=True)
            if v > float("-inf")
        ]


@torch.inference_mode()
def trace_greedy(
    models: list[Transformer], src: Tensor, cfg: DecodeConfig, top: int, compile: str
) -> Trace:
    """``greedy_search`` of one sentence src (1, S), recorded."""
    T_max = int(max_lengths(src, cfg, min(m.cfg.max_positions for m in models))[0])
    state = Rows(models, src, 1, T_max, True, compile)
    y = torch.full((1, T_max + 1), PAD_ID, dtype=torch.long, device=src.device)
    y[:, 0] = BOS_ID
    steps, logprob, h = [], 0.0, Live(0, None, [], 0.0)
    for t in range(T_max):
        logp = state.logprobs(y, t)  # (1, V)
        if t < cfg.min_len:
            logp.select(1, EOS_ID).fill_(float("-inf"))
        best_logp, best = logp.max(dim=-1)
        token = int(best)
        ends = token == EOS_ID or t + 1 >= T_max
        status = {(0, token): FINISHED if ends else KEPT}
        record([h], logp, torch.tensor([logprob]), top, status)
        steps.append([h])
        logprob += float(best_logp)
        y[:, t + 1] = best
        if ends:
            break
        h = Live(t + 1, h.number, [*h.tokens, token], logprob)
    eos = token == EOS_ID
    tokens = h.tokens + ([] if eos else [token])
    return Trace(
        src[0, :-1].tolist(), 1, cfg.alpha, steps, [Hypothesis(tokens, logprob, logprob, eos)]
    )


@torch.inference_mode()
def trace_beam(
    models: list[Transformer], src: Tensor, cfg: DecodeConfig, top: int, compile: str
) -> Trace:
    """``beam_search`` of one sentence src (1, S) with ``cfg.nbest = cfg.beam``, recorded: the
    same tensor operations on a batch of one."""
    k, device = cfg.beam, src.device
    limit = int(max_lengths(src, cfg, min(m.cfg.max_positions for m in models))[0])
    state = Rows(models, src, k, limit, True, compile)
    y = torch.full((k, limit + 1), PAD_ID, dtype=torch.long, device=device)
    y[:, 0] = BOS_ID
    scores = torch.full((1, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    fin_score = scores.new_full((1, k), float("-inf"))
    fin: list[tuple[list[int], float, bool]] = [([], 0.0, False)] * k  # tokens, logprob, eos
    first_k = torch.arange(2 * k, device=device) < k
    lives = [Live(0, None, [], 0.0)]
    steps, count = [], 1
    for t in range(limit):
        logp = state.logprobs(y, t)  # (k, V)
        if t < cfg.min_len:
            logp.select(1, EOS_ID).fill_(float("-inf"))
        V = logp.size(-1)
        cand = (logp + scores.view(-1, 1)).view(1, k * V)
        top_v, idx = cand.topk(min(2 * k, k * V), dim=1)  # (1, 2k)
        beam, token = idx // V, idx % V
        eos = token == EOS_ID
        at_limit = limit <= t + 1
        ends = (eos | at_limit) & first_k[: top_v.size(1)] & top_v.isfinite()  # (1, 2k)
        new_score = (top_v / length_penalty(t + 1, cfg.alpha)).masked_fill(~ends, float("-inf"))
        fin_score, pick = torch.cat([fin_score, new_score], dim=1).topk(k, dim=1)
        new = [  # a row past the live ones scores -inf: never finished, never kept
            ((lives[b].tokens if b < len(lives) else []) + ([] if e else [tok]), v, e)
            for b, tok, v, e in zip(beam[0].tolist(), token[0].tolist(), top_v[0].tolist(),
                                    eos[0].tolist(), strict=True)
        ]  # fmt: skip
        fin = [(fin + new)[j] for j in pick[0].tolist()]
        scores, pos = top_v.masked_fill(eos, float("-inf")).topk(k, dim=1)  # (1, k)
        rows = beam.gather(1, pos).flatten()  # (k,)
        status = statuses(k, beam[0], token[0], ends[0], pos[0][scores[0].isfinite()])
        record(
            lives, logp[: len(lives)], scores.new_tensor([h.logprob for h in lives]), top, status
        )
        steps.append(lives)
        y = y[rows]
        y[:, t + 1] = token.gather(1, pos).flatten()
        state.reorder = rows
        reach = length_penalty(max(limit, t + 2), cfg.alpha)
        if at_limit or bool(scores[0, 0] / reach <= fin_score[0, k - 1]):
            break
        kept = [
            (int(r), int(tok), float(s))
            for r, tok, s in zip(rows, y[:, t + 1], scores[0], strict=True)
        ]
        lives = [
            Live(count + j, lives[r].number, [*lives[r].tokens, tok], s)
            for j, (r, tok, s) in enumerate(kept)
            if s > float("-inf")
        ]
        count += len(lives)
    final = [
        Hypothesis(tokens, lp, sc, e)
        for sc, (tokens, lp, e) in zip(fin_score[0].tolist(), fin, strict=True)
        if sc > float("-inf")
    ]
    return Trace(src[0, :-1].tolist(), k, cfg.alpha, steps, final)


@torch.inference_mode()
def cross_rows(model: Transformer, src: Tensor, prefixes: Sequence[Sequence[int]]) -> Tensor:
    """The cross-attention row (L, h, S) of each prefix's next-token query: one teacher-forced
    pass of ``<s>`` + prefix against src (1, S). Returns (N, L, h, S)."""
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
    """The search of ``cfg`` (greedy for ``beam`` 1, else beam search with ``nbest = beam``)
    of one sentence src (1, S), every step recorded with each live hypothesis' ``top`` next
    tokens and its cross-attention row (of the first model, for an ensemble); ``compile``:
    how the decode step runs, as for the untraced search."""
    models = as_list(model)
    traced = (trace_greedy if cfg.beam == 1 else trace_beam)(models, src, cfg, top, compile)
    lives = [h for step in traced.steps for h in step]
    for h, row in zip(lives, cross_rows(models[0], src, [h.tokens for h in lives]), strict=True):
        h.attention = row
    return traced
