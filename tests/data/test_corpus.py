"""Tests for tformer_cli.data.corpus: every source kind, carving, validation messages,
fingerprints."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import types
from pathlib import Path

import datasets
import pytest

import tformer_cli
from tests.conftest import REPO, SHARED_DATA
from tformer_cli.data import corpus, text
from tformer_cli.data.corpus import (
    corpus_fingerprint,
    corpus_within,
    load_corpus,
    toy_corpus_dir,
    training_text,
)
from tformer_cli.errors import TformerError

MULTI30K = SHARED_DATA / "multi30k"

PAIRS = {
    "train": [("ein Hund", "a dog"), ("eine Katze", "a cat"), ("zwei Vögel", "two birds")],
    "valid": [("ein Baum", "a tree")],
    "test": [("Hallo, Welt!", "Hello, world!")],
}


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    return write(path, "".join(f"{s}\t{t}\n" for s, t in pairs))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_plain(
    folder: Path, stem: str, pairs: list[tuple[str, str]], langs: tuple[str, str] = ("de", "en")
) -> None:
    for k, lang in enumerate(langs):
        write(folder / f"{stem}.{lang}", "".join(pair[k] + "\n" for pair in pairs))


def pairs_of(ds: datasets.DatasetDict, split: str) -> list[tuple[str, str]]:
    return list(zip(ds[split]["src"], ds[split]["tgt"], strict=True))


def numbered(n: int) -> list[tuple[str, str]]:
    return [(f"quelle {i}", f"source {i}") for i in range(n)]


def error_of(*args, **kwargs) -> str:
    with pytest.raises(TformerError) as info:
        load_corpus(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep `load_dataset`'s Arrow cache inside the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


# --- sources ---------------------------------------------------------------------------------


def test_tsv_folder_gives_three_splits_of_string_src_tgt(tmp_path: Path) -> None:
    for split, pairs in PAIRS.items():
        write_tsv(tmp_path / f"{split}.tsv", pairs)
    ds = load_corpus(str(tmp_path))
    assert list(ds) == ["train", "valid", "test"]
    for split, pairs in PAIRS.items():
        assert ds[split].column_names == ["src", "tgt"]
        assert ds[split].features["src"].dtype == "string"
        assert pairs_of(ds, split) == pairs


def test_jsonl_folder_accepts_dev_as_the_valid_split(tmp_path: Path) -> None:
    for split, pairs in PAIRS.items():
        name = "dev" if split == "valid" else split
        write_jsonl(tmp_path / f"{name}.jsonl", [{"src": s, "tgt": t} for s, t in pairs])
    ds = load_corpus(str(tmp_path))
    assert {split: pairs_of(ds, split) for split in ds} == PAIRS


def test_plain_folder_reads_val_and_the_first_test_prefixed_files(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    write_plain(tmp_path, "train", PAIRS["train"], langs=("fr", "en"))
    write_plain(tmp_path, "val", PAIRS["valid"])
    write_plain(tmp_path, "test2016", PAIRS["test"])
    write_plain(tmp_path, "test2017", [("später", "later")])
    ds = load_corpus(str(tmp_path), src_lang="de", tgt_lang="en")
    assert {split: pairs_of(ds, split) for split in ds} == PAIRS


def test_plain_folder_prefers_test_over_other_test_prefixed_files(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    write_plain(tmp_path, "valid", PAIRS["valid"])
    write_plain(tmp_path, "test", PAIRS["test"])
    write_plain(tmp_path, "test2016", [("früher", "earlier")])
    ds = load_corpus(str(tmp_path), src_lang="en", tgt_lang="de")
    assert pairs_of(ds, "test") == [(t, s) for s, t in PAIRS["test"]]


def test_plain_folder_without_languages_lists_the_suffixes_found(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    write_plain(tmp_path, "train", PAIRS["train"], langs=("fr", "en"))
    message = error_of(str(tmp_path))
    assert str(tmp_path) in message and "--src" in message and "de, en, fr" in message


def test_plain_folder_unknown_language_lists_the_suffixes_found(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    message = error_of(str(tmp_path), src_lang="de", tgt_lang="cs")
    assert "'cs'" in message and "de, en" in message


def test_single_tsv_file_is_train_and_valid_test_are_carved_from_it(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "all.tsv", numbered(30))
    ds = load_corpus(str(path))
    assert [ds[s].num_rows for s in ds] == [24, 3, 3]


def test_single_jsonl_file_is_train_and_valid_test_are_carved_from_it(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "all.jsonl", [{"src": s, "tgt": t} for s, t in numbered(30)])
    ds = load_corpus(path)
    assert sorted(pairs_of(ds, "train") + pairs_of(ds, "valid") + pairs_of(ds, "test")) == sorted(
        numbered(30)
    )


def test_src_and_tgt_files_give_train_with_carved_valid_and_test(tmp_path: Path) -> None:
    write_plain(tmp_path, "corpus", numbered(50))
    ds = load_corpus(src_file=tmp_path / "corpus.de", tgt_file=tmp_path / "corpus.en")
    assert [ds[s].num_rows for s in ds] == [40, 5, 5]


def test_only_one_of_src_file_and_tgt_file_is_an_error(tmp_path: Path) -> None:
    write_plain(tmp_path, "corpus", numbered(5))
    assert "--tgt-file" in error_of(src_file=tmp_path / "corpus.de")


def test_valid_files_give_the_valid_split_and_only_test_is_carved(tmp_path: Path) -> None:
    write_plain(tmp_path / "a", "corpus", numbered(50))
    write_plain(tmp_path / "b", "newsdev", PAIRS["valid"])
    ds = load_corpus(
        src_file=tmp_path / "a" / "corpus.de",
        tgt_file=tmp_path / "a" / "corpus.en",
        valid_src_file=tmp_path / "b" / "newsdev.de",
        valid_tgt_file=tmp_path / "b" / "newsdev.en",
    )
    assert pairs_of(ds, "valid") == PAIRS["valid"]
    assert [ds[s].num_rows for s in ds] == [45, 1, 5]
    assert sorted(pairs_of(ds, "train") + pairs_of(ds, "test")) == sorted(numbered(50))


def test_valid_files_replace_the_valid_split_of_any_source(tmp_path: Path) -> None:
    for split, pairs in PAIRS.items():
        write_tsv(tmp_path / f"{split}.tsv", pairs)
    write_plain(tmp_path / "dev", "dev", [("neu", "new")])
    dev = tmp_path / "dev"
    ds = load_corpus(str(tmp_path), valid_src_file=dev / "dev.de", valid_tgt_file=dev / "dev.en")
    assert {split: pairs_of(ds, split) for split in ds} == {**PAIRS, "valid": [("neu", "new")]}


def test_one_valid_file_without_the_other_is_an_error(tmp_path: Path) -> None:
    write_plain(tmp_path, "dev", PAIRS["valid"])
    assert "--valid-src-file/--valid-tgt-file" in error_of(valid_tgt_file=tmp_path / "dev.en")


def test_valid_files_with_mismatched_line_counts_name_both_files(tmp_path: Path) -> None:
    write(tmp_path / "dev.de", "a\nb\n")
    write(tmp_path / "dev.en", "a\n")
    message = error_of(valid_src_file=tmp_path / "dev.de", valid_tgt_file=tmp_path / "dev.en")
    assert message == f"{tmp_path / 'dev.de'} has 2 lines but {tmp_path / 'dev.en'} has 1"


def test_files_data_without_the_files_is_an_error() -> None:
    assert "--src-file/--tgt-file" in error_of(corpus.FILES)


def test_kept_data_makes_files_absolute_and_names_the_data_files(tmp_path, monkeypatch) -> None:
    from tformer_cli.config import TrainConfig

    monkeypatch.chdir(tmp_path)
    write_plain(tmp_path / "wmt", "train", numbered(5))
    files = {"src_file": "wmt/train.de", "tgt_file": "wmt/train.en"}
    kept = corpus.kept_data(TrainConfig(data="toy", **files))
    assert (kept.data, kept.src_file, kept.tgt_file) == (
        "files",
        str(tmp_path / "wmt" / "train.de"),
        str(tmp_path / "wmt" / "train.en"),
    )
    with pytest.raises(TformerError, match=r"^wmt/train\.fr: no such file$"):
        corpus.kept_data(TrainConfig(src_file="wmt/train.fr", tgt_file="wmt/train.en"))


def test_folder_with_train_only_carves_valid_and_test(tmp_path: Path) -> None:
    write_tsv(tmp_path / "train.tsv", numbered(100))
    ds = load_corpus(str(tmp_path), carve_size=7)
    assert [ds[s].num_rows for s in ds] == [86, 7, 7]


def test_toy_source_reads_the_toy_corpus_dir(tmp_path: Path, monkeypatch) -> None:
    for split, pairs in PAIRS.items():
        write_tsv(tmp_path / f"{split}.tsv", pairs)
    monkeypatch.setattr(corpus, "_REPO_TOY_DIR", tmp_path)
    assert toy_corpus_dir() == tmp_path
    assert pairs_of(load_corpus("toy"), "test") == PAIRS["test"]


def test_toy_corpus_without_the_repo_is_generated_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def write_corpus(out_dir: Path, splits: dict) -> None:
        calls.append(out_dir)
        for split, pairs in splits.items():
            write_tsv(out_dir / f"{split}.tsv", pairs)

    fake = types.SimpleNamespace(generate=lambda seed=0: PAIRS, write_corpus=write_corpus)
    monkeypatch.setitem(sys.modules, "tformer_cli.data.toy", fake)
    monkeypatch.setattr(tformer_cli.data, "toy", fake, raising=False)
    monkeypatch.setattr(corpus, "_REPO", tmp_path / "site-packages")  # an installed wheel
    monkeypatch.setattr(corpus, "_REPO_TOY_DIR", tmp_path / "site-packages" / "data" / "toy")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = tmp_path / "cache" / "tformer" / f"toy-{tformer_cli.__version__}"
    assert toy_corpus_dir() == expected
    assert toy_corpus_dir() == expected
    assert len(calls) == 1
    assert sorted(p.name for p in expected.parent.iterdir()) == [expected.name]  # no temp left
    assert pairs_of(load_corpus("toy"), "train") == PAIRS["train"]


def test_bundled_toy_corpus_is_found_in_the_checkout_with_three_nonempty_splits() -> None:
    assert toy_corpus_dir() == REPO / "data" / "toy"  # the path climbs out of tformer_cli/data/
    ds = load_corpus("toy")
    assert all(ds[split].num_rows > 0 for split in ("train", "valid", "test"))


def test_a_checkout_missing_its_toy_corpus_fails_loudly(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    monkeypatch.setattr(corpus, "_REPO", tmp_path)
    monkeypatch.setattr(corpus, "_REPO_TOY_DIR", tmp_path / "data" / "toy")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(TformerError, match="toy corpus is missing from this checkout"):
        toy_corpus_dir()
    assert not (tmp_path / "cache").exists()  # nothing generated elsewhere


def test_lines_split_on_newline_only_with_crlf_and_bom_removed(tmp_path: Path) -> None:
    write(tmp_path / "train.tsv", "\ufeffa\u2028b\x85c\x0cd\tx\u2029y\r\nzwei\ttwo\r\n")
    for split in ("valid", "test"):
        write_tsv(tmp_path / f"{split}.tsv", PAIRS[split])
    ds = load_corpus(str(tmp_path))
    assert pairs_of(ds, "train") == [("a\u2028b\x85c\x0cd", "x\u2029y"), ("zwei", "two")]


# --- hf: through local files -----------------------------------------------------------------


def test_hf_local_folder_maps_validation_and_carves_the_missing_test(
    tmp_path: Path, hf_cache: None
) -> None:
    folder = tmp_path / "mydata"
    write_jsonl(folder / "train.jsonl", [{"src": s, "tgt": t, "id": 1} for s, t in numbered(20)])
    write_jsonl(folder / "validation.jsonl", [{"src": "ein Baum", "tgt": "a tree", "id": 2}])
    ds = load_corpus(f"hf:{folder}")
    assert [ds[s].num_rows for s in ds] == [18, 1, 2]
    assert ds["train"].column_names == ["src", "tgt"]
    assert pairs_of(ds, "valid") == [("ein Baum", "a tree")]


def test_hf_translation_column_is_mapped_by_the_chosen_languages(
    tmp_path: Path, hf_cache: None
) -> None:
    folder = tmp_path / "wmt"
    for split, pairs in PAIRS.items():
        rows = [{"translation": {"de": s, "en": t}} for s, t in pairs]
        write_jsonl(folder / f"{split}.jsonl", rows)
    ds = load_corpus(f"hf:{folder}", src_lang="en", tgt_lang="de")
    assert pairs_of(ds, "train") == [(t, s) for s, t in PAIRS["train"]]
    assert "de, en" in error_of(f"hf:{folder}")
    assert "'fr'" in error_of(f"hf:{folder}", src_lang="fr", tgt_lang="en")


def test_hf_language_code_columns_are_mapped(tmp_path: Path, hf_cache: None) -> None:
    folder = tmp_path / "csv"
    write(folder / "train.csv", "de,en\n" + "".join(f"{s},{t}\n" for s, t in numbered(10)))
    ds = load_corpus(f"hf:{folder}", src_lang="de", tgt_lang="en")
    assert pairs_of(ds, "train")[0] == ("quelle 0", "source 0")
    assert "columns: de, en" in error_of(f"hf:{folder}")


def test_hf_empty_target_names_split_and_row(tmp_path: Path, hf_cache: None, monkeypatch) -> None:
    folder = tmp_path / "bad"
    write_jsonl(folder / "train.jsonl", [{"src": "a", "tgt": "b"}, {"src": "c", "tgt": " "}])
    assert error_of(f"hf:{folder}").endswith("train row 2: empty target")
    monkeypatch.setattr(corpus, "ROWS", 2)  # read in batches of 2: the row counts on
    rows = [{"src": f"s{i}", "tgt": f"t{i}"} for i in range(6)]
    rows[4]["src"] = ""
    write_jsonl(folder / "train.jsonl", rows)
    assert error_of(f"hf:{folder}").endswith("train row 5: empty source")


def test_hf_unloadable_dataset_is_a_one_line_error(tmp_path: Path, hf_cache: None) -> None:
    message = error_of(f"hf:{tmp_path / 'missing'}")
    assert message.startswith(f"cannot load Hugging Face dataset '{tmp_path / 'missing'}': ")


def test_hf_local_folder_loads_without_asking_the_hub(
    tmp_path: Path, hf_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("a local folder must not probe the Hub")

    monkeypatch.setattr(huggingface_hub, "get_session", no_network)
    folder = tmp_path / "mine"
    write_jsonl(folder / "train.jsonl", [{"src": s, "tgt": t} for s, t in numbered(20)])
    assert load_corpus(f"hf:{folder}")["train"].num_rows == 16  # 2 + 2 carved


def closed_port() -> int:
    """A local TCP port that nothing listens on (bound, noted, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOAD_HF = """
import sys, time
from tformer_cli.data.corpus import load_corpus
from tformer_cli.errors import TformerError
start = time.perf_counter()
try:
    load_corpus("hf:someone/some-corpus:de-en")
except TformerError as e:
    print(f"{time.perf_counter() - start:.2f}", e)
"""


@pytest.mark.parametrize("offline", [False, True])
def test_hf_hub_dataset_without_network_fails_fast_and_quietly(
    tmp_path: Path, offline: bool
) -> None:
    """`load_dataset` alone retries five times over ~25 s, printing a warning each time. With
    HF_ENDPOINT on a closed port: one line naming the endpoint in a few seconds, no warning.
    Offline mode (HF_HUB_OFFLINE=1) skips the probe: `load_dataset` reads its cache at once."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", LOAD_HF], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    seconds, message = result.stdout.strip().split(" ", 1)
    assert float(seconds) < 5 and "\n" not in message
    assert message.startswith("cannot load Hugging Face dataset 'someone/some-corpus:de-en': ")
    assert (f"{endpoint} cannot be reached" in message) != offline


# --- carving ---------------------------------------------------------------------------------


def test_carving_is_deterministic_disjoint_and_keeps_every_pair(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", numbered(200))
    first, again = load_corpus(str(path), carve_size=20), load_corpus(str(path), carve_size=20)
    other = load_corpus(str(path), carve_size=20, seed=99)
    splits = {s: pairs_of(first, s) for s in first}
    assert splits == {s: pairs_of(again, s) for s in again}
    assert splits["valid"] != pairs_of(other, "valid")
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [160, 20, 20]
    assert sorted(splits["train"] + splits["valid"] + splits["test"]) == sorted(numbered(200))
    assert splits["train"] == [p for p in numbered(200) if p in set(splits["train"])]  # in order


def test_carving_draws_what_a_shuffled_list_drew(tmp_path: Path, monkeypatch) -> None:
    """The carve is a pass over the text file with a label a pair; its draws are those of
    ``random.Random(seed).shuffle`` on the list of row numbers, as before: the splits of runs
    carved before it are the same."""
    monkeypatch.setattr(text, "ROWS", 7)  # several batches to route
    pairs = numbered(97)
    order = list(range(97))
    random.Random(5).shuffle(order)
    valid, test = sorted(order[:9]), sorted(order[9:18])
    ds = load_corpus(str(write_tsv(tmp_path / "train.tsv", pairs)), carve_size=9, seed=5)
    assert pairs_of(ds, "valid") == [pairs[i] for i in valid]
    assert pairs_of(ds, "test") == [pairs[i] for i in test]
    assert pairs_of(ds, "train") == [p for i, p in enumerate(pairs) if i not in {*valid, *test}]


def test_the_text_is_written_under_folder_and_read_from_there(tmp_path, monkeypatch) -> None:
    """Each split is one Arrow file under ``folder``, which a pass reads (not through the map:
    ``text.read_batches``)."""
    path = write_tsv(tmp_path / "train.tsv", numbered(30))
    ds = load_corpus(str(path), folder=tmp_path / "text")
    read = []
    monkeypatch.setattr(text, "file_batches", lambda path: read.append(path) or iter([]))
    for split in ds.values():
        (cached,) = split.cache_files
        assert Path(cached["filename"]).parent.parent == tmp_path / "text"
        assert list(text.read_batches(split, "src")) == []  # what the file gave
    assert read == [Path(split.cache_files[0]["filename"]) for split in ds.values()]


def test_corpus_within_removes_its_text_files_at_the_end_of_the_block(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", numbered(30))
    with corpus_within(str(path), carve_size=3) as ds:
        files = [Path(split.cache_files[0]["filename"]) for split in ds.values()]
        assert pairs_of(ds, "valid") == pairs_of(load_corpus(str(path), carve_size=3), "valid")
        assert all(f.is_file() for f in files)
    assert not any(f.exists() or f.parent.exists() for f in files)


def test_an_error_after_the_first_batch_names_its_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(text, "ROWS", 2)  # batches already written when line 6 is read
    lines = [f"{s}\t{t}" for s, t in numbered(8)]
    lines[5] = "no tab here"
    path = write(tmp_path / "train.tsv", "\n".join(lines) + "\n")
    assert error_of(str(path)) == f"{path}:6: expected source<TAB>target, found 0 tabs"
    write(tmp_path / "a.de", "x\n" * 5 + "\n" + "x\n")
    write(tmp_path / "a.en", "y\n" * 7)
    message = error_of(src_file=tmp_path / "a.de", tgt_file=tmp_path / "a.en")
    assert message == f"{tmp_path / 'a.de'}:6: empty source"


@pytest.mark.parametrize(("n", "sizes"), [(25, [21, 2, 2]), (3, [1, 1, 1])])
def test_carving_a_small_corpus_takes_a_tenth_and_keeps_train_nonempty(
    tmp_path: Path, n: int, sizes: list[int]
) -> None:
    ds = load_corpus(str(write_tsv(tmp_path / "train.tsv", numbered(n))))
    assert [ds[s].num_rows for s in ds] == sizes


def test_carving_from_too_few_pairs_is_an_error(tmp_path: Path) -> None:
    message = error_of(str(write_tsv(tmp_path / "train.tsv", numbered(2))))
    assert "2 pairs" in message


# --- validation messages name the file and the line ------------------------------------------


def test_missing_folder_is_an_error(tmp_path: Path) -> None:
    assert error_of(str(tmp_path / "nowhere")) == f"{tmp_path / 'nowhere'}: no such file or folder"


def test_mismatched_line_counts_name_both_files(tmp_path: Path) -> None:
    write(tmp_path / "train.de", "a\nb\nc\n")
    write(tmp_path / "train.en", "a\nb\n")
    message = error_of(src_file=tmp_path / "train.de", tgt_file=tmp_path / "train.en")
    assert message == f"{tmp_path / 'train.de'} has 3 lines but {tmp_path / 'train.en'} has 2"


def test_plain_folder_split_with_mismatched_line_counts_names_both_files(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    write(tmp_path / "val.de", "a\nb\n")
    write(tmp_path / "val.en", "a\n")
    message = error_of(str(tmp_path), src_lang="de", tgt_lang="en")
    assert message == f"{tmp_path / 'val.de'} has 2 lines but {tmp_path / 'val.en'} has 1"


def test_plain_folder_split_without_its_target_file_names_the_file(tmp_path: Path) -> None:
    write_plain(tmp_path, "train", PAIRS["train"])
    write(tmp_path / "test2016.de", "a\n")
    message = error_of(str(tmp_path), src_lang="de", tgt_lang="en")
    assert message == f"{tmp_path / 'test2016.en'}: no such file"


@pytest.mark.parametrize("kind", ["plain", "tsv"])
def test_folder_without_a_train_split_is_an_error(tmp_path: Path, kind: str) -> None:
    if kind == "plain":
        write_plain(tmp_path, "valid", PAIRS["valid"])
    else:
        write_tsv(tmp_path / "valid.tsv", PAIRS["valid"])
    message = error_of(str(tmp_path), src_lang="de", tgt_lang="en")
    assert message.startswith(f"{tmp_path}: no train split")


def test_empty_source_in_plain_files_names_the_source_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "train.de", "a\n  \nc\n")
    write(tmp_path / "train.en", "a\nb\nc\n")
    message = error_of(src_file=tmp_path / "train.de", tgt_file=tmp_path / "train.en")
    assert message == f"{tmp_path / 'train.de'}:2: empty source"


def test_empty_target_in_tsv_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "a\tb\nc\t\n")
    assert error_of(str(path)) == f"{path}:2: empty target"


@pytest.mark.parametrize("line", ["no tab here", "one\ttwo\tthree"])
def test_tsv_line_without_exactly_one_tab_names_file_and_line(tmp_path: Path, line: str) -> None:
    path = write(tmp_path / "train.tsv", f"a\tb\n{line}\n")
    assert error_of(str(path)).startswith(f"{path}:2: expected source<TAB>target")


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", b"a\tb\nc\td\ne\t\xff\xfe\n")
    assert error_of(str(path)).startswith(f"{path}:3: invalid UTF-8")


def test_invalid_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", '{"src": "a", "tgt": "b"}\n{"src": "c",\n')
    assert error_of(str(path)).startswith(f"{path}:2: invalid JSON")


def test_json_line_without_src_and_tgt_strings_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", '{"src": "a", "tgt": "b"}\n{"src": "c", "tgt": 1}\n')
    assert error_of(str(path)).startswith(f"{path}:2: expected an object")


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "")
    assert error_of(str(path)) == f"{path}: empty file"
    path = write(tmp_path / "blank" / "train.tsv", "\n \r\n\n")
    assert error_of(str(path)) == f"{path}: empty file"


def test_blank_lines_after_the_text_are_not_pairs(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "a b\tx y\nc d\tz w\n\n\r\n")
    assert load_corpus(str(path), carve=False)["train"]["src"] == ["a b", "c d"]
    path = write(tmp_path / "inner.tsv", "a b\tx y\n\nc d\tz w\n")  # inside the text: an error
    assert error_of(str(path)).startswith(f"{path}:2: expected source<TAB>target")


def test_unsupported_file_type_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "train.txt", "a\n")
    assert "expected a folder, a .tsv or .jsonl file" in error_of(str(path))


# --- fingerprint -----------------------------------------------------------------------------


def test_fingerprint_is_stable_and_changes_with_the_content(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", numbered(40))
    fingerprint = corpus_fingerprint(load_corpus(str(path)))
    assert fingerprint == corpus_fingerprint(load_corpus(str(path)))
    assert len(fingerprint) == 16
    assert fingerprint != corpus_fingerprint(load_corpus(str(path), seed=7))
    write_tsv(path, [*numbered(39), ("quelle 39", "source 39!")])
    assert fingerprint != corpus_fingerprint(load_corpus(str(path)))


# --- real data -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent (outside the repository)")
def test_multi30k_loads_with_its_standard_split_sizes() -> None:
    ds = load_corpus(str(MULTI30K), src_lang="de", tgt_lang="en")
    assert [ds[s].num_rows for s in ds] == [29000, 1014, 1000]
    assert ds["test"][0]["src"].startswith("Ein Mann mit einem orangefarbenen Hut")


def test_absolute_data_makes_local_paths_absolute_and_keeps_names(tmp_path, monkeypatch):
    from tformer_cli.data.corpus import absolute_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.tsv").write_text("a\tb\n", encoding="utf-8")
    (tmp_path / "saved").mkdir()
    assert absolute_data("mine.tsv") == str(tmp_path / "mine.tsv")
    assert absolute_data("hf:saved:de-en") == f"hf:{tmp_path / 'saved'}:de-en"
    for kept in ("toy", "hf:wmt16:de-en", "hf:", "missing.tsv"):
        assert absolute_data(kept) == kept


@pytest.mark.parametrize("where", ["memory", "file"])
def test_training_text_streams_sources_then_targets_or_a_bounded_even_sample(
    tmp_path, monkeypatch, where
):
    """From a split in memory (sliced through ``datasets``) and from a text file as
    ``load_corpus`` writes it (read a batch at a time, not mapped), the same sentences."""
    monkeypatch.setattr(text, "ROWS", 3)  # several reads
    pairs = [(f"s{i}", f"t{i}") for i in range(10)]
    if where == "file":
        assert text.write_pairs(pairs, tmp_path / "train.arrow") == 10
        train = datasets.Dataset.from_file(str(tmp_path / "train.arrow"))
    else:
        train = datasets.Dataset.from_dict(
            {"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}
        )
    whole = [*train["src"], *train["tgt"]]
    assert list(training_text(train)) == whole  # what the tokenizer trained on before sampling
    assert list(training_text(train, 20)) == whole
    assert list(training_text(train, 8)) == ["s0", "s3", "s6", "s9", "t0", "t3", "t6", "t9"]
    assert list(training_text(train, 1)) == ["s0", "t0"]


@pytest.fixture(params=[1, 2, 5, 8, 1 << 20])
def read_bytes(request, monkeypatch):
    """Blocks of so few bytes that every line, and a multibyte character, straddles one."""
    monkeypatch.setattr(corpus, "READ_BYTES", request.param)
    return request.param


def write_pair(folder: Path, src: bytes, tgt: bytes) -> tuple[Path, Path]:
    (folder / "x.de").write_bytes(src)
    (folder / "x.en").write_bytes(tgt)
    return folder / "x.de", folder / "x.en"


def test_blocks_of_any_size_read_the_same_lines(tmp_path, read_bytes):
    src, tgt = write_pair(tmp_path, "\ufeffgrüße\r\nü ö\n\nä\n\n\n".encode(), b"a\nb\n\nc\n")
    with pytest.raises(TformerError, match=r"x\.de:3: empty source"):
        load_corpus(src_file=src, tgt_file=tgt, carve=False)
    (tmp_path / "x.de").write_bytes("\ufeffgrüße\r\nü ö\nß\nä\n\n\n".encode())
    (tmp_path / "x.en").write_bytes(b"a\nb\nc\nd")
    train = load_corpus(src_file=src, tgt_file=tgt, carve=False)["train"]
    assert train["src"] == ["grüße", "ü ö", "ß", "ä"] and train["tgt"] == ["a", "b", "c", "d"]


def test_bad_utf8_is_named_by_its_line_at_any_block_size(tmp_path, read_bytes):
    src, tgt = write_pair(
        tmp_path, "one\ntwo\nthrée\nf\xffour\n".encode("latin-1"), b"1\n2\n3\n4\n"
    )
    with pytest.raises(TformerError, match=r"x\.de:3: invalid UTF-8") as info:
        load_corpus(src_file=src, tgt_file=tgt, carve=False)
    assert "\n" not in str(info.value)


def test_line_counts_that_differ_are_reported_before_an_empty_line(tmp_path, read_bytes):
    src, tgt = write_pair(tmp_path, b"a\n\nc\nd\n", b"1\n2\n3\n")
    with pytest.raises(TformerError, match=r"x\.de has 4 lines but .*x\.en has 3$"):
        load_corpus(src_file=src, tgt_file=tgt, carve=False)
    write_pair(tmp_path, b"a\nb\nc\n", b"1\n \n3\n")
    with pytest.raises(TformerError, match=r"x\.en:2: empty target"):
        load_corpus(src_file=src, tgt_file=tgt, carve=False)
    write_pair(tmp_path, b"\n\n", b"1\n")
    with pytest.raises(TformerError, match=r"x\.de: empty file"):
        load_corpus(src_file=src, tgt_file=tgt, carve=False)
