"""Tests for tformer_cli.data.split: the encoded split and the one rule for which pairs fit a
model's positions."""

from __future__ import annotations

from tformer_cli.data.split import Split, fits_positions


def test_a_pair_fits_when_each_side_leaves_room_for_its_special_token():
    src = [[4] * 3, [4] * 4, [4] * 2, [4] * 3]
    tgt = [[5] * 3, [5] * 2, [5] * 4, [5] * 5]
    assert fits_positions(src, tgt, max_positions=4) == [0]  # at most 3 tokens a side
    assert fits_positions(src, tgt, max_positions=5) == [0, 1, 2]
    assert fits_positions([], [], max_positions=5) == []


def test_select_keeps_the_pairs_aligned_in_the_order_asked():
    split = Split([[4], [5, 6], [7]], [[8], [9], [10, 11]], ["a", "b", "c"])
    assert split.select([2, 0]) == Split([[7], [4]], [[10, 11], [8]], ["c", "a"])
    assert split.select([]) == Split([], [], [])
