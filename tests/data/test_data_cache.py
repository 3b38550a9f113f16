"""Tests for tformer_cli.data.data_cache and its use by the trainer: a second run on the same corpus
reuses the tokenizer and the encoded splits; keys, Arrow layout, atomic entries, resume."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pyarrow as pa
import pytest
from datasets import DatasetDict
from rich.console import Console

from tformer_cli.config import TrainConfig
from tformer_cli.data import data_cache, text
from tformer_cli.data.corpus import fingerprinted_corpus, load_corpus
from tformer_cli.data.data_cache import ENCODED_SCHEMA, DataCache, _write_entry
from tformer_cli.data.split import ArrowColumn
from tformer_cli.data.tokenizer import encode, load_tokenizer, train_tokenizer
from tformer_cli.errors import TformerError
from tformer_cli.training.setup import prepare


def cfg(corpus: Path, **overrides) -> TrainConfig:
    return TrainConfig(**{"data": str(corpus), "vocab_size": 60, **overrides})


def run_prepare(run_dir: Path, config: TrainConfig, resume: bool = False):
    """``prepare()`` with its log lines as one string."""
    log = io.StringIO()
    tok, _, splits = prepare(
        run_dir, config, Console(file=log, width=400, log_path=False, soft_wrap=True), resume, 1024
    )
    return tok, splits, log.getvalue()


def entries(runs: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in (runs / ".cache").iterdir())


def test_a_second_run_reuses_the_tokenizer_and_the_encoded_splits(
    tmp_path, tiny_corpus, monkeypatch
):
    runs = tmp_path / "runs"
    tok, first, log = run_prepare(runs / "a", cfg(tiny_corpus))
    assert "trained a bpe tokenizer" in log and "tokenized data: cached at" in log
    assert entries(runs) == ["encoded", "tokenizer"]  # and no temporary folder left
    calls = []
    monkeypatch.setattr(data_cache, "train_tokenizer", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(data_cache, "encode", lambda *a, **k: calls.append(a))
    _, second, log = run_prepare(runs / "b", cfg(tiny_corpus))
    assert calls == []  # neither trained nor encoded again
    assert "reusing the cached bpe tokenizer" in log
    assert f"reusing cached tokenized data from {runs / '.cache'}" in log and "(52 pairs)" in log
    a, b = ((runs / name / "tokenizer.json").read_bytes() for name in ("a", "b"))
    assert a == b
    assert second == first
    corpus = load_corpus(str(tiny_corpus))
    assert first["test"].src == encode(tok, corpus["test"]["src"])
    assert first["valid"].refs == list(corpus["valid"]["tgt"])


def test_other_tokenizer_settings_make_new_entries(tmp_path, tiny_corpus):
    runs = tmp_path / "runs"
    run_prepare(runs / "a", cfg(tiny_corpus))
    _, _, log = run_prepare(runs / "b", cfg(tiny_corpus, vocab_size=30))
    assert "trained a bpe tokenizer" in log and "tokenized data: cached at" in log
    assert entries(runs) == ["encoded", "encoded", "tokenizer", "tokenizer"]


def test_another_text_pipeline_trains_a_new_tokenizer(tmp_path, tiny_corpus, monkeypatch):
    """A change to the normalizer or pre-tokenizer must not reuse tokenizers trained before it."""
    runs = tmp_path / "runs"
    run_prepare(runs / "a", cfg(tiny_corpus))
    monkeypatch.setattr(data_cache, "pipeline_signature", lambda: "another pipeline")
    _, _, log = run_prepare(runs / "b", cfg(tiny_corpus))
    assert "trained a bpe tokenizer" in log
    assert entries(runs).count("tokenizer") == 2


def test_length_filtering_still_applies_to_cached_data(tmp_path, tiny_corpus):
    runs = tmp_path / "runs"
    _, full, _ = run_prepare(runs / "a", cfg(tiny_corpus))
    longest = max(
        max(len(s), len(t)) for s, t in zip(full["train"].src, full["train"].tgt, strict=True)
    )
    _, short, log = run_prepare(runs / "b", cfg(tiny_corpus, max_len=longest))
    assert "reusing cached tokenized data" in log
    dropped = len(full["train"].src) - len(short["train"].src)
    assert dropped > 0 and f"skipped {dropped} training pairs over {longest} tokens" in log
    assert all(
        max(len(s), len(t)) < longest
        for s, t in zip(short["train"].src, short["train"].tgt, strict=True)
    )
    assert short["test"] == full["test"]  # only train is filtered


def test_the_cached_tokenizer_is_the_source_of_truth(tmp_path, tiny_corpus):
    """Unigram training is not deterministic: a new run copies the cached file, never retrains."""
    runs = tmp_path / "runs"
    run_prepare(runs / "a", cfg(tiny_corpus))
    cached = next((runs / ".cache").glob("tokenizer-*")) / "tokenizer.json"
    other = train_tokenizer(["red blue green cat dog"] * 3, 40, "wordlevel", min_frequency=1)
    other.save(str(cached))
    tok, _, log = run_prepare(runs / "b", cfg(tiny_corpus))
    assert (runs / "b" / "tokenizer.json").read_bytes() == cached.read_bytes()
    assert tok.get_vocab_size() == other.get_vocab_size()
    assert "tokenized data: cached at" in log  # another tokenizer: another encoding


def test_resume_keeps_the_runs_own_tokenizer(tmp_path, tiny_corpus):
    runs = tmp_path / "runs"
    run_prepare(runs / "a", cfg(tiny_corpus))
    own = train_tokenizer(["red blue green cat dog big small"] * 3, 40, "wordlevel", 1)
    own.save(str(runs / "a" / "tokenizer.json"))
    tok, splits, log = run_prepare(runs / "a", cfg(tiny_corpus), resume=True)
    assert tok.get_vocab_size() == own.get_vocab_size()
    assert "tokenizer" not in log.split("tokenized data")[0]  # no tokenizer trained or copied
    corpus = load_corpus(str(tiny_corpus))
    assert splits["valid"].src == encode(own, corpus["valid"]["src"])
    _, _, again = run_prepare(runs / "a", cfg(tiny_corpus), resume=True)
    assert "reusing cached tokenized data" in again


def test_encoded_splits_are_arrow_files_of_int32_lists_and_strings(tmp_path, tiny_corpus):
    cache = DataCache(tmp_path, load_corpus(str(tiny_corpus)))
    path, hit = cache.tokenizer("bpe", 60)
    splits, entry, hit = cache.encoded(path)
    assert not hit and sorted(p.name for p in entry.iterdir()) == [
        "test.arrow", "train.arrow", "valid.arrow",
    ]  # fmt: skip
    with pa.memory_map(str(entry / "valid.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
        assert table.schema == ENCODED_SCHEMA
        assert table.column("src").to_pylist() == list(splits["valid"].src)
        assert table.column("ref").to_pylist() == list(splits["valid"].refs)
    train = splits["train"]
    assert all(isinstance(c, ArrowColumn) for c in (train.src, train.tgt, train.refs))
    assert load_tokenizer(path).get_vocab_size() <= 60


def test_a_failing_writer_leaves_no_entry_and_no_temporary_folder(tmp_path):
    def fail(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(TformerError, match=r"cannot write .*entry: disk full"):
        _write_entry(tmp_path / "entry", fail)
    assert list(tmp_path.iterdir()) == []


def test_an_entry_written_first_by_another_run_is_kept(tmp_path):
    (tmp_path / "entry").mkdir()
    (tmp_path / "entry" / "theirs").write_text("first")
    _write_entry(tmp_path / "entry", lambda tmp: (tmp / "ours").write_text("second"))
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
    assert [p.name for p in (tmp_path / "entry").iterdir()] == ["theirs"]


def test_a_corrupt_entry_is_a_one_line_error_naming_it(tmp_path, tiny_corpus):
    cache = DataCache(tmp_path, load_corpus(str(tiny_corpus)))
    path, _ = cache.tokenizer("bpe", 60)
    _, entry, _ = cache.encoded(path)
    (entry / "train.arrow").write_bytes(b"not arrow")
    with pytest.raises(TformerError, match=f"delete {entry}") as info:
        cache.encoded(path)
    assert "\n" not in str(info.value)


def test_encoding_writes_record_batches_that_read_back_as_the_whole(
    tmp_path, tiny_corpus, monkeypatch
):
    monkeypatch.setattr(text, "ROWS", 7)  # the text is written, read and encoded 7 pairs at a time
    corpus = load_corpus(str(tiny_corpus))
    cache = DataCache(tmp_path, corpus)
    path, _ = cache.tokenizer("bpe", 60)
    splits, entry, _ = cache.encoded(path)
    reader = pa.ipc.open_file(pa.memory_map(str(entry / "train.arrow")))
    sizes = [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
    assert len(sizes) > 1 and max(sizes) <= 7 and sum(sizes) == len(corpus["train"])
    tok = load_tokenizer(path)
    assert splits["train"].src == encode(tok, corpus["train"]["src"])
    assert splits["train"].tgt == encode(tok, corpus["train"]["tgt"])
    assert list(splits["train"].refs) == corpus["train"]["tgt"]


def test_a_target_tokenizer_encodes_the_targets_and_is_part_of_the_key(tmp_path, tiny_corpus):
    """An imported model's target-side tokenizer: each one, and none, is an entry of its own;
    without one the key is the tokenizer's alone, as before."""
    cache = DataCache(tmp_path, load_corpus(str(tiny_corpus)))
    path, _ = cache.tokenizer("bpe", 60)
    other, _ = cache.tokenizer("wordlevel", 60)
    splits, plain, _ = cache.encoded(path)
    assert plain == cache._entry("encoded", hashlib.sha256(path.read_bytes()).hexdigest())
    targets = cache.corpus["train"]["tgt"]
    by_other, entry, hit = cache.encoded(path, target_tokenizer_path=other)
    assert not hit and entry != plain and by_other["train"].src == splits["train"].src
    assert by_other["train"].tgt == encode(load_tokenizer(other), targets) != splits["train"].tgt
    _, third, hit = cache.encoded(path, target_tokenizer_path=path)  # another target tokenizer
    assert not hit and third not in (plain, entry)
    assert cache.encoded(path, target_tokenizer_path=other)[1:] == (entry, True)


def test_the_tokenizer_sample_is_part_of_the_key(tmp_path, tiny_corpus):
    cache = DataCache(tmp_path, load_corpus(str(tiny_corpus)))
    whole, _ = cache.tokenizer("bpe", 60)
    assert cache.tokenizer("bpe", 60) == (whole, True)
    sampled, hit = cache.tokenizer("bpe", 60, 10)
    assert not hit and sampled != whole


def test_a_warm_cache_never_reads_the_corpus(tmp_path, tiny_corpus):
    """The fingerprint of local files is a hash of their bytes: with the tokenizer and the
    encoding cached, the loader is never called; a changed byte is another corpus."""
    fingerprint, load = fingerprinted_corpus(str(tiny_corpus))
    cold = DataCache(tmp_path, load, fingerprint)
    cold.encoded(cold.tokenizer("bpe", 60)[0])

    def refuse() -> DatasetDict:
        raise AssertionError("the corpus was read")

    warm = DataCache(tmp_path, refuse, fingerprint)
    path, hit = warm.tokenizer("bpe", 60)
    assert hit and warm.encoded(path)[2]
    with open(tiny_corpus / "train.tsv", "a", encoding="utf-8") as f:
        f.write("one more\tpair\n")
    assert fingerprinted_corpus(str(tiny_corpus))[0] != fingerprint
    assert fingerprinted_corpus(str(tiny_corpus), seed=1)[0] != fingerprint  # other carved splits
