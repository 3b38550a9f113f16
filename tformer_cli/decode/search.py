"""Search for translations with the KV cache: batched greedy decoding and beam search."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.decode.reference import Hypothesis, length_penalty, max_lengths
from tformer_cli.decode.sampling import sample_next
from tformer_cli.decode.step import DecodeStep, next_logprobs, round_up
from tformer_cli.model import Transformer

DEFAULT = DecodeConfig()


Models = Transformer | Sequence[Transformer]


def as_list(models: Models) -> list[Transformer]:
    return [models] if isinstance(models, nn.Module) else list(models)


def ensemble(logps: list[Tensor]) -> Tensor:
    """log of the mean of the models' next-token probabilities (R, V), as fairseq ensembles:
    a token any model finds likely stays likely (a mean of log-probabilities, a product of
    experts, would let one confident model veto the others)."""
    if len(logps) == 1:
        return logps[0]
    return torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))  # (R, V)


class Rows:
    """The decoder state behind a search's rows, ``beams`` per sentence, for one model or an
    ensemble (each model with its own state): the KV cache read by the static-shape
    ``DecodeStep`` or, without a cache (for comparison and teaching), the memory against which
    the whole prefix is decoded again at each step. Sentences (and their rows) may be padded up
    to a bucket with copies of real ones; the search ignores them."""

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
            cache.span = min(round_up(t + 1, step.buckets.span), cache.self_kv.size(4))
            logps.append(step(y[:, t], cache, rows))
        return ensemble(logps)

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
    late on a GPU, where the count travels through pinned memory while the next step is
    already queued, so that the GPU never idles waiting for the host (the price: at most one
    step past the last live row, its updates masked)."""

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


@torch.inference_mode()
def greedy_search(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
    generator: torch.Generator | None = None,
) -> list[Hypothesis]:
    """Pick the most probable next token (or, with ``cfg.sampling``, draw it with
    ``generator``) until ``</s>`` or the length limit, for a batch src (B, S).

    With the cache each step feeds only the newest token; without it the whole prefix is
    decoded again (for comparison and teaching). Finished rows stay in the batch, their updates
    masked, until the live ones fit a smaller bucket; the one host transfer per step is the
    number of live rows (``LiveCount``). A hypothesis' ``logprob`` (= its ``score``) is the
    model's own, whatever truncation the sampling applied.
    """
    models, B, device = as_list(model), src.size(0), src.device
    limits = max_lengths(src, cfg, min(m.cfg.max_positions for m in models))  # (B,)
    T_max = int(limits.max())
    state = Rows(models, src, 1, T_max, use_cache, compile)
    draw = cfg.sampling
    R = state.sentences
    pad_rows = torch.arange(R, device=device) >= B  # (R,) copies of real rows
    limits = padded_to(limits, R)
    y = torch.full((R, T_max + 1), PAD_ID, dtype=torch.long, device=device)  # <s> y_1 .. y_T
    y[:, 0] = BOS_ID
    logprob = torch.zeros(R, device=device)
    steps = torch.zeros(R, dtype=torch.long, device=device)  # tokens generated, </s> included
    alive = ~pad_rows
    count = LiveCount(device)
    row_of = torch.where(pad_rows, B, torch.arange(R, device=device))  # original row; B: none
    done_y, done_logprob, done_steps = (
        y.new_zeros((B + 1, T_max + 1)),
        logprob.new_zeros(B + 1),
        steps.new_zeros(B + 1),
    )

    def keep_results(rows: Tensor) -> None:  # rows: (n,) into the state's rows
        done_y[row_of[rows]] = y[rows]
        done_logprob[row_of[rows]] = logprob[rows]
        done_steps[row_of[rows]] = steps[rows]

    for t in range(T_max):
        logp = state.logprobs(y, t)  # (R, V)
        if t < cfg.min_len:
            logp.select(1, EOS_ID).fill_(float("-inf"))
        if draw is None:
            best_logp, best = logp.max(dim=-1)  # (R,), (R,): value and index in one pass
        else:
            best = sample_next(
                logp, draw.temperature, draw.top_k, draw.top_p, draw.epsilon, generator
            )
            best_logp = logp.gather(1, best[:, None]).squeeze(1)  # (R,)
        logprob = torch.where(alive, logprob + best_logp, logprob)
        y[:, t + 1] = torch.where(alive, best, PAD_ID)
        steps = torch.where(alive, t + 1, steps)
        alive = alive & (best != EOS_ID) & (limits > t + 1)
        live = count(alive)
        if live == 0:
            break
        if live is None or state.bucket(live) == y.size(0):
            continue
        live_rows = alive.nonzero().flatten()
        if live_rows.numel() == 0:
            break
        if state.bucket(live_rows.numel()) < y.size(0):  # fewer rows: finished ones leave
            keep_results((~alive).nonzero().flatten())
            keep = padded_to(live_rows, state.bucket(live_rows.numel()))  # (R',)
            state.select(keep)
            repeat = torch.arange(keep.numel(), device=device) >= live_rows.numel()
            y, logprob, steps, limits = y[keep], logprob[keep], steps[keep], limits[keep]
            alive, row_of = alive[keep] & ~repeat, torch.where(repeat, B, row_of[keep])
    keep_results(torch.arange(y.size(0), device=device))
    ended = done_y.gather(1, done_steps[:, None]).squeeze(1) == EOS_ID  # (B+1,)
    out = []
    for tokens, lp, n, eos in zip(
        done_y[:B].tolist(),
        done_logprob[:B].tolist(),
        done_steps[:B].tolist(),
        ended[:B].tolist(),
        strict=True,
    ):
        out.append(Hypothesis(tokens[1 : n + 1 - eos], lp, lp, eos))
    return out


@torch.inference_mode()
def beam_search(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
) -> list[list[Hypothesis]]:
    """The ``cfg.nbest`` best hypotheses per sentence of src (B, S), best first, by
    ``logprob / lp(|Y|)``.

    Beams are flattened to (B*k) rows, sentence-major. Each step: add every continuation's
    log-probability to its beam's score, take the top 2k of the sentence's k*V candidates;
    those in the top k that end in ``</s>`` are finished and merged into the sentence's n best
    finished ones (tensors, n = max(k, nbest)), the best k others live on (the cache rows
    reordered to follow them). A sentence is done when it has k finished hypotheses and no
    live beam can still beat the worst of them: scores only fall as tokens are added, so a live
    beam's best reachable normalised score is its score over lp at the length that maximises it.
    Done sentences stay, masked, until the live ones fit a smaller bucket; the one host
    transfer per step is the number of live sentences (``LiveCount``). Cross-attention K, V
    stay one copy per sentence.
    """
    models, k, B, device = as_list(model), cfg.beam, src.size(0), src.device
    n = max(k, cfg.nbest)
    limits = max_lengths(src, cfg, min(m.cfg.max_positions for m in models))  # (B,)
    T_max = int(limits.max())
    state = Rows(models, src, k, T_max, use_cache, compile)
    b = state.sentences
    limits = padded_to(limits, b)
    done = torch.arange(b, device=device) >= B  # (b,) padding sentences are done from the start
    sent_of = torch.where(done, B, torch.arange(b, device=device))  # original sentence; B: none
    y = torch.full((b * k, T_max + 1), PAD_ID, dtype=torch.long, device=device)
    y[:, 0] = BOS_ID
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: expand only the first at step 0
    # the n best finished hypotheses of each sentence, best first: score, then tokens, logprob,
    # token count and whether </s> ended it (else the length limit did)
    fin_score = scores.new_full((b, n), float("-inf"))
    fin = (y.new_full((b, n, T_max + 1), PAD_ID), scores.new_zeros((b, n)),
           y.new_zeros((b, n)), torch.zeros((b, n), dtype=torch.bool, device=device))  # fmt: skip
    out_score = fin_score.new_full((B + 1, n), float("-inf"))
    out = tuple(x.new_zeros((B + 1, *x.shape[1:])) for x in fin)

    def keep_results(sentences: Tensor) -> None:  # (m,) into the state's sentences
        at = sent_of[sentences]
        out_score[at] = fin_score[sentences]
        for o, f in zip(out, fin, strict=True):
            o[at] = f[sentences]

    first_k = torch.arange(2 * k, device=device) < k  # (2k,)
    count = LiveCount(device)
    for t in range(T_max):
        logp = state.logprobs(y, t)  # (b*k, V)
        if t < cfg.min_len:
            logp.select(1, EOS_ID).fill_(float("-inf"))
        V = logp.size(-1)
        cand = (logp + scores.view(-1, 1)).view(b, k * V)  # (b, k*V)
        top, idx = cand.topk(min(2 * k, k * V), dim=1)  # (b, 2k), best first
        beam, token = idx // V, idx % V  # (b, 2k)
        parent = torch.arange(b, device=device)[:, None] * k + beam  # (b, 2k): rows of y
        at_limit = limits <= t + 1  # (b,)
        eos = token == EOS_ID
        ends = (eos | at_limit[:, None]) & first_k[: top.size(1)] & top.isfinite() & ~done[:, None]
        # the candidates that end now, merged into the finished ones: (b, n + 2k) -> (b, n)
        new_y = y[parent.flatten()].view(b, -1, T_max + 1)  # (b, 2k, T_max + 1)
        new_y[:, :, t + 1] = token.masked_fill(eos, PAD_ID)  # </s> is no token of the output
        new_score = (top / length_penalty(t + 1, cfg.alpha)).masked_fill(~ends, float("-inf"))
        fin_score, pick = torch.cat([fin_score, new_score], dim=1).topk(n, dim=1)  # (b, n)
        new = (new_y, top, (t + 1) - eos.long(), eos)
        fin = tuple(
            torch.cat([f, x], dim=1).gather(
                1, pick.view(b, n, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
            )
            for f, x in zip(fin, new, strict=True)
        )
        # the best k that do not end live on
        scores, pos = top.masked_fill(eos, float("-inf")).topk(k, dim=1)  # (b, k)
        rows = parent.gather(1, pos).flatten()  # (b*k,)
        y = y[rows]
        y[:, t + 1] = token.gather(1, pos).flatten()
        state.reorder = rows
        reach = length_penalty(limits.clamp(min=t + 2), cfg.alpha)  # (b,) lp's max ahead
        beaten = scores[:, 0] / reach <= fin_score[:, k - 1]  # (b,) nothing live beats the k-th
        done = done | at_limit | beaten
        live = count(~done)
        if live == 0:
            break
        if live is None or state.bucket(live) == b:
            continue
        live_sentences = (~done).nonzero().flatten()
        if live_sentences.numel() == 0:
            break
        if state.bucket(live_sentences.numel()) < b:  # fewer sentences: done ones leave
            keep_results(done.nonzero().flatten())
            keep = padded_to(live_sentences, state.bucket(live_sentences.numel()))  # (b',)
            state.select(keep)
            repeat = torch.arange(keep.numel(), device=device) >= live_sentences.numel()
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).flatten()
            y, scores, limits, fin_score = y[keep_rows], scores[keep], limits[keep], fin_score[keep]
            fin = tuple(f[keep] for f in fin)
            done, sent_of = repeat, torch.where(repeat, B, sent_of[keep])
            b = keep.numel()
    keep_results(torch.arange(b, device=device))
    nbest = []
    for scs, ys, lps, ns, eoss in zip(*(x[:B].tolist() for x in (out_score, *out)), strict=True):
        hyps = [
            Hypothesis(toks[1 : steps + 1], lp, sc, eos)
            for sc, toks, lp, steps, eos in zip(scs, ys, lps, ns, eoss, strict=True)
            if sc > float("-inf")
        ]
        nbest.append(hyps[: cfg.nbest])
    return nbest


def search(
    model: Models,
    src: Tensor,
    cfg: DecodeConfig = DEFAULT,
    use_cache: bool = True,
    compile: str = "auto",
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """The n-best list of each sentence of src (B, S): greedy for ``beam == 1``, else beam
    search; with ``cfg.sampling``, ``cfg.nbest`` samples drawn with ``generator`` (default: one
    seeded with ``cfg.seed``). ``model``: one model, or several as an ensemble (``ensemble``)."""
    if cfg.sampling is not None:
        if generator is None:
            generator = torch.Generator(src.device).manual_seed(cfg.seed)
        n = cfg.nbest  # each sentence n times: a row per sample
        rows = greedy_search(model, src.repeat_interleave(n, 0), cfg, use_cache, compile, generator)
        return [rows[i * n : (i + 1) * n] for i in range(src.size(0))]
    if cfg.beam == 1:
        return [[h] for h in greedy_search(model, src, cfg, use_cache, compile)]
    return beam_search(model, src, cfg, use_cache, compile)
