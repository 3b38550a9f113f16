"""A cache of trained tokenizers and encoded corpora beside the runs, `<runs_dir>/.cache/<key>/`,
so a second `tformer train` on the same data with the same tokenizer settings starts in seconds.

- `tokenizer-<key>/tokenizer.json`, key = hash of the corpus fingerprint, the tokenizer kind,
  the vocabulary size and the text pipeline around the subword model (normalizer,
  pre-tokenizer, decoder). BPE training is deterministic but unigram training is not, so the cached
  file is the source of truth: every new run with these settings starts from a copy of it.
- `encoded-<key>/{train,valid,test}.arrow`, key = hash of the corpus fingerprint and the
  tokenizer.json bytes: Arrow IPC files with int32 list columns `src`/`tgt` (token ids without
  specials) and the `ref` strings (the raw targets, for BLEU). A resumed run, which keeps its own
  tokenizer.json, finds its encoding under the same key.

An entry is written to a temporary folder, then renamed into place (`os.replace`): a reader never
sees half an entry, and when two runs race the first rename wins. Length filtering is not cached;
the trainer applies it to the loaded splits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from datasets import DatasetDict

from tformer_cli import __version__
from tformer_cli.data.corpus import SPLITS, corpus_fingerprint
from tformer_cli.data.split import ArrowColumn, Split
from tformer_cli.data.tokenizer import encode, load_tokenizer, pipeline_signature, train_tokenizer
from tformer_cli.errors import TformerError

CACHE_DIR = ".cache"  # under the runs folder
FORMAT = 1  # bump when an entry's layout changes
TOKENIZER = "tokenizer.json"
SCHEMA = pa.schema(
    [("src", pa.list_(pa.int32())), ("tgt", pa.list_(pa.int32())), ("ref", pa.string())]
)


class DataCache:
    """The cache entries of one corpus under ``cache_dir``."""

    def __init__(self, cache_dir: Path, corpus: DatasetDict) -> None:
        self.cache_dir, self.corpus = cache_dir, corpus
        self.fingerprint = corpus_fingerprint(corpus)

    def _entry(self, kind: str, *settings: str) -> Path:
        parts = "\x1f".join((str(FORMAT), __version__, self.fingerprint, *settings))
        return self.cache_dir / f"{kind}-{hashlib.sha256(parts.encode()).hexdigest()[:16]}"

    def tokenizer(self, kind: str, vocab_size: int) -> tuple[Path, bool]:
        """The cached tokenizer.json trained on the train split (both sides), trained now on a
        miss. Returns its path and whether it was cached already."""
        entry = self._entry("tokenizer", kind, str(vocab_size), pipeline_signature())
        if (entry / TOKENIZER).is_file():
            return entry / TOKENIZER, True
        train = self.corpus["train"]
        tok = train_tokenizer([*train["src"], *train["tgt"]], vocab_size, kind)
        _write_entry(entry, lambda tmp: tok.save(str(tmp / TOKENIZER)))
        return entry / TOKENIZER, False

    def encoded(self, tokenizer_path: Path) -> tuple[dict[str, Split], Path, bool]:
        """Every split encoded by the tokenizer in ``tokenizer_path``, encoded now and cached on
        a miss, as memory-mapped views of the entry's files (``read_split``). Returns the
        splits, the entry and whether it was cached already."""
        entry = self._entry("encoded", hashlib.sha256(tokenizer_path.read_bytes()).hexdigest())
        hit = entry.is_dir()
        if not hit:
            self._encode(tokenizer_path, entry)
        return {name: read_split(entry / f"{name}.arrow") for name in SPLITS}, entry, hit

    def _encode(self, tokenizer_path: Path, entry: Path) -> None:
        """Encode every split with the tokenizer in ``tokenizer_path`` into ``entry``."""
        tok = load_tokenizer(tokenizer_path)
        splits = {
            name: (
                encode(tok, self.corpus[name]["src"]),
                encode(tok, self.corpus[name]["tgt"]),
                list(self.corpus[name]["tgt"]),
            )
            for name in SPLITS
        }

        def write(tmp: Path) -> None:
            for name, columns in splits.items():
                table = pa.Table.from_arrays(
                    [pa.array(c, type=t) for c, t in zip(columns, SCHEMA.types, strict=True)],
                    schema=SCHEMA,
                )
                with pa.ipc.new_file(tmp / f"{name}.arrow", SCHEMA) as writer:
                    writer.write_table(table)

        _write_entry(entry, write)


def read_split(path: Path) -> Split:
    """The split in the Arrow file ``path``, memory-mapped: its columns are views of the file
    (``ArrowColumn``), so the pages are read as rows are, and shared by every process that maps
    the file."""
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        if table.schema != SCHEMA:
            raise pa.ArrowInvalid(f"schema {table.schema} is not {SCHEMA}")
        src, tgt, refs = (ArrowColumn(table.column(name).chunks) for name in SCHEMA.names)
        return Split(src, tgt, refs)
    except (OSError, pa.ArrowInvalid) as e:
        raise TformerError(f"{path} is corrupt ({e}); delete {path.parent} to rebuild it") from None


def _write_entry(entry: Path, write: Callable[[Path], None]) -> None:
    """Fill a temporary folder beside ``entry`` with ``write(tmp)``, then rename it to ``entry``."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as e:
        raise TformerError(
            f"cannot write the data cache {entry.parent}: {e.strerror or e}"
        ) from None
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; give the usual permissions
        os.replace(tmp, entry)
    except OSError as e:
        if not entry.is_dir():  # else a concurrent run wrote the same entry first: use theirs
            raise TformerError(f"cannot write {entry}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
