"""Tests for tformer_cli.data.text: a split's text written, routed and read a batch at a time."""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pytest

from tformer_cli.data import text

PAIRS = [(f"s{i} ü", f"t{i}") for i in range(11)]


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    monkeypatch.setattr(text, "ROWS", 3)


def test_pairs_are_written_in_batches_that_read_back_whole(tmp_path):
    path = tmp_path / "train.arrow"
    assert text.write_pairs(iter(PAIRS), path) == 11
    batches = list(text.file_batches(path))
    assert [b.num_rows for b in batches] == [3, 3, 3, 2]
    assert [(s, t) for b in batches for s, t in zip(*b.to_pydict().values(), strict=True)] == PAIRS
    ds = datasets.Dataset.from_file(str(path))  # the format `datasets` maps
    assert list(zip(ds["src"], ds["tgt"], strict=True)) == PAIRS


def test_route_sends_each_pair_to_its_label_in_order(tmp_path):
    text.write_pairs(PAIRS, tmp_path / "all.arrow")
    labels = np.array([0, 1, 0, 2, 0, 0, 1, 0, 0, 0, 2], dtype=np.uint8)
    outputs = [tmp_path / f"{k}.arrow" for k in range(3)]
    text.route(tmp_path / "all.arrow", labels, outputs)
    for k, out in enumerate(outputs):
        got = datasets.Dataset.from_file(str(out))["src"]
        assert got == [s for (s, _), label in zip(PAIRS, labels, strict=True) if label == k]


def test_read_batches_reads_the_file_and_falls_back_to_slicing(tmp_path):
    text.write_pairs(PAIRS, tmp_path / "train.arrow")
    mapped = datasets.Dataset.from_file(str(tmp_path / "train.arrow"))
    in_memory = datasets.Dataset.from_dict({"src": [s for s, _ in PAIRS], "tgt": [""] * 11})
    picked = mapped.select([4, 1, 9])  # an index mapping: not the file as written
    for ds in (mapped, in_memory):
        batches = list(text.read_batches(ds, "src"))
        assert all(isinstance(b, pa.Array) for b in batches) and len(batches) == 4
        assert [s for b in batches for s in b.to_pylist()] == [s for s, _ in PAIRS]
    assert [s for b in text.read_batches(picked, "src") for s in b.to_pylist()] == [
        "s4 ü", "s1 ü", "s9 ü",
    ]  # fmt: skip
