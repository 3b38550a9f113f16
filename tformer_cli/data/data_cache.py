"""A cache of trained tokenizers and encoded corpora beside the runs, `<runs_dir>/.cache/`, so a
second `tformer train` on the same data with the same tokenizer settings starts in seconds:

- `tokenizer-<key>/tokenizer.json`, keyed by the corpus fingerprint, the tokenizer's kind,
  vocabulary size and pipeline: every new run with these settings copies it (unigram training
  is not deterministic).
- `encoded-<key>/{train,valid,test}.arrow`, keyed by the corpus fingerprint and the tokenizers'
  bytes: int32 list columns `src`/`tgt` (token ids without specials) and the `ref` strings.

An entry is written to a temporary folder, then renamed into place: a reader never sees half an
entry, and when two runs race the first rename wins.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
from datasets import DatasetDict
from rich.progress import Progress
from tokenizers import Tokenizer

from tformer_cli import __version__
from tformer_cli.data.corpus import SPLITS, corpus_fingerprint, training_text
from tformer_cli.data.split import ArrowColumn, MappedFile, Split
from tformer_cli.data.text import read_batches
from tformer_cli.data.tokenizer import (
    encode,
    load_tokenizer,
    pipeline_signature,
    train_tokenizer,
    write_tokenizer,
)
from tformer_cli.errors import TformerError
from tformer_cli.files import give_usual_mode, storage_fault, write_error

CACHE_DIR = ".cache"  # under the runs folder
CACHE_FORMAT = 1  # bump when an entry's layout changes
TOKENIZER = "tokenizer.json"
ENCODED_SCHEMA = pa.schema(
    [("src", pa.list_(pa.int32())), ("tgt", pa.list_(pa.int32())), ("ref", pa.string())]
)


class DataCache:
    """The cache entries of one corpus under ``cache_dir``."""

    def __init__(
        self,
        cache_dir: Path,
        corpus: DatasetDict | Callable[[], DatasetDict],
        fingerprint: str | None = None,
    ) -> None:
        """``corpus``, or a loader of it called on a miss alone, with its ``fingerprint``."""
        self.cache_dir = cache_dir
        self.load = corpus if callable(corpus) else lambda: corpus
        self.fingerprint = fingerprint or corpus_fingerprint(self.corpus)

    @property
    def corpus(self) -> DatasetDict:
        """The corpus, loaded now if it was not yet."""
        return self.load()

    def _entry(self, kind: str, *settings: str) -> Path:
        parts = "\x1f".join((str(CACHE_FORMAT), __version__, self.fingerprint, *settings))
        return self.cache_dir / f"{kind}-{hashlib.sha256(parts.encode()).hexdigest()[:16]}"

    def tokenizer(self, kind: str, vocab_size: int, sample: int = 0) -> tuple[Path, bool]:
        """The tokenizer.json trained on the train split (``training_text``), trained now on a
        miss: (its path, whether it was cached already)."""
        entry = self._entry("tokenizer", kind, str(vocab_size), pipeline_signature(), str(sample))
        if (entry / TOKENIZER).is_file():
            return entry / TOKENIZER, True
        tok = train_tokenizer(training_text(self.corpus["train"], sample), vocab_size, kind)
        _write_entry(entry, lambda tmp: write_tokenizer(tok, tmp / TOKENIZER))
        return entry / TOKENIZER, False

    def encoded(
        self,
        tokenizer_path: Path,
        progress: Progress | None = None,
        target_tokenizer_path: Path | None = None,
    ) -> tuple[dict[str, Split], Path, bool]:
        """Every split encoded (the targets by ``target_tokenizer_path`` where given), now on a
        miss (counted on ``progress``), memory-mapped (``read_split``): (the splits, the entry,
        whether it was cached already)."""
        paths = [tokenizer_path, *([target_tokenizer_path] if target_tokenizer_path else [])]
        entry = self._entry("encoded", *(hashlib.sha256(p.read_bytes()).hexdigest() for p in paths))
        hit = entry.is_dir()
        if not hit:
            src_tok, tgt_tok = load_tokenizer(paths[0]), load_tokenizer(paths[-1])
            with progress or Progress(disable=True) as bar:
                task = bar.add_task("encode", total=sum(map(len, self.corpus.values())), info="")
                advance = partial(bar.advance, task)
                _write_entry(entry, lambda tmp: self._encode(src_tok, tgt_tok, tmp, advance))
        return {name: read_split(entry / f"{name}.arrow") for name in SPLITS}, entry, hit

    def _encode(
        self, src_tok: Tokenizer, tgt_tok: Tokenizer, folder: Path, advance: Callable[[int], None]
    ) -> None:
        """Write every split encoded to ``folder/<split>.arrow``, a batch at a time."""
        for name in SPLITS:
            split = self.corpus[name]
            with pa.ipc.new_file(folder / f"{name}.arrow", ENCODED_SCHEMA) as writer:
                for src, tgt in zip(
                    read_batches(split, "src"), read_batches(split, "tgt"), strict=True
                ):
                    refs = tgt.to_pylist()
                    ids = [encode(src_tok, src.to_pylist()), encode(tgt_tok, refs), refs]
                    writer.write_batch(pa.record_batch(ids, schema=ENCODED_SCHEMA))
                    advance(len(refs))


def read_split(path: Path) -> Split:
    """The split in the Arrow file ``path``, memory-mapped (``ArrowColumn``, ``MappedFile``)."""
    try:
        source = pa.memory_map(str(path))
        file = MappedFile(path, source)
        table = pa.ipc.open_file(source).read_all()
        if table.schema != ENCODED_SCHEMA:
            raise pa.ArrowInvalid(f"schema {table.schema} is not {ENCODED_SCHEMA}")
        src, tgt, refs = (
            ArrowColumn(table.column(name).chunks, file) for name in ENCODED_SCHEMA.names
        )
        return Split(src, tgt, refs)
    except (OSError, pa.ArrowInvalid) as e:
        raise TformerError(f"{path} is corrupt ({e}); delete {path.parent} to rebuild it") from None


def _write_entry(entry: Path, write: Callable[[Path], None]) -> None:
    """Fill a temporary folder beside ``entry`` with ``write(tmp)``, then rename it to ``entry``."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as e:
        raise write_error(entry.parent, e) from None
    try:
        write(tmp)
        give_usual_mode(tmp)  # mkdtemp makes 0700
        os.replace(tmp, entry)
    except Exception as e:
        fault = storage_fault(e)
        if fault is None:
            raise
        if not entry.is_dir():  # else a concurrent run wrote the same entry first: use theirs
            raise write_error(entry, fault) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
