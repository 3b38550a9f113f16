"""A full disk while the data cache is written (``RLIMIT_FSIZE``, as in
tests/training/test_storage.py): one line naming the entry, no half entry left to be used, and
the same call with the limit lifted builds it whole; a temporary folder a killed run left is
never taken for the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.test_storage import file_size_limit
from tformer_cli.data.corpus import load_corpus
from tformer_cli.data.data_cache import DataCache
from tformer_cli.errors import TformerError


@pytest.fixture
def cache(tmp_path: Path, tiny_corpus: Path) -> DataCache:
    return DataCache(tmp_path / "cache", load_corpus(str(tiny_corpus)))


def test_a_full_disk_while_encoding_leaves_no_entry_and_a_rerun_builds_it(cache: DataCache):
    tokenizer, _ = cache.tokenizer("bpe", 60)
    with file_size_limit(1024), pytest.raises(TformerError) as failed:
        cache.encoded(tokenizer)
    message = str(failed.value)
    assert message.startswith(f"cannot write {cache.cache_dir}/encoded-")
    assert "File too large" in message and "\n" not in message
    assert [p.name for p in cache.cache_dir.iterdir()] == [tokenizer.parent.name]

    splits, _, hit = cache.encoded(tokenizer)
    assert not hit and len(splits["train"].src) == 40
    assert cache.encoded(tokenizer)[2]  # whole now: a hit


def test_a_full_disk_while_training_the_tokenizer_leaves_no_entry(cache: DataCache):
    with file_size_limit(256), pytest.raises(TformerError) as failed:
        cache.tokenizer("bpe", 60)
    assert str(failed.value).startswith(f"cannot write {cache.cache_dir}/tokenizer-")
    assert "File too large" in str(failed.value)
    assert not list(cache.cache_dir.iterdir())
    path, hit = cache.tokenizer("bpe", 60)
    assert not hit and path.is_file()


def test_a_temporary_folder_left_by_a_killed_write_is_not_taken_for_the_entry(cache: DataCache):
    tokenizer, _ = cache.tokenizer("bpe", 60)
    _, entry, _ = cache.encoded(tokenizer)
    whole = {p.name: p.read_bytes() for p in entry.iterdir()}
    # what a run killed mid-write leaves: the entry under its temporary name, half written
    left = entry.with_name(f".{entry.name}.k1ll3d")
    entry.rename(left)
    (left / "train.arrow").write_bytes(whole["train.arrow"][:100])
    splits, again, hit = cache.encoded(tokenizer)
    assert again == entry and not hit
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == whole
    assert len(splits["train"].src) == 40
