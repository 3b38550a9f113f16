"""Search for translations with the KV cache: batched greedy decoding, sampling and beam search."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.decode.fast import search_threads
from tformer_cli.decode.fast.buckets import round_up
from tformer_cli.decode.greedy import advance
from tformer_cli.decode.reference import Hypothesis, length_penalty, max_lengths, next_logprobs
from tformer_cli.decode.sampling import sample_next
from tformer_cli.decode.step import DecodeStep, Step
from tformer_cli.model import DecoderCache, Transformer

DEFAULT = DecodeConfig()


Models = Transformer | Sequence[Transformer]


def as_list(models: Models) -> list[Transformer]:
    return [models] if isinstance(models, nn.Module) else list(models)


def ensemble(logps: list[Tensor]) -> Tensor:
    """log of the mean of the models' next-token probabilities (R, V), as fairseq ensembles
    (a mean of log-probabilities would let one confident model veto the others)."""
    if len(logps) == 1:
        return logps[0]
    return torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))  # (R, V)


def attend_to(step: Step, cache: DecoderCache, t: int) -> None:
    """Set the slots the step of token t attends to: t + 1, rounded up to the step's bucket."""
    cache.span = min(round_up(t + 1, step.buckets.span), cache.self_kv.size(4))


class Rows:
    """The decoder state behind a search's rows, ``beams`` per sentence, for one model or an
    ensemble: each model's KV cache read by its decode step or, without a cache, the memory
    against which the whole prefix is decoded again. Sentences may be padded up to a bucket
    with copies of real ones; the search ignores them."""

    def __init__(
        self,
        models: list[Transformer],
        src: Tensor,
        beams: int,
        max_len: int,
        use_cache: bool,
        compile: str,
    ) -> None:
        self.models, self.beams = models, beams
        self.steps = [DecodeStep.of(m, compile) for m in models] if use_cache else []
        if use_cache:
            self.caches = [step.start(src, beams, max_len) for step in self.steps]
            self.sentences = self.caches[0].src_mask.size(0)  # B' >= B
        else:
            self.memories = [m.encode(src) for m in models]  # (B, S, d), (B, 1, 1, S) each
            self.sentences = src.size(0)
        self.reorder: Tensor | None = None  # rows to reorder the caches by before the next step

    def bucket(self, live: int) -> int:
        """How many sentences the state keeps for ``live`` live ones."""
        return self.steps[0].buckets.sentences(live) if self.steps else live

    def logprobs(self, y: Tensor, t: int) -> Tensor:
        """log p(. | x, y_1..y_t) (R, V) for each row of y (R, >= t+1), ``<s>`` first."""
        if not self.steps:  # the whole prefix; the output layer scores its last position
            last = torch.zeros_like(y[:, : t + 1], dtype=torch.bool)
            last[:, -1] = True
            return ensemble(
                [
                    next_logprobs(m.decode(y[:, : t + 1], memory, src_mask, at=last))
                    for m, (memory, src_mask) in zip(self.models, self.memories, strict=True)
                ]
            )
        rows, self.reorder = self.reorder, None
        logps = []
        for step, cache in zip(self.steps, self.caches, strict=True):
            attend_to(step, cache, t)
            logps.append(step(y[:, t], cache, rows))
        return ensemble(logps)

    def greedy(self, y: Tensor, t: int, state: tuple[Tensor, ...]) -> list[Tensor] | None:
        """``DecodeStep.greedy`` of a single model; None for an ensemble."""
        if len(self.steps) != 1:
            return None
        step, cache = self.steps[0], self.caches[0]
        attend_to(step, cache, t)
        return step.greedy(y[:, t], cache, state)

    def select(self, sentences: Tensor) -> None:
        """Keep ``sentences`` (into B', with repeats) and their rows, reordered as pending."""
        k = self.beams
        rows = (sentences[:, None] * k + torch.arange(k, device=sentences.device)).flatten()
        if self.reorder is not None:
            rows, self.reorder = self.reorder[rows], None
        if self.steps:
            self.caches = [
                step.select(cache, rows, sentences)
                for step, cache in zip(self.steps, self.caches, strict=True)
            ]
        else:
            self.memories = [(memory[sentences], mask[sentences]) for memory, mask in self.memories]
        self.sentences = sentences.numel()


class LiveCount:
    """How many entries of a device mask are True, for the host: at once on the CPU; one step
    late on a GPU, through pinned memory while the next step is queued, so that the GPU never
    waits for the host (the price: at most one step past the last live row, masked)."""

    def __init__(self, device: torch.device) -> None:
        self.lag = device.type == "cuda"
        if self.lag:
            self.counts = torch.zeros(2, dtype=torch.long, pin_memory=True)
            self.ready = [torch.cuda.Event(), torch.cuda.Event()]
            self.calls = 0

    def __call__(self, mask: Tensor) -> int | None:
        """The count of ``mask``, or (GPU) of the previous call's mask; None on a first call."""
        if not self.lag:
            return int(mask.sum())  # the step's one host transfer
        now, before = self.calls % 2, (self.calls + 1) % 2
        self.counts[now].copy_(mask.sum(), non_blocking=True)
        self.ready[now].record()
        self.calls += 1
        if self.calls == 1:
            return None
        self.ready[before].synchronize()
        return int(self.counts[before])


def padded_to(keep: Tensor, n: int) -> Tensor:
    """``keep`` (m,) made n >= m long by repeating its last element."""
    return keep[torch.arange(n, device=keep.device).clamp(max=keep.numel() - 1)]


def survivors(
    alive: Tensor, count: LiveCount, bucket: Callable[[int], int]
) -> tuple[Tensor, Tensor] | None:
    """The rows (beam search: sentences) a search keeps after a step, ``alive`` (R,) marking
    the live ones: None to keep them all (the live ones fill the same bucket, or their count is
    still on its way from the GPU); else the live ones, the last repeated to fill their bucket,
    and the mask of the repeats, both (R',): empty when none is live, and the search ends."""
    live = count(alive)
    if live == 0:
        return alive.new_zeros(0, dtype=torch.long), alive.new_zeros(0)
    if live is None or bucket(live) == alive.numel():
        return None
    live_rows = alive.nonzero().flatten()  # (n,)
    n = live_rows.numel()
    if n == 0:
        return live_rows, alive.new_zeros(0)
    if bucket(n) >= alive.numel():
        return None
    keep = padded_to(live_rows, bucket(n))  # (R',)
    return keep, torch.arange(keep.numel(), device=keep.device) >= n


def put_back(out: Sequence[Tensor], place: Tensor, rows: Tensor, state: Sequence[Tensor]) -> None:
    """The results of the rows (beam search: sentences) that leave the batch, at their places
    in the input (index B, one past the real ones, takes those of the repeats)."""
    for o, s in zip(out, state, strict=True):
        o[place[rows]] = s[rows]


def next_tokens(
    logp: Tensor, cfg: DecodeConfig, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Each row's next token (R,) and its log-probability (R,): the argmax of ``logp`` (R, V),
    or with ``cfg.sampling`` a draw from ``generator``."""
    if cfg.sampling is None:
        best_logp, best = logp.max(dim=-1)  # (R,), (R,): value and index in one pass
        return best, best_logp
    d = cfg.sampling
    best = sample_next(logp, d.temperature, d.top_k, d.top_p, d.epsilon, generator)  # (R,)
    return best, logp.gather(1, best[:, None]).squeeze(1)


def begin(
    models: list[Transformer], src: Tensor, cfg: DecodeConfig, beams: int, use_cache: bool,
    compile: str,
) -> tuple[Rows, Tensor, Tensor]:  # fmt: skip
    """What a search of src (B, S) with ``beams`` rows per sentence starts from: the decoder
    state (``Rows``, B' >= B sentences), each sentence's limit on generated tokens (B',) and
    the tokens y (B' * beams, T_max + 1) holding ``<s>``."""
    limits = max_lengths(src, cfg, min(m.cfg.max_positions for m in models))  # (B,)
    T_max = int(limits.max())
    state = Rows(models, src, beams, T_max, use_cache, compile)
    y = torch.full(
        (state.sentences * beams, T_max + 1), PAD_ID, dtype=torch.long, device=src.device
    )
    y[:, 0] = BOS_ID
    return state, padded_to(limits, state.sentences), y


@torch.inference_mode()
def batched_greedy(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
    generator: torch.Generator | None = None,
    observe: Callable[[Tensor, Tensor, Tensor], None] | None = None,
) -> list[list[Hypothesis]]:
    """``reference.greedy_search`` for a batch src (B, S), a hypothesis per sentence; or with
    ``cfg.sampling``, ``cfg.nbest`` samples per sentence drawn with ``generator`` (default: one
    seeded with ``cfg.seed``). Finished rows stay, masked, until the live ones fit a smaller
    bucket (``survivors``); ``observe(logp, token, alive)`` sees each step (``trace.py``)."""
    n = cfg.nbest if cfg.sampling is not None else 1  # rows per sentence: a row per sample
    if n > 1:
        src = src.repeat_interleave(n, 0)  # each sentence n times
    if cfg.sampling is not None and generator is None:
        generator = torch.Generator(src.device).manual_seed(cfg.seed)
    B, device = src.size(0), src.device
    state, limits, y = begin(as_list(model), src, cfg, 1, use_cache, compile)  # y: <s> y_1 .. y_T
    R, T_max = y.shape[0], y.shape[1] - 1  # R >= B: rows past B copy real ones
    logprob = torch.zeros(R, device=device)
    steps = torch.zeros(R, dtype=torch.long, device=device)  # tokens generated, </s> included
    alive = torch.arange(R, device=device) < B
    row_of = torch.where(alive, torch.arange(R, device=device), B)  # input row; B: a copy
    done = (y.new_zeros((B + 1, T_max + 1)), logprob.new_zeros(B + 1), steps.new_zeros(B + 1))
    count, min_len = LiveCount(device), torch.tensor(cfg.min_len, device=device)
    for t in range(T_max):
        rows = (alive, logprob, steps, limits, min_len)
        fused = None if cfg.sampling else state.greedy(y, t, rows)  # compiled: choice made
        if fused is None:
            logp = state.logprobs(y, t)  # (R, V)
            if t < cfg.min_len:
                logp.select(1, EOS_ID).fill_(float("-inf"))
            best, best_logp = next_tokens(logp, cfg, generator)  # (R,), (R,)
            fused = [logp, *advance(best, best_logp, alive, logprob, steps, limits, t + 1)]
        _, y[:, t + 1], logprob, steps, alive = fused
        if observe is not None:
            observe(fused[0], y[:, t + 1], alive)
        if (kept := survivors(alive, count, state.bucket)) is None:
            continue
        keep, repeat = kept  # (R',), (R',)
        if not keep.numel():
            break
        put_back(done, row_of, (~alive).nonzero().flatten(), (y, logprob, steps))
        state.select(keep)
        y, logprob, steps, limits = y[keep], logprob[keep], steps[keep], limits[keep]
        alive, row_of = alive[keep] & ~repeat, torch.where(repeat, B, row_of[keep])
    put_back(done, row_of, torch.arange(y.size(0), device=device), (y, logprob, steps))
    y, logprob, steps = (x[:B].view(B // n, n, *x.shape[1:]) for x in done)  # by sentence
    eos = y.gather(2, steps[..., None]).squeeze(2) == EOS_ID  # (B / n, n): </s> ended it
    return Finished(logprob, y, logprob, steps - eos.long(), eos).hypotheses(B // n, n)


class Finished(NamedTuple):
    """The n best finished hypotheses of each of b sentences, best first: ``score`` (b, n)
    (-inf: none), tokens ``y`` (b, n, T+1) with ``<s>``, ``logprob`` (b, n), ``steps`` (b, n):
    tokens generated, and ``eos`` (b, n): whether ``</s>`` ended it (else the length limit)."""

    score: Tensor
    y: Tensor
    logprob: Tensor
    steps: Tensor
    eos: Tensor

    @classmethod
    def none(cls, b: int, n: int, T: int, device: torch.device) -> Finished:
        zeros = torch.zeros((b, n), dtype=torch.long, device=device)
        return cls(
            torch.full((b, n), float("-inf"), device=device),
            torch.full((b, n, T + 1), PAD_ID, dtype=torch.long, device=device),
            torch.zeros((b, n), device=device),
            zeros,
            zeros.bool(),
        )

    def merge(self, new: Finished) -> Finished:
        """These and ``new`` (b, m) candidates (-inf scores: not finished), the n best kept."""
        b, n = self.score.shape
        score, pick = torch.cat([self.score, new.score], dim=1).topk(n, dim=1)  # (b, n)

        def kept(old: Tensor, x: Tensor) -> Tensor:  # (b, n + m, ...) -> (b, n, ...)
            at = pick.view(b, n, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
            return torch.cat([old, x], dim=1).gather(1, at)

        return Finished(score, *(kept(o, x) for o, x in zip(self[1:], new[1:], strict=True)))

    def select(self, sentences: Tensor) -> Finished:
        return Finished(*(x[sentences] for x in self))

    def hypotheses(self, B: int, nbest: int) -> list[list[Hypothesis]]:
        """The n-best lists of the first B sentences, tokens without ``<s>`` and ``</s>``."""
        nbest_lists = []
        for scs, ys, lps, ns, eoss in zip(*(x[:B].tolist() for x in self), strict=True):
            hyps = [
                Hypothesis(toks[1 : steps + 1], lp, sc, eos)
                for sc, toks, lp, steps, eos in zip(scs, ys, lps, ns, eoss, strict=True)
                if sc > float("-inf")
            ]
            nbest_lists.append(hyps[:nbest])
        return nbest_lists


def expand(logp: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2k continuations of each sentence's k beams, from ``logp`` (b*k, V) and the
    beams' ``scores`` (b, k): their log-probabilities (b, 2k), best first, the beam each
    extends (b, 2k) and its token (b, 2k)."""
    (b, k), V = scores.shape, logp.size(-1)
    cand = (logp + scores.view(-1, 1)).view(b, k * V)  # (b, k*V)
    top, idx = cand.topk(min(2 * k, k * V), dim=1)  # (b, 2k), best first
    return top, idx // V, idx % V


@torch.inference_mode()
def batched_beam(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
    observe: Callable[..., None] | None = None,
) -> list[list[Hypothesis]]:
    """``reference.beam_search`` for a batch src (B, S): the ``cfg.nbest`` best hypotheses per
    sentence by ``logprob / lp(|Y|)``. Beams are (B*k) rows, sentence-major; finished ones are
    merged into each sentence's n best (``Finished``, n = max(k, nbest)). Done sentences stay,
    masked, until the live ones fit a smaller bucket (``survivors``);
    ``observe(logp, beam, token, ends, pos, scores, done)`` sees each step (``trace.py``).
    """
    k, B, device = cfg.beam, src.size(0), src.device
    state, limits, y = begin(as_list(model), src, cfg, k, use_cache, compile)
    b, T_max = state.sentences, y.shape[1] - 1  # b >= B: sentences past B copy real ones
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: expand only the first at step 0
    done = torch.arange(b, device=device) >= B  # (b,) the copies are done from the start
    sent_of = torch.where(done, B, torch.arange(b, device=device))  # input sentence; B: a copy
    fin, out = (Finished.none(n, max(k, cfg.nbest), T_max, device) for n in (b, B + 1))
    first_k = torch.arange(2 * k, device=device) < k  # (2k,)
    count = LiveCount(device)
    for t in range(T_max):
        logp = state.logprobs(y, t)  # (b*k, V)
        if t < cfg.min_len:
            logp.select(1, EOS_ID).fill_(float("-inf"))
        top, beam, token = expand(logp, scores)  # (b, 2k) each
        parent = torch.arange(b, device=device)[:, None] * k + beam  # (b, 2k): rows of y
        # the first k candidates finish if they end in </s> or reach the length limit
        at_limit, eos = limits <= t + 1, token == EOS_ID  # (b,), (b, 2k)
        ends = (eos | at_limit[:, None]) & first_k[: top.size(1)] & top.isfinite() & ~done[:, None]
        new_y = y[parent.flatten()].view(b, -1, T_max + 1)  # (b, 2k, T_max + 1)
        new_y[:, :, t + 1] = token.masked_fill(eos, PAD_ID)  # </s> is no token of the output
        new_score = (top / length_penalty(t + 1, cfg.alpha)).masked_fill(~ends, float("-inf"))
        fin = fin.merge(Finished(new_score, new_y, top, (t + 1) - eos.long(), eos))
        # the best k that do not end live on
        scores, pos = top.masked_fill(eos, float("-inf")).topk(k, dim=1)  # (b, k)
        state.reorder = rows = parent.gather(1, pos).flatten()  # (b*k,)
        y = y[rows]
        y[:, t + 1] = token.gather(1, pos).flatten()
        reach = length_penalty(limits.clamp(min=t + 2), cfg.alpha)  # (b,) lp's max ahead
        beaten = scores[:, 0] / reach <= fin.score[:, k - 1]  # (b,) none live beats the k-th
        done = done | at_limit | beaten
        if observe is not None:
            observe(logp, beam, token, ends, pos, scores, done)
        if (kept := survivors(~done, count, state.bucket)) is None:
            continue
        keep, repeat = kept  # (b',), (b',)
        if not keep.numel():
            break
        put_back(out, sent_of, done.nonzero().flatten(), fin)
        state.select(keep)
        rows = (keep[:, None] * k + torch.arange(k, device=device)).flatten()  # (b'*k,)
        y, scores, limits, fin = y[rows], scores[keep], limits[keep], fin.select(keep)
        done, sent_of, b = repeat, torch.where(repeat, B, sent_of[keep]), keep.numel()
    put_back(out, sent_of, torch.arange(b, device=device), fin)
    return out.hypotheses(B, cfg.nbest)


def search(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """The n-best list of each sentence of src (B, S): ``batched_greedy`` (and sampling) for
    ``beam == 1``, else ``batched_beam``; ``model``: one model, or several as an ensemble. On
    the CPU a search of very few rows runs on one thread (``search_threads``)."""
    n = cfg.nbest if cfg.sampling is not None else cfg.beam  # rows per sentence
    with search_threads(src.device, src.size(0) * n):
        if cfg.beam == 1:
            return batched_greedy(model, src, cfg, use_cache, compile, generator)
        return batched_beam(model, src, cfg, use_cache, compile)
