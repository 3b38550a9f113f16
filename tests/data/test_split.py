"""Tests for tformer_cli.data.split: the encoded split and the one rule for which pairs fit a
model's positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tformer_cli.data.data_cache import ENCODED_SCHEMA, read_split
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
    with pa.ipc.new_file(path, ENCODED_SCHEMA) as writer:
        for ids in batches:
            refs = [" ".join(map(str, s)) for s in ids]
            writer.write_batch(pa.record_batch([ids, ids, refs], schema=ENCODED_SCHEMA))
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


def mapped_kb(path: Path) -> int:
    """The kB of ``path`` that this process's memory holds (its maps' Rss, /proc/self/smaps)."""
    kb, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split(" ", 1)[0]:  # a map's header line
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            kb += int(line.split()[1])
    return kb


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_reading_rows_leaves_no_page_of_their_token_ids_in_memory(tmp_path):
    """Rows are read by pread, not through the map: after reading rows spread over the whole
    file, the process holds only the offsets' pages (4 bytes a row a column), where reads
    through the map would hold nearly every page of the token ids (30 tokens, 120 bytes a row
    a column). The offsets are read by ``lengths``, as batching does."""
    rows = [[7] * 30] * 20_000
    split = arrow_split(tmp_path, [rows[i : i + 5000] for i in range(0, 20_000, 5000)])
    path = tmp_path / "split.arrow"
    lengths(split.src), lengths(split.tgt)
    spread = np.random.default_rng(0).permutation(20_000)[:2000]
    assert all(split.src[i] == [7] * 30 and split.tgt[i] == [7] * 30 for i in spread)
    ids_kb = path.stat().st_size // 1024
    assert mapped_kb(path) < ids_kb // 4, (mapped_kb(path), ids_kb)
