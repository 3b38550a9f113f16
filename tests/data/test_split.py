"""Tests for tformer_cli.data.split: the encoded split and the one rule for which pairs fit a
model's positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tformer_cli.data.data_cache import SCHEMA, read_split
from tformer_cli.data.split import ArrowColumn, Split, fits_positions, lengths


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


def arrow_split(tmp_path: Path, batches: list[list[list[int]]]) -> Split:
    """A split written as one Arrow file of several record batches, read memory-mapped."""
    path = tmp_path / "split.arrow"
    with pa.ipc.new_file(path, SCHEMA) as writer:
        for ids in batches:
            refs = [" ".join(map(str, s)) for s in ids]
            writer.write_batch(pa.record_batch([ids, ids, refs], schema=SCHEMA))
    return read_split(path)


def test_a_memory_mapped_split_reads_rows_across_record_batches(tmp_path):
    split = arrow_split(tmp_path, [[[4], [5, 6]], [], [[7, 8, 9], [10]]])
    assert len(split.src) == 4 and split.src[2] == [7, 8, 9] and split.src[-1] == [10]
    assert list(split.refs) == ["4", "5 6", "7 8 9", "10"]
    assert lengths(split.tgt).tolist() == [1, 2, 3, 1]
    assert split.src[1:3] == [[5, 6], [7, 8, 9]]
    picked = split.select(np.array([3, 0]))
    assert isinstance(picked.src, ArrowColumn)
    assert picked == Split([[10], [4]], [[10], [4]], ["10", "4"])
    assert lengths(picked.src).tolist() == [1, 1] and picked.src[1:] == [[4]]
    with pytest.raises(IndexError):
        split.src[4]


def test_fits_positions_reads_the_lengths_of_a_memory_mapped_split(tmp_path):
    split = arrow_split(tmp_path, [[[4] * 3, [4] * 4], [[4] * 2]])
    assert fits_positions(split.src, split.tgt, max_positions=4) == [0, 2]
