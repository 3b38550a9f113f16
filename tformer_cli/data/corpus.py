"""Load parallel text as a `datasets.DatasetDict`: splits train/valid/test, string columns src/tgt.

Sources (docs/data.md): `"toy"`; a folder of `{train,valid,test}` `.tsv`, `.jsonl` or
`.<lang>` files (the valid split may be `validation`, `val` or `dev`, the test split the first
`test*`); one `.tsv` or `.jsonl` file (train); `src_file`/`tgt_file` (train, `FILES`) and
`valid_src_file`/`valid_tgt_file` (valid); `"hf:NAME[:CONFIG]"`. Missing valid/test splits are
carved from train (`_carve`). Every problem is a one-line `TformerError` naming the file and line.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import zip_longest
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets import Dataset, DatasetDict, DatasetInfo, Features, Value

from tformer_cli import __version__
from tformer_cli.config import TrainConfig
from tformer_cli.data.hub import check_dataset_hub
from tformer_cli.data.text import ROWS, read_batches, route, write_pairs
from tformer_cli.errors import TformerError, first_line

SPLITS = ("train", "valid", "test")
VALID_NAMES = ("valid", "validation", "val", "dev")
_REPO = Path(__file__).resolve().parents[2]  # the checkout holding tformer_cli/, if any
_REPO_TOY_DIR = _REPO / "data" / "toy"
_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})

Pairs = Iterator[tuple[str, str]]  # (source, target) pairs, validated as they are read


FILES = "files"  # the `data` of a run trained on --src-file/--tgt-file
PARALLEL_FILES = ("src_file", "tgt_file", "valid_src_file", "valid_tgt_file")  # TrainConfig's


def load_corpus(
    data: str | Path = "toy",
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_file: str | Path | None = None,
    tgt_file: str | Path | None = None,
    valid_src_file: str | Path | None = None,
    valid_tgt_file: str | Path | None = None,
    seed: int = 1234,
    carve_size: int = 1000,
    carve: bool = True,
    folder: Path | None = None,
) -> DatasetDict:
    """Load a parallel corpus as train/valid/test (``carve=False``: none carved from train),
    written ``text.ROWS`` pairs at a time to Arrow files that the splits memory-map, in a new
    folder under ``folder`` (default: the temporary folder) removed when the process ends."""
    files = dict(src_file=src_file, tgt_file=tgt_file, valid_src_file=valid_src_file,
                 valid_tgt_file=valid_tgt_file)  # fmt: skip
    located = locate_files(data, src_lang, tgt_lang, **files)
    splits = _load_hf(str(data)[3:], src_lang, tgt_lang) if "train" not in located else {}
    splits.update({name: reader(*paths) for name, (reader, paths) in located.items()})
    root = _text_folder(folder)
    counts = {name: write_pairs(pairs, root / f"{name}.arrow") for name, pairs in splits.items()}
    carved = {name for name in SPLITS if name not in counts} if carve else set()
    if carved:
        _carve(root, counts["train"], sorted(carved, key=SPLITS.index), seed, carve_size)
    return DatasetDict(
        {
            name: Dataset.from_file(
                str(root / f"{name}.arrow"),
                info=DatasetInfo(description=CARVED if name in carved else "", features=_FEATURES),
            )
            for name in SPLITS
            if name in counts or name in carved
        }
    )


@contextmanager
def corpus_within(data: str | Path = "toy", **options: Any) -> Iterator[DatasetDict]:
    """``load_corpus(data, **options)`` for a ``with`` block, its text files removed after."""
    with tempfile.TemporaryDirectory(prefix="tformer-corpus-") as tmp:
        yield load_corpus(data, folder=Path(tmp), **options)


def _text_folder(parent: Path | None) -> Path:
    """A new folder for a corpus's text under ``parent``, removed when the process ends."""
    try:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=".corpus-", dir=parent))
    except OSError as e:
        raise TformerError(
            f"cannot write the corpus's text to {parent}: {e.strerror or e}"
        ) from None
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


CARVED = "carved from train"  # the description of a split that the source did not hold
Located = dict[str, tuple[Callable[..., Pairs], tuple[Path, ...]]]  # split -> (reader, files)


def locate_files(
    data: str | Path,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    **files: str | Path | None,
) -> Located:
    """The files each split is read from, with their reader (``load_dataset`` reads ``hf:``)."""
    src, tgt, valid_src, valid_tgt = (files.get(name) for name in PARALLEL_FILES)
    located: Located = {}
    if src is not None or tgt is not None:
        located = {"train": _file_pair(src, tgt, "--src-file/--tgt-file")}
    elif str(data) == FILES:
        raise TformerError(
            f"data '{FILES}' needs a source and a target file (--src-file/--tgt-file)"
        )
    elif not str(data).startswith("hf:"):
        path = toy_corpus_dir() if str(data) == "toy" else Path(data)
        located = _locate_path(path, src_lang, tgt_lang)
    if valid_src is not None or valid_tgt is not None:
        located["valid"] = _file_pair(valid_src, valid_tgt, "--valid-src-file/--valid-tgt-file")
    return located


def fingerprinted_corpus(
    data: str | Path, *, seed: int = 1234, folder: Path | None = None, **options: str | Path | None
) -> tuple[str, Callable[[], DatasetDict]]:
    """The corpus's fingerprint, and a loader of it (``load_corpus``, once). Local files are
    fingerprinted by their bytes, the split each makes and the seed, unread where the cache
    holds their encoding; an ``hf:`` corpus is loaded and hashed."""
    load = functools.cache(lambda: load_corpus(data, seed=seed, folder=folder, **options))  # type: ignore[arg-type]
    located = locate_files(data, **options)  # its src_lang, tgt_lang and PARALLEL_FILES
    if "train" not in located:  # an hf: dataset
        return corpus_fingerprint(load()), load
    h = hashlib.sha256(f"files\x1d{seed}".encode())
    for name, (reader, paths) in sorted(located.items()):
        h.update(f"\x1d{name}\x1d{reader.__name__}".encode())
        for path in paths:
            h.update(b"\x1e" + _file_hash(path))
    return h.hexdigest()[:16], load


def _file_hash(path: Path, block: int = 1 << 20) -> bytes:
    """The SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
    except FileNotFoundError:
        raise TformerError(f"{path}: no such file") from None
    except OSError as e:
        raise TformerError(f"{path}: cannot read ({e.strerror})") from e
    return h.digest()


def absolute_data(data: str) -> str:
    """``data`` as a run keeps it: a local path (``hf:`` folders too) made absolute."""
    name, prefix = (data[3:], "hf:") if data.startswith("hf:") else (data, "")
    path, sep, config = name.partition(":") if prefix else (name, "", "")
    if data == "toy" or not path or not Path(path).exists():
        return data
    return f"{prefix}{Path(path).resolve()}{sep}{config}"


def kept_data(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with local paths absolute, and ``data`` = ``FILES`` with --src-file."""
    files = {name: absolute_file(getattr(cfg, name)) for name in PARALLEL_FILES}
    data = FILES if cfg.src_file is not None else absolute_data(cfg.data)
    return dataclasses.replace(cfg, data=data, **files)


def absolute_file(path: str | Path | None) -> str | None:
    """A parallel file as a run keeps it: absolute; a missing file is an error now."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise TformerError(f"{path}: no such file")
    return str(Path(path).resolve())


def toy_corpus_dir() -> Path:
    """The toy corpus folder: the repository's `data/toy`, else (an installed wheel) one
    generated once by `toy.py` into `$XDG_CACHE_HOME/tformer/toy-<version>`."""
    if (_REPO_TOY_DIR / "train.tsv").is_file():
        return _REPO_TOY_DIR
    if (_REPO / "pyproject.toml").is_file():  # a checkout without its corpus: never paper over it
        raise TformerError(
            f"the toy corpus is missing from this checkout ({_REPO_TOY_DIR}/train.tsv):"
            " restore it with `git checkout data/toy`"
        )
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache_home / "tformer" / f"toy-{__version__}"
    if (target / "train.tsv").is_file():
        return target
    from tformer_cli.data import toy  # lazily: only an installed package needs the generator here

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".toy-", dir=target.parent))
        try:
            toy.write_corpus(tmp, toy.generate())
            os.replace(tmp, target)  # atomic: a reader never sees a half-written corpus
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        if not (target / "train.tsv").is_file():  # else a concurrent process won the race
            raise TformerError(f"cannot write the toy corpus to {target}: {e}") from e
    return target


def corpus_fingerprint(ds: DatasetDict) -> str:
    """A short hash of the corpus content (split names and every pair), stable across runs."""
    h = hashlib.sha256()
    for name in sorted(ds):
        h.update(f"\x1d{name}\x1d{len(ds[name])}".encode())
        for column in ("src", "tgt"):
            h.update(b"\x1d")
            sep = b""  # between two texts
            for texts in read_batches(ds[name], column):
                if len(texts):
                    h.update(sep + "\x1e".join(texts.to_pylist()).encode())
                    sep = b"\x1e"
    return h.hexdigest()[:16]


def training_text(train: Dataset, sample: int = 0) -> Iterator[str]:
    """The sentences a tokenizer trains on, streamed: every source, then every target; with
    ``sample``, those of ``sample // 2`` evenly spaced pairs."""
    n = len(train)
    rows = None
    if sample and 2 * n > sample:
        rows = np.linspace(0, n - 1, max(1, sample // 2)).astype(np.int64)
    for column in ("src", "tgt"):
        start = 0
        for texts in read_batches(train, column):
            end = start + len(texts)
            if rows is not None:
                texts = texts.take(
                    rows[np.searchsorted(rows, start) : np.searchsorted(rows, end)] - start
                )
            yield from texts.to_pylist()
            start = end


READ_BYTES = 1 << 20  # bytes of a text file read and decoded at a time


def _read_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 file, split on `\\n` only, less the blank lines at its end."""
    blanks, seen = 0, False  # blank lines held back until text follows them
    for line in _decoded_lines(path):
        if not line.strip():
            blanks += 1
            continue
        yield from [""] * blanks
        blanks, seen = 0, True
        yield line
    if not seen:
        raise TformerError(f"{path}: empty file")


def _decoded_lines(path: Path) -> Iterator[str]:
    """Every line of ``path``, decoded ``READ_BYTES`` of whole lines at a time."""
    try:
        with open(path, "rb") as f:
            pending, before = f.read(3).removeprefix(b"\xef\xbb\xbf"), 0  # a byte order mark
            while True:
                data = f.read(READ_BYTES)
                pending += data
                cut = pending.rfind(b"\n") + 1 if data else len(pending)  # at the end: all
                if data and not cut:
                    continue  # no whole line yet
                block, pending = pending[:cut], pending[cut:]
                try:
                    lines = block.decode("utf-8").split("\n")
                except UnicodeDecodeError as e:
                    line = before + block.count(b"\n", 0, e.start) + 1
                    raise TformerError(f"{path}:{line}: invalid UTF-8 ({e.reason})") from None
                if data:
                    lines.pop()  # the nothing after the block's last newline
                before += len(lines)
                yield from (line.removesuffix("\r") for line in lines)
                if not data:
                    return
    except FileNotFoundError:
        raise TformerError(f"{path}: no such file") from None
    except OSError as e:
        raise TformerError(f"{path}: cannot read ({e.strerror})") from e


def _checked(src: str, tgt: str, where: str, tgt_where: str | None = None) -> tuple[str, str]:
    """The pair, after a one-line error for an empty side (at ``where``, or ``tgt_where``)."""
    for text, side, at in ((src, "source", where), (tgt, "target", tgt_where or where)):
        if not (text and text.strip()):
            raise TformerError(f"{at}: empty {side}")
    return src, tgt


def _read_plain(src_path: Path, tgt_path: Path) -> Pairs:
    """Two files aligned by line number (a differing line count reported first)."""
    counts, empty = [0, 0], None
    for i, (s, t) in enumerate(zip_longest(_read_lines(src_path), _read_lines(tgt_path)), 1):
        counts = [counts[0] + (s is not None), counts[1] + (t is not None)]
        if s is None or t is None:
            continue  # counting the longer file's rest
        try:
            _checked(s, t, f"{src_path}:{i}", f"{tgt_path}:{i}")
        except TformerError as e:
            empty = empty or e
        yield s, t
    if counts[0] != counts[1]:
        raise TformerError(f"{src_path} has {counts[0]} lines but {tgt_path} has {counts[1]}")
    if empty is not None:
        raise empty


def _file_pair(
    src: str | Path | None, tgt: str | Path | None, options: str
) -> tuple[Callable[..., Pairs], tuple[Path, ...]]:
    if src is None or tgt is None:
        raise TformerError(f"give both a source file and a target file ({options})")
    return _read_plain, (Path(src), Path(tgt))


def _read_tsv(path: Path) -> Pairs:
    """`source<TAB>target` per line."""
    for i, line in enumerate(_read_lines(path), start=1):
        tabs = line.count("\t")
        if tabs != 1:
            raise TformerError(f"{path}:{i}: expected source<TAB>target, found {tabs} tabs")
        yield _checked(*line.split("\t"), f"{path}:{i}")


def _read_jsonl(path: Path) -> Pairs:
    """One JSON object `{"src": ..., "tgt": ...}` per line."""
    for i, line in enumerate(_read_lines(path), start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TformerError(f"{path}:{i}: invalid JSON ({e.msg})") from None
        if not (isinstance(obj, dict) and all(isinstance(obj.get(k), str) for k in ("src", "tgt"))):
            raise TformerError(f'{path}:{i}: expected an object {{"src": "...", "tgt": "..."}}')
        yield _checked(obj["src"], obj["tgt"], f"{path}:{i}")


READERS = {".tsv": _read_tsv, ".jsonl": _read_jsonl}  # a file's reader, by its suffix


def _pick_splits(names: Iterable[str]) -> dict[str, str]:
    """Map our split names to the available ones: `test` wins over the sorted first `test*`."""
    names = set(names)
    picked = {"train": "train"} if "train" in names else {}
    valid = [n for n in VALID_NAMES if n in names]
    tests = sorted(n for n in names if n.startswith("test"))
    if valid:
        picked["valid"] = valid[0]
    if tests:
        picked["test"] = "test" if "test" in tests else tests[0]
    return picked


def _choose_langs(
    where: str, found: Sequence[str], src_lang: str | None, tgt_lang: str | None
) -> tuple[str, str]:
    listed = ", ".join(sorted(found)) or "none"
    if src_lang is None or tgt_lang is None:
        raise TformerError(f"{where}: choose the languages with --src and --tgt (found: {listed})")
    for lang in (src_lang, tgt_lang):
        if lang not in found:
            raise TformerError(f"{where}: no language '{lang}' (found: {listed})")
    return src_lang, tgt_lang


def _locate_path(path: Path, src_lang: str | None, tgt_lang: str | None) -> Located:
    if path.is_dir():
        return _locate_dir(path, src_lang, tgt_lang)
    if path.suffix in READERS and path.is_file():
        return {"train": (READERS[path.suffix], (path,))}
    if not path.exists():
        raise TformerError(f"{path}: no such file or folder")
    raise TformerError(f"{path}: expected a folder, a .tsv or .jsonl file, 'toy' or 'hf:NAME'")


def _locate_dir(folder: Path, src_lang: str | None, tgt_lang: str | None) -> Located:
    files = {p.name for p in folder.iterdir() if p.is_file()}
    for ext, reader in READERS.items():
        if f"train{ext}" in files:
            stems = [name.removesuffix(ext) for name in files if name.endswith(ext)]
            return {s: (reader, (folder / f"{n}{ext}",)) for s, n in _pick_splits(stems).items()}
    langs = [name.removeprefix("train.") for name in files if name.startswith("train.")]
    if not langs:
        raise TformerError(
            f"{folder}: no train split (expected train.tsv, train.jsonl or train.<lang> files)"
        )
    src_lang, tgt_lang = _choose_langs(str(folder), langs, src_lang, tgt_lang)
    stems = [name.removesuffix(f".{src_lang}") for name in files if name.endswith(f".{src_lang}")]
    return {
        split: (_read_plain, (folder / f"{stem}.{src_lang}", folder / f"{stem}.{tgt_lang}"))
        for split, stem in _pick_splits(stems).items()
    }


def _load_hf(spec: str, src_lang: str | None, tgt_lang: str | None) -> dict[str, Pairs]:
    """`spec` is `NAME[:CONFIG]`: a hub dataset or a local folder `load_dataset` can read."""
    name, _, config = spec.partition(":")
    if not name:
        raise TformerError("hf: needs a dataset name, e.g. hf:wmt16:de-en")
    if not Path(name).exists():  # a dataset on the Hub, not a local folder
        check_dataset_hub(spec)
    try:
        raw = datasets.load_dataset(name, config or None)
    except Exception as e:  # hub, network, file and format errors all surface here
        raise TformerError(f"cannot load Hugging Face dataset '{spec}': {first_line(e)}") from e
    picked = _pick_splits(raw)
    if "train" not in picked:
        raise TformerError(f"hf:{spec}: no train split (found: {', '.join(sorted(raw))})")
    return {
        split: _hf_pairs(raw[hf_split], f"hf:{spec}", hf_split, src_lang, tgt_lang)
        for split, hf_split in picked.items()
    }


def _hf_pairs(
    ds: Dataset, label: str, split: str, src_lang: str | None, tgt_lang: str | None
) -> Pairs:
    """The pairs of a split of a ``datasets`` dataset, read and validated a batch at a time."""
    ds, src_col, tgt_col = _hf_columns(ds, label, src_lang, tgt_lang)
    if not len(ds):
        raise TformerError(f"{label}: the {split} split is empty")
    i = 0
    for rows in ds.select_columns([src_col, tgt_col]).iter(batch_size=ROWS):
        for s, t in zip(rows[src_col], rows[tgt_col], strict=True):
            i += 1
            yield _checked(s, t, f"{label} {split} row {i}")


def _hf_columns(
    ds: Dataset, label: str, src_lang: str | None, tgt_lang: str | None
) -> tuple[Dataset, str, str]:
    """The dataset (flattened if needed) and the names of its source and target columns."""
    columns = ds.column_names
    if "translation" in columns:
        feature = ds.features["translation"]  # a `Translation` feature or a dict of strings
        langs = list(getattr(feature, "languages", None) or feature)
        src_lang, tgt_lang = _choose_langs(f"{label} translation", langs, src_lang, tgt_lang)
        return ds.flatten(), f"translation.{src_lang}", f"translation.{tgt_lang}"
    if "src" in columns and "tgt" in columns:
        return ds, "src", "tgt"
    if src_lang in columns and tgt_lang in columns:
        return ds, src_lang, tgt_lang
    raise TformerError(
        f"{label}: no 'translation' or 'src'/'tgt' columns; name the language columns with "
        f"--src and --tgt (columns: {', '.join(columns)})"
    )


def _carve(root: Path, n: int, missing: Sequence[str], seed: int, carve_size: int) -> None:
    """Fill the missing valid/test splits with pairs of ``root/train.arrow`` (``n`` pairs),
    rewriting it without them: each takes `carve_size` pairs, or a tenth of train when fewer,
    drawn by a shuffle seeded with `seed`; every split keeps train's order."""
    if carve_size < 1:
        raise TformerError(f"carve size must be at least 1, got {carve_size}")
    size = min(carve_size, max(1, n // 10))
    if n <= size * len(missing):
        raise TformerError(
            f"train has {n} pairs: too few to carve a {' and a '.join(missing)} split from it"
        )
    order = array("q", range(n))
    random.Random(seed).shuffle(order)  # type: ignore[arg-type]  # the draws of a list's shuffle
    labels = np.zeros(n, dtype=np.uint8)  # 0: train, k: the k-th missing split
    for k in range(len(missing)):
        labels[np.frombuffer(order, dtype=np.int64)[k * size : (k + 1) * size]] = k + 1
    del order
    whole = root / "train.arrow"
    rest = whole.rename(root / ".whole.arrow")
    route(rest, labels, [whole, *(root / f"{name}.arrow" for name in missing)])
    rest.unlink()
