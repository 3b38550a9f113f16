"""Tests for tformer_cli.data.batching: padding, special tokens, token-budget batches,
padding waste."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tformer_cli.data.batching import make_batch, pad, padding_waste, plan_batches, token_batches


def lengths_5_to_40(n: int = 2000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 40) for _ in range(n)]


def test_pad_right_pads_with_zero():
    out = pad([[5, 6, 7], [8], []])
    assert out.dtype == torch.long
    assert out.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]


def test_make_batch_adds_eos_to_source_and_bos_eos_around_target():
    b = make_batch([[5, 6], [7]], [[8], [9, 10, 11]])
    assert b.src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert b.tgt_in.tolist() == [[2, 8, 0, 0], [2, 9, 10, 11]]
    assert b.tgt_out.tolist() == [[8, 3, 0, 0], [9, 10, 11, 3]]
    assert b.n_tgt_tokens == 2 + 4


def test_make_batch_decoder_input_is_output_shifted_right():
    b = make_batch([[4]], [[5, 6, 7]])
    assert b.tgt_in[0, 1:].tolist() == b.tgt_out[0, :-1].tolist()


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
@pytest.mark.parametrize("max_tokens", [40, 200, 1000])
def test_token_batches_respect_the_budget_and_cover_each_index_once(seed, max_tokens):
    lengths = lengths_5_to_40(500, seed=7)
    rng = None if seed is None else random.Random(seed)
    batches = token_batches(lengths, max_tokens, rng)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert b, "no empty batch"
        assert max(lengths[i] for i in b) * len(b) <= max_tokens


def test_a_single_overlong_example_gets_a_batch_of_its_own():
    lengths = [3, 50, 4, 3, 60]
    for rng in (None, random.Random(0)):
        batches = token_batches(lengths, 10, rng)
        assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
        assert [1] in batches and [4] in batches
        for b in batches:
            if len(b) > 1:
                assert max(lengths[i] for i in b) * len(b) <= 10


def test_token_batches_without_rng_are_sorted_by_length():
    lengths = [9, 2, 7, 2, 5, 1]
    batches = token_batches(lengths, 12)
    flat = [i for b in batches for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert token_batches(lengths, 12) == batches


def test_token_batches_are_deterministic_for_a_seed_and_differ_across_seeds():
    lengths = lengths_5_to_40(300, seed=3)
    a = token_batches(lengths, 200, random.Random(42))
    b = token_batches(lengths, 200, random.Random(42))
    c = token_batches(lengths, 200, random.Random(43))
    assert a == b
    assert a != c


@pytest.mark.parametrize("seed", [None, 3])
def test_max_sentences_caps_the_rows_of_every_batch(seed):
    lengths = [1] * 23 + [2] * 10
    rng = None if seed is None else random.Random(seed)
    batches = token_batches(lengths, 1000, rng, max_sentences=5)
    assert max(len(b) for b in batches) == 5
    assert sorted(i for b in batches for i in b) == list(range(33))
    assert len(batches) == 7  # the budget never binds: ceil(33 / 5) batches


def list_planner(lengths, max_tokens, rng=None, pool=100, max_sentences=None):
    """The planner of Python lists that runs before the memory-mapped data trained with: the
    batches it made for a seed are what a run's resume replays, so they must not change."""
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
        mean = max(1.0, sum(lengths) / max(1, len(lengths)))
        size = max(1, int(pool * max_tokens / mean))
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
    else:
        chunks = [order]
    batches = []
    for chunk in chunks:
        chunk.sort(key=lambda i: lengths[i])
        batch, longest = [], 0
        for i in chunk:
            longest_if_added = max(longest, lengths[i])
            full = max_sentences is not None and len(batch) >= max_sentences
            if batch and (full or longest_if_added * (len(batch) + 1) > max_tokens):
                batches.append(batch)
                batch, longest_if_added = [], lengths[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


@pytest.mark.parametrize("seed", [None, 1234, 1234 * 1000 + 3])
@pytest.mark.parametrize(("max_tokens", "max_sentences"), [(25, None), (600, None), (4096, 7)])
def test_the_numpy_planner_makes_the_list_planners_batches_for_a_seed(
    seed, max_tokens, max_sentences
):
    """Exact resume across the change: a seed's batches (and the rng's state after them) are
    the same, on lengths with many ties and pairs over the budget."""
    lengths = [*lengths_5_to_40(3000, seed=7), 60, 61, 5, 5]  # 60, 61: over a 25-token budget
    rngs = [None, None] if seed is None else [random.Random(seed), random.Random(seed)]
    planned = plan_batches(np.array(lengths, dtype=np.int32), max_tokens, rngs[0],
                           max_sentences=max_sentences)  # fmt: skip
    expected = list_planner(lengths, max_tokens, rngs[1], max_sentences=max_sentences)
    assert [b.tolist() for b in planned] == expected
    assert seed is None or rngs[0].random() == rngs[1].random()


def test_token_batches_of_nothing_are_empty():
    assert token_batches([], 100) == []
    assert token_batches([], 100, random.Random(0)) == []


def test_padding_waste_by_hand():
    lengths = [2, 4, 3, 3]
    # batch [0, 1]: 2 rows x 4 = 8 slots, 6 real; batch [2, 3]: 6 slots, 6 real
    assert padding_waste([[0, 1], [2, 3]], lengths) == pytest.approx(1 - 12 / 14)
    assert padding_waste([[2, 3]], [0, 0, 3, 3]) == 0.0
    assert padding_waste([], []) == 0.0


@pytest.mark.parametrize("max_tokens", [512, 4096])
def test_padding_waste_is_under_ten_percent_on_realistic_lengths(max_tokens):
    lengths = lengths_5_to_40(2000, seed=0)
    for seed in (0, 1):
        batches = token_batches(lengths, max_tokens, random.Random(seed))
        assert padding_waste(batches, lengths) < 0.10
    assert padding_waste(token_batches(lengths, max_tokens), lengths) < 0.10


def test_padding_waste_of_the_batches_matches_the_padded_tensors():
    rng = random.Random(5)
    src = [[4] * rng.randint(1, 12) for _ in range(60)]
    tgt = [[5] * rng.randint(1, 12) for _ in range(60)]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src, tgt, strict=True)]
    batches = token_batches(lengths, 64, random.Random(1))
    real = padded = 0
    for idx in batches:
        b = make_batch([src[i] for i in idx], [tgt[i] for i in idx])
        width = max(b.src.size(1), b.tgt_out.size(1))
        padded += width * len(idx)
        real += sum(lengths[i] for i in idx)
        assert width * len(idx) <= 64
    assert padding_waste(batches, lengths) == pytest.approx(1 - real / padded)
