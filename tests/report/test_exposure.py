"""Tests for tformer_cli.report.exposure: every exposure-bias metric on hand-built logits against
values worked out by hand, the noise draw, buckets, quartiles and the sparkline.

The stub is a bigram model: the logits at a position depend only on the decoder-input token
there (``MOST_LIKELY[token]`` gets probability 0.6, every other id shares 0.4). With the
references below, each sentence's predictions are worked out by hand in the comments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
from torch import Tensor, nn

from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer_cli.model import DecoderCache
from tformer_cli.report.exposure import (
    BUCKETS,
    accumulation,
    bucket_of,
    forced_pass,
    gold_io,
    length_decay,
    noise_level,
    noisy_inputs,
    prefix_noise,
    quartiles,
    self_injected_inputs,
    sparkline,
    tf_argmax_tokens,
)

# The bigram's argmax: <s> -> 4 -> 5 -> 6 -> </s>, 7 -> 6, </s> -> 7; any other id -> 4.
MOST_LIKELY = {BOS_ID: 4, 4: 5, 5: 6, 6: EOS_ID, 7: 6, EOS_ID: 7}
P_BEST = 0.6

# References y* and, worked out by hand with MOST_LIKELY, the clean and self-injected passes.
GOLD = [[4, 5, 6], [4, 7, 6, 5], [5, 6], [4, 5, 6, 7, 6, 5, 4]]
SOURCES = [[4], [5, 6], [7], [4, 4, 5]]  # the bigram ignores them
CLEAN = [  # argmax given <s> y*: wrong where marked
    [4, 5, 6, EOS_ID],  # all right
    [4, 5, 6, EOS_ID, 6],  # x . x x   (t = 2, 4, 5)
    [4, 6, EOS_ID],  # x . .       (t = 1)
    [4, 5, 6, EOS_ID, 6, EOS_ID, 6, 5],  # t = 4, 6, 7, 8
]
SELF = [  # argmax given <s> a_1 .. a_n
    [4, 5, 6, EOS_ID],
    [4, 5, 6, EOS_ID, 7],  # after t = 2: t = 4, 5 wrong (2 of 3)
    [4, 5, EOS_ID],  # after t = 1: t = 2 wrong (1 of 2)
    [4, 5, 6, EOS_ID, 7, EOS_ID, 7, EOS_ID],  # after t = 4: t = 5, 6, 7 wrong (3 of 4)
]
# Clean errors after the first: S2 2 of 3, S3 0 of 2, S4 3 of 4 -> 5 / 9; self: 2 + 1 + 3 = 6 / 9.
# 20 target positions, 12 right under TF (4 + 2 + 2 + 4).


class StubModel(nn.Module):
    """Hand-built logits ``fn(src (b, S), y (b, T), start) -> (b, T, V)`` behind the interface
    the metrics and decoding use: ``encode``, ``decode`` (with or without a cache),
    ``forward``, ``init_cache`` and ``cfg``. The "memory" is the source ids themselves."""

    def __init__(self, fn: Callable[[Tensor, Tensor, int], Tensor], vocab_size: int) -> None:
        super().__init__()
        self.fn = fn
        self.cfg = SimpleNamespace(vocab_size=vocab_size, max_positions=64)
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)  # gives a device

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return src[:, :, None].float(), (src != PAD_ID)[:, None, None, :]  # (B, S, 1)

    def decode(
        self, y, memory, src_mask, cache: DecoderCache | None = None, at: Tensor | None = None
    ) -> Tensor:
        if cache is None:
            logits = self.fn(memory[..., 0].long(), y, 0)
        else:
            src = cache.cross_kv[0, 0, :, 0, :, 0].long()  # (B', S)
            src = src.repeat_interleave(y.size(0) // src.size(0), 0)  # (b, S): beams of a sentence
            start = int(cache.pos)
            cache.pos += y.size(1)
            logits = self.fn(src, y, start)
        return logits if at is None else logits[at]  # (b, T, V) or (N, V)

    def forward(self, src: Tensor, y: Tensor, at: Tensor | None = None) -> Tensor:
        return self.decode(y, *self.encode(src), at=at)

    def init_cache(self, memory, src_mask, max_len: int, beams: int = 1) -> DecoderCache:
        B = memory.size(0)
        rows = torch.zeros(1, 2, B * beams, 1, max_len, 1)  # (L, 2, B*n, h, T_max, d_k)
        cross = memory[None, None, :, None].expand(1, 2, -1, -1, -1, -1)  # (1, 2, B, 1, S, 1)
        return DecoderCache(rows, cross, src_mask, torch.zeros((), dtype=torch.long), max_len)


def bigram_stub(vocab_size: int = 8) -> StubModel:
    """``p(MOST_LIKELY[y_t] | y_t) = 0.6``, the rest spread evenly over the other ids."""
    probs = torch.full((vocab_size, vocab_size), (1 - P_BEST) / (vocab_size - 1))
    for prev in range(vocab_size):
        probs[prev, MOST_LIKELY.get(prev, 4)] = P_BEST
    table = probs.log()
    return StubModel(lambda src, y, start: table[y], vocab_size)  # (b, T, V)


def oracle_stub(vocab_size: int) -> StubModel:
    """Perfect under teacher forcing on a reversal task: position t predicts the t-th source
    word from the end, then ``</s>``, whatever the prefix."""

    def fn(src: Tensor, y: Tensor, start: int) -> Tensor:
        out = torch.full(y.shape, EOS_ID, dtype=torch.long)
        for i, row in enumerate(src.tolist()):
            words = [w for w in row if w >= 4][::-1]
            for j in range(y.size(1)):
                if start + j < len(words):
                    out[i, j] = words[start + j]
        return torch.nn.functional.one_hot(out, vocab_size).float() * 20 - 10  # (b, T, V)

    return StubModel(fn, vocab_size)


def clean_and_self(model: nn.Module, src, tgt):
    inputs, gold = gold_io(tgt)
    clean = forced_pass(model, src, inputs, gold)
    return gold, clean, forced_pass(model, src, self_injected_inputs(clean.preds), gold)


# ---------------------------------------------------------------------------- TF passes
def test_clean_pass_predictions_and_nll_match_the_hand_computed_ones():
    inputs, gold = gold_io(GOLD)
    result = forced_pass(bigram_stub(), SOURCES, inputs, gold)
    assert result.preds == CLEAN
    assert result.tokens == 20
    nll = 12 * -math.log(P_BEST) + 8 * -math.log((1 - P_BEST) / 7)
    assert result.nll == pytest.approx(nll, rel=1e-5)


def test_self_injected_pass_reads_the_clean_predictions():
    assert self_injected_inputs(CLEAN)[1] == [BOS_ID, 4, 5, 6, EOS_ID]
    _, _, injected = clean_and_self(bigram_stub(), SOURCES, GOLD)
    assert injected.preds == SELF


def test_forced_pass_is_independent_of_the_batch_size():
    inputs, gold = gold_io(GOLD)
    one = forced_pass(bigram_stub(), SOURCES, inputs, gold, max_tokens=1)
    assert one.preds == CLEAN


def test_tf_argmax_tokens_drop_every_end_of_sentence():
    assert tf_argmax_tokens(CLEAN) == [[4, 5, 6], [4, 5, 6, 6], [4, 6], [4, 5, 6, 6, 6, 5]]


# ---------------------------------------------------------------------------- section 4
def test_accumulation_matches_the_hand_computed_rates():
    gold = gold_io(GOLD)[1]
    a = accumulation(gold, CLEAN, SELF)
    assert (a.positions, a.sentences_with_error, a.sentences) == (9, 3, 4)
    assert a.err_clean == pytest.approx(5 / 9)
    assert a.err_self == pytest.approx(6 / 9)
    assert a.excess_error == pytest.approx(1 / 9)
    assert a.excess_error_pct == pytest.approx(20.0)
    first, second, *rest = a.buckets
    assert (first.positions, first.err_clean, first.err_self) == (6, 2 / 6, 4 / 6)
    assert (second.positions, second.err_clean, second.err_self) == (3, 1.0, 2 / 3)
    assert all(b.positions == 0 and b.err_clean is None and b.err_self is None for b in rest)


def test_accumulation_without_errors_is_undefined_not_zero():
    gold = [[4, 5, EOS_ID]]
    a = accumulation(gold, gold, gold)
    assert a.positions == 0
    assert (a.err_clean, a.err_self, a.excess_error, a.excess_error_pct) == (None,) * 4


def test_excess_pct_is_undefined_when_no_clean_error_follows_the_first():
    gold, clean, injected = [[4, 5, EOS_ID]], [[7, 5, EOS_ID]], [[7, 6, EOS_ID]]
    a = accumulation(gold, clean, injected)
    assert (a.err_clean, a.err_self, a.excess_error) == (0.0, 0.5, 0.5)
    assert a.excess_error_pct is None


@pytest.mark.parametrize(
    ("t", "bucket"), [(1, 0), (5, 0), (6, 1), (10, 1), (11, 2), (20, 2), (21, 3), (40, 3), (41, 4)]
)
def test_bucket_of_follows_the_documented_bounds(t, bucket):
    assert bucket_of(t) == bucket
    assert len(BUCKETS) == 5


def test_sparkline_scales_from_lo_to_hi_and_leaves_undefined_blank():
    assert sparkline([0.0, 0.5, 1.0, None], lo=0.0, hi=1.0) == "▁▅█ "
    assert sparkline([1.0, 2.0, 3.0]) == "▁▅█"  # default: the smallest to the largest value
    assert sparkline([0.5, 0.5]) == "▁▁"
    assert sparkline([None]) == " "


# ---------------------------------------------------------------------------- section 5
def flat(seqs):
    return [x for seq in seqs for x in seq]


def test_noisy_inputs_never_touch_bos_and_draw_non_special_tokens():
    inputs = gold_io(GOLD * 20)[0]
    noisy, replaced = noisy_inputs(inputs, 0.5, vocab_size=8, seed=3)
    assert all(seq[0] == BOS_ID for seq in noisy) and not any(f[0] for f in replaced)
    triples = list(zip(flat(inputs), flat(noisy), flat(replaced), strict=True))
    drawn = [new for _, new, hit in triples if hit]
    assert drawn and all(4 <= t < 8 for t in drawn)
    assert all(old == new for old, new, hit in triples if not hit)
    assert 0.35 < len(drawn) / (len(triples) - len(inputs)) < 0.65


def test_noise_is_seeded_and_nested_across_levels():
    inputs = gold_io(GOLD * 5)[0]
    low, low_hit = noisy_inputs(inputs, 0.1, 8, seed=7)
    high, high_hit = noisy_inputs(inputs, 0.25, 8, seed=7)
    assert noisy_inputs(inputs, 0.25, 8, seed=7) == (high, high_hit)
    for lo_hit, hi_hit, lo, hi in zip(
        flat(low_hit), flat(high_hit), flat(low), flat(high), strict=True
    ):
        assert not lo_hit or (hi_hit and lo == hi)  # replaced at 0.1: also at 0.25, same token
    assert noisy_inputs(inputs, 0.0, 8, seed=7) == (inputs, [[False] * len(s) for s in inputs])


def test_prefix_noise_with_every_input_replaced_counts_only_the_first_position():
    model = bigram_stub()
    inputs, gold = gold_io(GOLD)
    noisy, replaced = noisy_inputs(inputs, 1.0, 8, seed=0)
    level = noise_level(1.0, gold, CLEAN, forced_pass(model, SOURCES, noisy, gold).preds, replaced)
    # Only t = 1 (input <s>) is kept: right in S1, S2, S4, wrong in S3.
    assert (level.kept, level.replaced) == (4, 16)
    assert level.acc == level.clean_acc_same_positions == 0.75
    assert level.paired_drop == 0.0
    clean = noise_level(0.0, gold, CLEAN, CLEAN, [[False] * len(g) for g in gold])
    assert clean.acc == 0.6
    p = prefix_noise(0, [clean, level])
    assert p.drop == pytest.approx(0.6 - 0.75)  # as defined: unpaired, biased towards t = 1
    assert p.paired_drop == 0.0


def test_a_bigram_model_has_no_paired_prefix_noise_drop():
    """Position t reads only its own input token, which is kept wherever it is measured."""
    model = bigram_stub()
    inputs, gold = gold_io(GOLD * 5)
    noisy, replaced = noisy_inputs(inputs, 0.5, 8, seed=1)
    clean = forced_pass(model, SOURCES * 5, inputs, gold).preds
    level = noise_level(
        0.5, gold, clean, forced_pass(model, SOURCES * 5, noisy, gold).preds, replaced
    )
    assert level.replaced > 0 and level.paired_drop == 0.0


# ---------------------------------------------------------------------------- section 6
def test_quartiles_split_by_length_into_equal_groups():
    assert quartiles([5, 1, 4, 2, 3, 8, 7, 6]) == [[1, 3], [4, 2], [0, 7], [6, 5]]
    assert quartiles([1, 2]) == [[], [0], [], [1]]


def test_length_decay_matches_hand_values():
    refs = ["a b", "c d", "e f g h", "i j k l"]
    greedy = ["a b", "c d", "e f g h", "zz"]  # Q4 (the last sentence) wrong; others exact
    tf = list(refs)
    d = length_decay([2, 2, 4, 4], refs, greedy, tf)
    assert [q.sentences for q in d.quartiles] == [1, 1, 1, 1]
    assert [q.greedy_chrf for q in d.quartiles] == [100.0, 100.0, 100.0, 0.0]
    assert [q.tf_chrf for q in d.quartiles] == [100.0] * 4
    assert d.decay_ratio == 0.0


def test_length_decay_ratio_is_undefined_where_tf_chrf_is_zero():
    refs = ["a b", "c d", "e f", "g h"]
    d = length_decay([1, 2, 3, 4], refs, refs, ["zz"] * 4)
    assert d.quartiles[0].ratio is None and d.decay_ratio is None
    assert d.quartiles[0].greedy_chrf == pytest.approx(
        sacrebleu.CHRF().sentence_score("a b", ["a b"]).score
    )


# ---------------------------------------------------------------------------- sanity checks
def test_a_prefix_independent_decoder_has_no_excess_error_and_no_noise_drop(tiny_model):
    """Target embeddings zeroed and positions removed: the decoder cannot see the prefix."""
    model = tiny_model(seed=1)

    class NoTarget(nn.Module):
        def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
            return torch.zeros(*tokens.shape, model.cfg.d_model)  # (B, T, d)

    model.tgt_embed = NoTarget()
    src = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [4, 20, 30]]
    tgt = [[6, 7, 8, 9], [9, 8], [14, 15, 16, 17, 18, 19], [30, 20, 4]]
    gold, clean, injected = clean_and_self(model, src, tgt)
    a = accumulation(gold, clean.preds, injected.preds)
    assert a.positions > 0 and a.err_clean > 0
    assert a.excess_error == 0.0
    inputs = gold_io(tgt)[0]
    for q in (0.1, 0.25, 1.0):
        noisy, replaced = noisy_inputs(inputs, q, model.cfg.vocab_size, seed=0)
        preds = forced_pass(model, src, noisy, gold).preds
        assert noise_level(q, gold, clean.preds, preds, replaced).paired_drop == 0.0


def test_a_model_perfect_under_tf_has_no_errors_to_inject():
    model = oracle_stub(vocab_size=16)
    src = [[4, 5, 6, 7, 8], [9, 10, 11, 12]]
    gold, clean, injected = clean_and_self(model, src, [s[::-1] for s in src])
    assert clean.preds == gold == injected.preds
    assert accumulation(gold, clean.preds, injected.preds).err_clean is None
