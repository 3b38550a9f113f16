"""The common mistakes that ``tformer learn check`` recognises, each a known-wrong variant (a
"mutant") of tformer's function with the same signature.

When a learner's function fails its check, the checker runs the mutants of that exercise on the
same inputs: a mutant whose outputs the learner's match is the mistake made, and its ``hint``
says what to change. Matching outputs, rather than reading code, recognises a mistake however it
is written. The tests feed each mutant to the checker and expect exactly its exercise to fail,
with its hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.decode.reference import (
    Hypothesis,
    as_source,
    length_penalty,
    next_logprobs,
    prefix_logprobs,
)
from tformer_cli.model import Transformer
from tformer_cli.model.attention import attention, causal_mask, padding_mask
from tformer_cli.model.functional import AttentionWeights, layer_norm, residual
from tformer_cli.model.layers import sinusoidal_positions


@dataclass(frozen=True)
class Mistake:
    """A named mistake in ``exercise``: a mutant ``fn``, what it does wrong (``title``) and how
    to put it right (``hint``)."""

    name: str
    exercise: str
    title: str
    hint: str
    fn: Callable[..., Any]


# ---------------------------------------------------------------------------- positions
def positions_swapped(max_len: int, d_model: int) -> Tensor:
    pe = sinusoidal_positions(max_len, d_model)
    return torch.stack([pe[:, 1::2], pe[:, 0::2]], dim=-1).flatten(1)  # cos, sin, cos, ...


def positions_by_column(max_len: int, d_model: int) -> Tensor:
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    column = torch.arange(d_model)
    angle = pos / 10000.0 ** (column / d_model)  # column j's own exponent, not its pair's 2i
    return torch.where(column % 2 == 0, angle.sin(), angle.cos())


def positions_in_halves(max_len: int, d_model: int) -> Tensor:
    pe = sinusoidal_positions(max_len, d_model)
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)


# ---------------------------------------------------------------------------- attention
def attention_variant(
    scale: Callable[[int], float] = math.sqrt, axis: int = -1, mask: str = "scores"
) -> Callable[..., tuple[Tensor, Tensor]]:
    """Attention dividing the scores by ``scale(d_k)``, its softmax over ``axis``, the mask
    added to the ``scores``, or zeroing the weights ``after`` the softmax, or ``ignored``."""

    def attend(q: Tensor, k: Tensor, v: Tensor, m: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = q @ k.transpose(-2, -1) / scale(q.size(-1))
        if m is not None and mask == "scores":
            scores = scores + m
        weights = scores.softmax(dim=axis)
        if m is not None and mask == "after":
            weights = weights.masked_fill(m.isinf(), 0.0)
        return weights @ v, weights

    return attend


# ---------------------------------------------------------------------------- masks
def causal_diagonal_hidden(size: int, device: torch.device | None = None) -> Tensor:
    hidden = torch.ones(size, size, dtype=torch.bool, device=device).triu(0)  # j >= i
    return torch.zeros(size, size, device=device).masked_fill(hidden, float("-inf"))


def causal_transposed(size: int, device: torch.device | None = None) -> Tensor:
    return causal_mask(size, device).T.contiguous()


def padding_inverted(tokens: Tensor, pad_id: int) -> Tensor:
    return padding_mask(torch.where(tokens == pad_id, pad_id + 1, pad_id), pad_id)


def padding_boolean(tokens: Tensor, pad_id: int) -> Tensor:
    return (tokens == pad_id)[:, None, None, :]


def padding_flat(tokens: Tensor, pad_id: int) -> Tensor:
    return padding_mask(tokens, pad_id)[:, 0, 0, :]  # (B, S)


# ---------------------------------------------------------------------------- multi-head
def multi_head_variant(split: str = "features", concat: str = "transposed", w_o: bool = True):
    """Multi-head attention splitting the heads across ``positions`` (not each position's
    ``features``), concatenating them ``untransposed``, or with no W^O."""

    def multi_head_attention(
        x: Tensor, memory: Tensor, weights: AttentionWeights, h: int, mask: Tensor | None = None
    ) -> Tensor:
        def heads(t: Tensor) -> Tensor:
            B, T, d = t.shape
            if split == "positions":
                return t.reshape(B, h, T, d // h)
            return t.view(B, T, h, d // h).transpose(1, 2)

        w = weights
        q = heads(x @ w.w_q.T + w.b_q)
        k, v = heads(memory @ w.w_k.T + w.b_k), heads(memory @ w.w_v.T + w.b_v)
        out, _ = attention(q, k, v, mask)
        B, _, T, _ = out.shape
        joined = out.transpose(1, 2) if concat == "transposed" else out
        joined = joined.reshape(B, T, -1)
        return joined @ w.w_o.T + w.b_o if w_o else joined

    return multi_head_attention


# ---------------------------------------------------------------------------- LayerNorm
def norm_variant(
    variance: int = 0, eps: str = "inside", axis: int = -1, detach: bool = False
) -> Callable[..., Tensor]:
    """LayerNorm with the variance's ``correction`` (1: unbiased), eps ``inside`` or
    ``outside`` the square root or ``none``, statistics over ``axis``, or ``detach``-ed."""

    def norm(x: Tensor, gamma: Tensor, beta: Tensor, e: float = 1e-5) -> Tensor:
        mean, var = (
            x.mean(dim=axis, keepdim=True),
            x.var(dim=axis, correction=variance, keepdim=True),
        )
        if detach:
            mean, var = mean.detach(), var.detach()
        std = {"inside": torch.sqrt(var + e), "outside": var.sqrt() + e, "none": var.sqrt()}[eps]
        return gamma * (x - mean) / std + beta

    return norm


# ---------------------------------------------------------------------------- residual
Sublayer = Callable[[Tensor], Tensor]


def residual_swapped(x: Tensor, sublayer: Sublayer, gamma: Tensor, beta: Tensor, pre_norm: bool):
    return residual(x, sublayer, gamma, beta, not pre_norm)


def residual_from_normed(
    x: Tensor, sublayer: Sublayer, gamma: Tensor, beta: Tensor, pre_norm: bool
):
    if not pre_norm:
        return residual(x, sublayer, gamma, beta, pre_norm)
    normed = layer_norm(x, gamma, beta)
    return normed + sublayer(normed)


def residual_norm_inside(
    x: Tensor, sublayer: Sublayer, gamma: Tensor, beta: Tensor, pre_norm: bool
):
    if pre_norm:
        return residual(x, sublayer, gamma, beta, pre_norm)
    return x + layer_norm(sublayer(x), gamma, beta)


# ---------------------------------------------------------------------------- FFN, embeddings
def ffn_linear(x: Tensor, w_1: Tensor, b_1: Tensor, w_2: Tensor, b_2: Tensor) -> Tensor:
    return (x @ w_1.T + b_1) @ w_2.T + b_2


def ffn_relu_out(x: Tensor, w_1: Tensor, b_1: Tensor, w_2: Tensor, b_2: Tensor) -> Tensor:
    return torch.relu(torch.relu(x @ w_1.T + b_1) @ w_2.T + b_2)


def embed_unscaled(tokens: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    return table[tokens] + positions[: tokens.size(1)]


def embed_positions_scaled(tokens: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    return (table[tokens] + positions[: tokens.size(1)]) * math.sqrt(table.size(1))


def output_probabilities(x: Tensor, table: Tensor) -> Tensor:
    return torch.softmax(x @ table.T, dim=-1)


def output_first_axis(x: Tensor, table: Tensor) -> Tensor:
    return torch.log_softmax(x @ table.T, dim=0)


# ---------------------------------------------------------------------------- the loss
def loss_variant(reduce: str = "sum", smoothed: bool = True, gold_share: str = "1 - eps"):
    """The label-smoothed loss ``reduce``-d over rows, without smoothing, or giving the gold
    token its full mass (``gold_share`` "1")."""

    def label_smoothed_loss(logits: Tensor, gold: Tensor, smoothing: float) -> Tensor:
        eps = smoothing if smoothed else 0.0
        logp = logits.log_softmax(dim=-1)  # (N, V)
        share = 1 - eps if gold_share == "1 - eps" else 1.0
        q = share * F.one_hot(gold, logp.size(-1)).to(logp.dtype) + eps / logp.size(-1)
        rows = -(q * logp).sum(dim=-1)  # (N,)
        return rows.sum() if reduce == "sum" else rows.mean()

    return label_smoothed_loss


# ---------------------------------------------------------------------------- the cache
def cache_late(cache: Tensor, slots: Tensor, kv: Tensor, span: int) -> tuple[Tensor, Tensor]:
    cache[:, :, :, slots + 1] = kv
    return cache.narrow(3, 0, span).unbind(0)


def cache_copied(cache: Tensor, slots: Tensor, kv: Tensor, span: int) -> tuple[Tensor, Tensor]:
    cache = cache.clone()
    cache[:, :, :, slots] = kv
    return cache.narrow(3, 0, span).unbind(0)


def cache_whole(cache: Tensor, slots: Tensor, kv: Tensor, span: int) -> tuple[Tensor, Tensor]:
    cache[:, :, :, slots] = kv
    return cache.unbind(0)


# ---------------------------------------------------------------------------- greedy
def greedy_variant(min_len: bool = True, eos_counted: bool = True, source_eos: bool = True):
    """Greedy decoding with the cache that ignores ``min_len``, leaves ``</s>``'s
    log-probability out of the score, or encodes the source without its ``</s>``."""

    @torch.inference_mode()
    def greedy_search_cached(model: Transformer, source: list[int], cfg: DecodeConfig):
        src, limit = as_source(model, source, cfg)
        memory, src_mask = model.encode(src if source_eos else src[:, :-1])
        cache = model.init_cache(memory, src_mask, limit)
        tokens: list[int] = []
        logprob, last = 0.0, BOS_ID
        for _ in range(limit):
            y = torch.tensor([[last]])
            logp = next_logprobs(model.decode(y, None, None, cache)[:, -1])[0]
            if min_len and len(tokens) < cfg.min_len:
                logp[EOS_ID] = float("-inf")
            last = int(logp.argmax())
            if last == EOS_ID:
                total = logprob + float(logp[last]) if eos_counted else logprob
                return Hypothesis(tokens, total, total, finished=True)
            logprob += float(logp[last])
            tokens.append(last)
        return Hypothesis(tokens, logprob, logprob, finished=False)

    return greedy_search_cached


def penalty_plain(length: int | Tensor, alpha: float) -> float | Tensor:
    return length**alpha


# ---------------------------------------------------------------------------- beam search
def beam_variant(live: str = "logprob", eos_counted: bool = True, stop: str = "k-th beaten"):
    """``reference.beam_search`` whose live beams carry ``normalised`` scores, whose |Y| leaves
    out ``</s>``, or that stops at the ``first`` finished hypothesis."""

    @torch.inference_mode()
    def beam_search(model: Transformer, source: list[int], cfg: DecodeConfig) -> list[Hypothesis]:
        src, limit = as_source(model, source, cfg)
        k, alpha = cfg.beam, cfg.alpha
        beams: list[tuple[float, list[int]]] = [(0.0, [])]
        finished: list[Hypothesis] = []
        for t in range(limit):
            candidates = []
            for logprob, tokens in beams:
                top, ids = prefix_logprobs(model, src, tokens, cfg).topk(2 * k)
                pairs = zip(top.tolist(), ids.tolist(), strict=True)
                candidates += [(logprob + p, tokens, v) for p, v in pairs]
            candidates = sorted((c for c in candidates if c[0] > -math.inf), key=lambda c: -c[0])
            for logprob, tokens, v in candidates[:k]:
                if v == EOS_ID or t + 1 == limit:
                    length = t if v == EOS_ID and not eos_counted else t + 1
                    score = logprob / length_penalty(length, alpha)
                    kept = tokens if v == EOS_ID else [*tokens, v]
                    finished.append(Hypothesis(kept, logprob, score, finished=v == EOS_ID))
            finished.sort(key=lambda h: -h.score)
            beams = [(lp, [*toks, v]) for lp, toks, v in candidates[: 2 * k] if v != EOS_ID][:k]
            if live == "normalised":
                beams = [(lp / length_penalty(t + 1, alpha), toks) for lp, toks in beams]
            if not beams or (stop == "first" and finished):
                break
            best = beams[0][0] / length_penalty(limit, alpha)
            if len(finished) >= k and best <= finished[k - 1].score:
                break
        return finished[: cfg.nbest]

    return beam_search


# ---------------------------------------------------------------------------- excess error
def excess_variant(start: str = "after", sentences: str = "with an error", excess: str = "-"):
    """Section 4's error rates counted from the first error itself (``start`` "at"), over
    ``every`` sentence, or with the excess as a ratio ``/``."""

    def accumulation(gold: Any, clean_preds: Any, self_preds: Any) -> SimpleNamespace:
        n = clean = self_ = 0
        for g, a, b in zip(gold, clean_preds, self_preds, strict=True):
            wrong = [x != y for x, y in zip(a, g, strict=True)]
            if not any(wrong) and sentences != "every":
                continue
            first = wrong.index(True) if any(wrong) else -1
            for t in range(first + (start == "after"), len(g)):
                n, clean, self_ = n + 1, clean + wrong[t], self_ + (b[t] != g[t])
        err_clean, err_self = (clean / n, self_ / n) if n else (None, None)
        if err_clean is None or err_self is None:
            return SimpleNamespace(err_clean=None, err_self=None, excess_error=None)
        ratio = err_self / err_clean if err_clean else None
        difference = err_self - err_clean if excess == "-" else ratio
        return SimpleNamespace(err_clean=err_clean, err_self=err_self, excess_error=difference)

    return accumulation


# ---------------------------------------------------------------------------- scheduled sampling
def mix_variant(shifted: bool = True, p_gold: str = "eps", specials_kept: bool = True):
    """The scheduled-sampling mix feeding each prediction at its own position (not
    ``shifted``), gold with probability ``1 - eps``, or mixing ``<s>`` and padding too."""

    def mix_inputs(tgt_in: Tensor, predicted: Tensor, eps: float, generator: torch.Generator):
        model = torch.cat([tgt_in[:, :1], predicted[:, :-1]], dim=1) if shifted else predicted
        coin = torch.rand(tgt_in.shape, generator=generator, device=tgt_in.device)
        gold = coin < eps if p_gold == "eps" else coin < 1 - eps
        if specials_kept:
            gold |= (tgt_in == BOS_ID) | (tgt_in == PAD_ID)
        return torch.where(gold, tgt_in, model)

    return mix_inputs


# ---------------------------------------------------------------------------- the catalogue
MISTAKES: tuple[Mistake, ...] = (
    Mistake("sin_cos_swapped", "sinusoidal_positions", "sin and cos swapped",
            "Even columns 2i take the sine and odd columns 2i+1 the cosine: PE(pos, 2i) ="
            " sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).",
            positions_swapped),
    Mistake("frequency_per_column", "sinusoidal_positions", "a frequency per column, not per pair",
            "Columns 2i and 2i+1 share one frequency: the exponent 2i/d_model counts pairs, so"
            " column 2i+1 uses 2i/d_model too, not (2i+1)/d_model.",
            positions_by_column),
    Mistake("sin_cos_in_halves", "sinusoidal_positions", "sines in one half, cosines in the other",
            "The paper interleaves them: column 2i holds a sine, column 2i+1 the cosine of the same"
            " angle. All sines then all cosines is another layout, not the one tformer's models"
            " are trained with.",
            positions_in_halves),
    Mistake("no_scale", "attention", "no 1/sqrt(d_k)",
            "Divide the scores Q K^T by sqrt(d_k) before the softmax: dot products grow with d_k,"
            " and unscaled they push the softmax to one key with vanishing gradients (3.2.1).",
            attention_variant(scale=lambda d_k: 1.0)),
    Mistake("scaled_by_d_k", "attention", "divided by d_k, not sqrt(d_k)",
            "The scale is 1/sqrt(d_k): for unit-variance q and k, q . k has variance d_k, and"
            " dividing by its standard deviation sqrt(d_k) brings it back to 1.",
            attention_variant(scale=float)),
    Mistake("softmax_wrong_axis", "attention", "softmax over the wrong axis",
            "Each query's weights over the keys sum to 1: softmax over the last axis (the keys,"
            " dim=-1), not over the queries (dim=-2).",
            attention_variant(axis=-2)),
    Mistake("mask_after_softmax", "attention", "the mask applied after the softmax",
            "Add the mask to the scores before the softmax, where -inf becomes a weight of"
            " exactly 0: zeroing weights after it leaves rows that no longer sum to 1.",
            attention_variant(mask="after")),
    Mistake("mask_ignored", "attention", "the mask never added",
            "Add the mask M to the scores, softmax(Q K^T / sqrt(d_k) + M): without it every query"
            " sees the padded and the future keys.",
            attention_variant(mask="ignored")),
    Mistake("causal_off_by_one", "causal_mask", "the causal mask off by one (the diagonal hidden)",
            "Position i may attend to every j <= i, itself included: hide only j > i, the strict"
            " upper triangle (triu(1)). With the diagonal hidden, position 0 sees nothing at all.",
            causal_diagonal_hidden),
    Mistake("causal_transposed", "causal_mask", "the causal mask transposed",
            "Rows are queries, columns keys: row i hides the columns j > i (the upper triangle),"
            " the future, not the past.",
            causal_transposed),
    Mistake("padding_inverted", "padding_mask", "the padding mask inverted",
            "-inf where the token is padding (tokens == pad_id), 0 where it is real.",
            padding_inverted),
    Mistake("padding_boolean", "padding_mask", "a boolean mask",
            "tformer's masks are additive, added to the scores: 0.0 where a key is visible,"
            " -inf where hidden. Turn the booleans into those (masked_fill on a float zeros).",
            padding_boolean),
    Mistake("padding_unbroadcast", "padding_mask", "the mask not shaped to broadcast",
            "Shape it (B, 1, 1, S): the scores are (B, h, T, S), and a (B, S) mask would line"
            " up its batch axis with the queries.",
            padding_flat),
    Mistake("heads_split_across_positions", "multi_head_attention",
            "heads split with a reshape that mixes positions",
            "Split each position's d features: view (B, T, h, d_k), then transpose to (B, h, T,"
            " d_k). Reshaping (B, T, d) straight to (B, h, T, d_k) cuts across positions.",
            multi_head_variant(split="positions")),
    Mistake("heads_concatenated_untransposed", "multi_head_attention",
            "heads concatenated without transposing back",
            "Transpose the heads (B, h, T, d_k) back to (B, T, h, d_k) before reshaping to (B, T,"
            " d): each position's h heads side by side.",
            multi_head_variant(concat="untransposed")),
    Mistake("no_output_projection", "multi_head_attention", "W^O forgotten",
            "MultiHead = Concat(head_1, ..., head_h) W^O: the concatenated heads go through the"
            " output projection, x @ w_o.T + b_o.",
            multi_head_variant(w_o=False)),
    Mistake("unbiased_variance", "layer_norm", "the unbiased variance",
            "LayerNorm divides the squared deviations by d, not d - 1: torch.var is unbiased by"
            " default; use var(dim=-1, correction=0), as nn.LayerNorm does.",
            norm_variant(variance=1)),
    Mistake("no_eps", "layer_norm", "no eps",
            "A constant row has variance 0, and 0 / 0 is nan: divide by sqrt(var + eps).",
            norm_variant(eps="none")),
    Mistake("eps_outside_sqrt", "layer_norm", "eps outside the square root",
            "eps goes inside, (x - mean) / sqrt(var + eps), as in nn.LayerNorm: added to the"
            " standard deviation it weighs differently on rows of small spread.",
            norm_variant(eps="outside")),
    Mistake("norm_wrong_axis", "layer_norm", "the statistics over the wrong axis",
            "Normalise each position over its own d features: mean and variance over the last"
            " axis (dim=-1, keepdim=True), not over the positions or the batch.",
            norm_variant(axis=-2)),
    Mistake("statistics_detached", "layer_norm", "the statistics detached",
            "The mean and the variance are functions of x too: computed under no_grad or"
            " .detach(), they leave part of the gradient out (right values, wrong gradients).",
            norm_variant(detach=True)),
    Mistake("norm_wrong_side", "residual", "LayerNorm on the wrong side of the residual",
            "post-LN (pre_norm False) is LayerNorm(x + Sublayer(x)); pre-LN (True) is"
            " x + Sublayer(LayerNorm(x)): here the two forms are swapped.",
            residual_swapped),
    Mistake("pre_ln_adds_to_normed", "residual", "pre-LN adding the sublayer to the normalised x",
            "In pre-LN the residual stream is x itself: x + Sublayer(LayerNorm(x)), not"
            " LayerNorm(x) + Sublayer(LayerNorm(x)).",
            residual_from_normed),
    Mistake("post_ln_norms_the_sublayer", "residual", "post-LN normalising the sublayer alone",
            "post-LN normalises the sum: LayerNorm(x + Sublayer(x)), not x +"
            " LayerNorm(Sublayer(x)).",
            residual_norm_inside),
    Mistake("no_relu", "feed_forward", "the ReLU forgotten",
            "FFN(x) = max(0, x W_1 + b_1) W_2 + b_2: without the ReLU the two layers are one"
            " linear map.",
            ffn_linear),
    Mistake("relu_on_output", "feed_forward", "a ReLU on the output",
            "The ReLU sits between the two layers only: the output x W_2 + b_2 may be negative.",
            ffn_relu_out),
    Mistake("embedding_scale_forgotten", "embed", "the embedding scale forgotten",
            "Multiply the token embeddings by sqrt(d_model) (3.4): tformer's start at a standard"
            " deviation of 1/sqrt(d_model), and the scale brings them to the positions' size.",
            embed_unscaled),
    Mistake("positions_scaled", "embed", "the positions scaled too",
            "Only the token embeddings are scaled: E[tokens] * sqrt(d_model) + PE, not"
            " (E[tokens] + PE) * sqrt(d_model).",
            embed_positions_scaled),
    Mistake("probabilities_not_log", "output_logprobs", "softmax where log-softmax is meant",
            "Return log-probabilities, log_softmax(x @ E.T, dim=-1) (stable, unlike"
            " log(softmax(...))).",
            output_probabilities),
    Mistake("logprobs_wrong_axis", "output_logprobs", "log-softmax over the wrong axis",
            "Normalise over the vocabulary, the last axis (dim=-1): each position's"
            " probabilities sum to 1.",
            output_first_axis),
    Mistake("loss_averaged", "label_smoothed_loss", "the mean, not the sum",
            "Sum over the rows: the trainer divides by the batch's token count itself, so that"
            " accumulated batches weigh by their tokens.",
            loss_variant(reduce="mean")),
    Mistake("no_smoothing", "label_smoothed_loss", "no label smoothing",
            "Mix the one-hot target with the uniform distribution: q = (1 - eps) onehot(gold) +"
            " eps / V, and the loss is -sum_v q_v log p_v.",
            loss_variant(smoothed=False)),
    Mistake("gold_mass_not_reduced", "label_smoothed_loss", "the gold token's mass not reduced",
            "q must be a distribution: (1 - eps) on the gold token, plus eps / V on every token."
            " Without the (1 - eps) it sums to 1 + eps.",
            loss_variant(gold_share="1")),
    Mistake("cache_wrong_slot", "write_cache", "the cache written at the wrong slot",
            "Write the new keys and values at slots, the positions of the new tokens (0 for the"
            " first), not one further: the query at position t must find its own key at slot t.",
            cache_late),
    Mistake("cache_copied", "write_cache", "the cache copied, not written in place",
            "Write into the buffer itself, cache[:, :, :, slots] = kv: the next step reads the"
            " keys from it, and a copy is lost.",
            cache_copied),
    Mistake("cache_span_ignored", "write_cache", "the whole buffer returned",
            "Return the first span slots only, cache.narrow(3, 0, span): the slots after them"
            " hold nothing yet.",
            cache_whole),
    Mistake("min_len_ignored", "greedy_search_cached", "</s> allowed before min_len",
            "While fewer than cfg.min_len tokens are out, set the log-probability of </s> to -inf"
            " before taking the argmax.",
            greedy_variant(min_len=False)),
    Mistake("eos_logprob_dropped", "greedy_search_cached", "the log-probability of </s> left out",
            "The score of a finished hypothesis includes the log-probability of the </s> that"
            " ended it.",
            greedy_variant(eos_counted=False)),
    Mistake("source_without_eos", "greedy_search_cached", "the source encoded without its </s>",
            "The model was trained on sources that end in </s>: encode as_source's src, which"
            " appends it.",
            greedy_variant(source_eos=False)),
    Mistake("penalty_without_offset", "length_penalty", "lp(Y) = |Y| ** alpha",
            "GNMT's penalty is ((5 + |Y|) / 6) ** alpha: the 5 and the 6 soften it for short"
            " outputs, and lp(1) = 1.",
            penalty_plain),
    Mistake("penalty_on_live_beams", "beam_search",
            "the length penalty applied to unfinished hypotheses",
            "Divide by lp(|Y|) only when a hypothesis finishes: live beams carry the plain sum of"
            " log-probabilities, which the next step extends.",
            beam_variant(live="normalised")),
    Mistake("eos_not_in_length", "beam_search", "|Y| without the </s>",
            "A finished hypothesis' length |Y| counts the </s> that ended it: t + 1 at step t.",
            beam_variant(eos_counted=False)),
    Mistake("stopped_at_first_finished", "beam_search", "stopped at the first finished hypothesis",
            "Stop once k hypotheses have finished and no live beam can beat the k-th: a longer"
            " hypothesis may still score better once its length is divided out.",
            beam_variant(stop="first")),
    Mistake("counted_from_the_error", "accumulation", "counted from the first error, not after it",
            "Count the positions strictly after each sentence's first clean-pass error: that"
            " error is the one injected, not one accumulated.",
            excess_variant(start="at")),
    Mistake("error_free_sentences_counted", "accumulation", "sentences without an error counted",
            "A sentence whose clean pass is right throughout has nothing injected: leave it out"
            " of both rates.",
            excess_variant(sentences="every")),
    Mistake("excess_as_ratio", "accumulation", "the excess as a ratio",
            "excess_error = err_self - err_clean, a difference of error rates (the report's"
            " excess_error_pct is the relative one).",
            excess_variant(excess="/")),
    Mistake("prediction_not_shifted", "mix_inputs", "the prediction fed at its own position",
            "The prediction made at position t - 1 is the model's guess of the token at t: feed"
            " it at t (shift right by one, <s> first).",
            mix_variant(shifted=False)),
    Mistake("eps_inverted", "mix_inputs", "eps taken as the probability of the model's token",
            "eps is the teacher-forcing probability: the gold token with probability eps (eps 1"
            " is plain teacher forcing).",
            mix_variant(p_gold="1 - eps")),
    Mistake("specials_mixed", "mix_inputs", "<s> or padding replaced",
            "Keep <s> and the padding as they are: only real target positions are mixed.",
            mix_variant(specials_kept=False)),
)  # fmt: skip
BY_EXERCISE: dict[str, list[Mistake]] = {}
for _mistake in MISTAKES:
    BY_EXERCISE.setdefault(_mistake.exercise, []).append(_mistake)
