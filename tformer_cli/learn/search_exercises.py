"""The exercises of decoding and training: the KV cache, greedy decoding with it, the GNMT length
penalty and beam search; the exposure-bias excess error and the scheduled-sampling input mix."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from tformer_cli.config import DecodeConfig, ModelConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.data.tokenizer import BOS_ID, PAD_ID
from tformer_cli.decode import reference
from tformer_cli.learn.cases import Args, Case, Exercise, fields, randn, words
from tformer_cli.model import Transformer
from tformer_cli.model.attention import write_cache
from tformer_cli.report.exposure import accumulation
from tformer_cli.training.loss import label_smoothed_loss
from tformer_cli.training.scheduled_sampling import mix_inputs


@functools.cache
def decoding_model() -> Transformer:
    """A tiny Transformer trained for a moment to reverse word sequences: its hypotheses end
    with ``</s>`` at different steps or run into the length limit (an untrained model's almost
    never end), so the searches' every branch is checked. Seeded, the global generator left as
    it was: the same model each time."""
    cfg = ModelConfig(vocab_size=12, d_model=16, h=2, d_ff=32, n_encoder_layers=1,
                      n_decoder_layers=1, dropout=0.0, max_positions=32)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 6, (32,), generator=g).tolist()
    sources = [torch.randint(4, 12, (n,), generator=g).tolist() for n in lengths]
    batch = make_batch(sources, [s[::-1] for s in sources])
    real = batch.tgt_out != PAD_ID
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(0)
        model = Transformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(20):
            logits = model(batch.src, batch.tgt_in)[real]
            loss = label_smoothed_loss(logits, batch.tgt_out[real], 0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


# ---------------------------------------------------------------------------- decoding
def cache_inputs(filled: int, slots: list[int], span: int) -> Args:
    """A buffer (2, B=1, h=2, T_max=6, d_k=4) with ``filled`` slots written, new K, V for
    ``slots``, the span to return."""
    cache = torch.zeros(2, 1, 2, 6, 4)
    cache[:, :, :, :filled] = randn(2, 1, 2, filled, 4)
    return cache, torch.tensor(slots), randn(2, 1, 2, len(slots), 4, seed=1), span


WRITE_CACHE = Exercise(
    write_cache,
    "decoding",
    "the KV cache",
    """The self-attention cache of incremental decoding: at step t the decoder feeds only the
    newest token, and its queries attend to the keys and values of all tokens so far, which
    the cache keeps: K_{1..t} = [K_{1..t-1}; K_t].

    cache (2, B, h, T_max, d_k) is the buffer of K (cache[0]) and V (cache[1]); slots (T,)
    the positions of the T new tokens; kv (2, B, h, T, d_k) their keys and values. Write kv
    into the buffer itself (in place: the next step reads it) at those slots, and return the
    K and V of its first ``span`` slots, each (B, h, span, d_k).""",
    "cache[:, :, :, slots] = kv, in place; then the first span slots of K and of V.",
    (
        Case("step 3: slot 3, span 4", lambda: cache_inputs(3, [3], 4)),
        Case("two tokens at slots 1 and 2, span 6", lambda: cache_inputs(1, [1, 2], 6)),
        Case("the first step: slot 0, span 1", lambda: cache_inputs(0, [0], 1)),
    ),
    observed=lambda out, args: {"returned": out, "the cache after the call": args[0]},
)


def search_inputs(source: list[int], **cfg: Any) -> Args:
    """The decoding model, a source (word ids, no ``</s>``), its settings: at most |src| + 3
    tokens unless ``cfg`` says otherwise."""
    return decoding_model(), source, DecodeConfig(**{"max_len_a": 1.0, "max_len_b": 3, **cfg})


def hypothesis(h: Any) -> dict[str, Any]:
    return fields(h, "tokens", "logprob", "score", "finished")


GREEDY = Exercise(
    reference.greedy_search_cached,
    "decoding",
    "greedy decoding with a KV cache",
    """Greedy decoding of one source with the KV cache: y_t = argmax_v log p(v | x, y_<t),
    until </s> or the length limit.

    src, limit = as_source(model, source, cfg) gives the source (1, S) with its </s> and the
    most tokens to generate (</s> included). Encode once (model.encode(src) -> memory,
    src_mask), make the cache (model.init_cache(memory, src_mask, limit)), then at each step
    feed only the newest token, <s> first, as a (1, 1) tensor: model.decode(y, None, None,
    cache) returns its logits (1, 1, V) and writes its keys and values into the cache;
    next_logprobs(logits[:, -1]) turns them into log-probabilities (1, V). While fewer than
    cfg.min_len tokens are out, </s> is forbidden (-inf). The score is the sum of the chosen
    tokens' log-probabilities, </s> included. Returns Hypothesis(tokens, logprob, score=logprob,
    finished): tokens without <s> or </s>, finished True when </s> ended it.""",
    "Encode once, feed one token a step through the cache, forbid </s> before min_len, add up"
    " the log-probabilities (</s>'s too), stop at </s> or at the limit.",
    (
        Case("source [5, 6, 7]", lambda: search_inputs([5, 6, 7])),
        Case("source [10, 11, 4, 8]", lambda: search_inputs([10, 11, 4, 8])),
        Case("min_len 3, source [4, 9]", lambda: search_inputs([4, 9], min_len=3)),
        Case(
            "a limit of 2 tokens",
            lambda: search_inputs([7, 7, 5, 9, 10], max_len_a=0.0, max_len_b=2),
        ),
    ),
    helpers=("as_source", "next_logprobs", "BOS_ID", "EOS_ID"),
    observed=lambda out, args: hypothesis(out),
)

LENGTH_PENALTY = Exercise(
    reference.length_penalty,
    "6.1; Wu et al. 2016, 7",
    "the GNMT length penalty",
    """The length penalty of Wu et al. (2016), by which beam search divides a finished
    hypothesis' log-probability, so that longer ones are not ruled out for being long:

        lp(Y) = ((5 + |Y|) / 6) ** alpha

    |Y| counts the tokens, </s> included. length: an int or a tensor of ints.""",
    "((5 + length) / 6) ** alpha.",
    (
        Case("length 1, alpha 0.6", lambda: (1, 0.6)),
        Case("lengths [1, 2, 10], alpha 1", lambda: (torch.tensor([1, 2, 10]), 1.0)),
        Case("alpha 0", lambda: (7, 0.0)),
    ),
)

BEAM = Exercise(
    reference.beam_search,
    "6.1",
    "beam search with the GNMT length penalty",
    """Beam search of one source, without a cache: the cfg.nbest best hypotheses by
    logprob / length_penalty(|Y|, cfg.alpha), best first.

    src, limit = as_source(model, source, cfg); prefix_logprobs(model, src, tokens, cfg) gives
    log p(. | x, tokens) (V,), </s> already forbidden before cfg.min_len. Keep k = cfg.beam
    live beams (log-probability, tokens), starting from one empty beam. At each step t (0 ..
    limit-1) extend every live beam by its 2k best tokens and sort all those candidates by
    log-probability; of the best k, those that end in </s> (or reach the limit, t + 1 ==
    limit) finish, with score logprob / length_penalty(t + 1, alpha); the best k candidates
    that do not end in </s> live on. Stop when no beam lives, or when k have finished and the
    best live beam cannot beat the k-th finished one even at the limit: its logprob /
    length_penalty(limit, alpha) <= that score. Returns Hypothesis(tokens, logprob, score,
    finished) objects: tokens without </s>, logprob with it, finished False for those cut at
    the limit.""",
    "Rank live beams by their plain log-probability; divide by lp(|Y|), </s> counted, only when"
    " a hypothesis finishes; stop only when no live beam can beat the k-th finished one.",
    (
        Case("beam 3, 3-best, alpha 0.6", lambda: search_inputs([5, 6, 7], beam=3, nbest=3)),
        Case("beam 2, alpha 0", lambda: search_inputs([10, 11, 4, 8], beam=2, nbest=2, alpha=0.0)),
        Case(
            "beam 4, 4-best, alpha 1, min_len 2",
            lambda: search_inputs([4, 9], beam=4, nbest=4, alpha=1.0, min_len=2),
        ),
        Case(
            "beam 3, a limit of 2 tokens",
            lambda: search_inputs([7, 7, 5, 9, 10], beam=3, nbest=3, max_len_a=0.0, max_len_b=2),
        ),
    ),
    helpers=("as_source", "prefix_logprobs", "EOS_ID"),
    observed=lambda out, args: (
        [hypothesis(h) for h in out] if isinstance(out, list | tuple) else out
    ),
)


# ---------------------------------------------------------------------------- exposure bias
def by_hand() -> Args:
    """Three references (``</s>`` = 3 last) and both passes' predictions, aligned."""
    gold = [[5, 6, 7, 8, 3], [5, 5, 3], [8, 9, 4, 3]]
    clean = [[5, 4, 7, 8, 3], [5, 5, 3], [8, 9, 9, 9]]
    self_injected = [[5, 4, 6, 9, 3], [5, 5, 3], [8, 9, 9, 3]]
    return gold, clean, self_injected


def random_passes(n: int = 20, seed: int = 0) -> Args:
    """``n`` references of 2 to 8 tokens and predictions wrong at random, more often in the
    self-injected pass."""
    g = torch.Generator().manual_seed(seed)

    def noisy(rows: list[list[int]], p: float) -> list[list[int]]:
        return [[4 + int(torch.randint(4, (1,), generator=g)) if torch.rand(1, generator=g) < p
                 else tok for tok in row] for row in rows]  # fmt: skip

    lengths = torch.randint(1, 8, (n,), generator=g).tolist()
    gold = [[*torch.randint(4, 8, (k,), generator=g).tolist(), 3] for k in lengths]
    return gold, noisy(gold, 0.15), noisy(gold, 0.3)


EXCESS_ERROR = Exercise(
    accumulation,
    "exposure_bias.md, 4",
    "the exposure-bias excess error",
    """Error accumulation under the model's own errors (docs/exposure_bias.md, section 4).
    Two teacher-forced passes over the same references, positions aligned: the clean pass
    reads the gold prefix, its predictions clean_preds; the self-injected pass reads the gold
    prefix with every token the clean pass got wrong replaced by its own prediction, its
    predictions self_preds. gold, clean_preds, self_preds: per sentence, one token per target
    position (</s> included).

    Over the positions strictly after each sentence's first clean-pass error (a sentence
    without an error counts no position): err_clean and err_self, the shares of those
    positions where each pass's prediction differs from the gold token, and

        excess_error = err_self - err_clean

    Return an object with attributes err_clean, err_self and excess_error (tformer's
    Accumulation has more; types.SimpleNamespace will do), each None where no position
    counts.""",
    "Count only positions after a sentence's first clean-pass error, in both rates;"
    " excess_error is their difference.",
    (
        Case("three sentences by hand", by_hand),
        Case("no errors at all", lambda: (by_hand()[0],) * 3),
        Case("twenty random sentences", random_passes),
    ),
    observed=lambda out, args: fields(out, "err_clean", "err_self", "excess_error"),
)


# ---------------------------------------------------------------------------- scheduled sampling
def mix_args(eps: float, rows: int = 3, length: int = 6) -> Args:
    """Decoder inputs ``<s> y*`` (rows, length), padded; pass-1 predictions; eps; a generator."""
    gold = words([length - 1 - i % 3 for i in range(rows)])
    tgt_in = torch.cat([torch.full((rows, 1), BOS_ID), gold], dim=1)
    predicted = torch.randint(4, 10, (rows, length), generator=torch.Generator().manual_seed(5))
    return tgt_in, predicted, eps, torch.Generator().manual_seed(0)


def judge_mix(args: Args, out: Any) -> str | None:
    """The scheduled-sampling mix at 0 < eps < 1, whatever the order of the random draws: each
    input the gold token or the prediction made one position earlier, ``<s>`` and padding
    kept, and the gold share of the positions where the two differ near eps."""
    tgt_in, predicted, eps, _ = args
    shifted = torch.cat([tgt_in[:, :1], predicted[:, :-1]], dim=1)
    if not isinstance(out, Tensor) or out.shape != tgt_in.shape:
        return f"expected a tensor of shape {tuple(tgt_in.shape)}, got {type(out).__name__}"
    special = (tgt_in == BOS_ID) | (tgt_in == PAD_ID)
    if not ((out == tgt_in) | (out == shifted)).all() or (out[special] != tgt_in[special]).any():
        return "an input that is neither gold nor the model's prediction for its slot"
    mixed = ~special & (tgt_in != shifted)
    share = float((out[mixed] == tgt_in[mixed]).float().mean())
    if abs(share - eps) > 0.05:
        return f"gold at {share:.2f} of the mixed positions, where P(gold) = {eps} (+- 0.05)"
    return None


MIX = Exercise(
    mix_inputs,
    "Bengio et al. 2015",
    "the scheduled-sampling input mix",
    """The decoder input of scheduled sampling's second pass (Bengio et al., 2015; for
    Transformers, Mihaylova and Martins, 2019). Pass 1 read the gold inputs tgt_in (B, T),
    <s> first, and predicted at each position t the token of position t + 1: predicted (B, T).
    Pass 2 reads at each position the gold token with probability eps (draw a coin per
    position with torch.rand(..., generator=generator) < eps), and otherwise the model's
    prediction for that position, the one made a position earlier. <s> and padding (PAD_ID)
    stay as they are. Returns (B, T).""",
    "The prediction for slot t is predicted[:, t-1] (shift right by one); gold where a coin"
    " with P(gold) = eps says so; <s> and padding kept.",
    (
        Case("eps 0: every input the model's", lambda: mix_args(0.0)),
        Case("eps 1: every input gold", lambda: mix_args(1.0)),
        Case("eps 0.3, 64 sentences", lambda: mix_args(0.3, 64, 40), "sample", judge=judge_mix),
    ),
    helpers=("BOS_ID", "PAD_ID"),
)
