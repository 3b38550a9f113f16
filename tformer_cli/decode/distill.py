"""Sequence-level knowledge distillation (Kim & Rush 2016): a teacher's translations of a
corpus's training split, written as a corpus that ``tformer train --data DIR`` reads (valid and
test kept as the originals), and ``distill.json``, the provenance, written last.

The training split is translated ``chunk_size`` pairs at a time, each chunk written whole into
``.distill-chunks/`` beside the settings that made it: a run that stops resumes after the last
chunk written, and ends with the same corpus as one that never stopped."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict

from tformer_cli import __version__
from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig, TrainConfig
from tformer_cli.data.corpus import PARALLEL_FILES, absolute_data, corpus_within
from tformer_cli.data.text import ROWS
from tformer_cli.decode.streams import one_line, translate_chunks
from tformer_cli.decode.translate import Batching, SourcesEngine
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write, atomic_write_text, file_sha256

RECORD = "distill.json"  # the provenance; written last, it marks the corpus finished
CHUNKS = ".distill-chunks"  # the chunks of a distillation under way, and its settings
UNDER_WAY = "settings.json"  # the settings of the chunks under way
SPLIT_FILES = tuple(f"{name}.jsonl" for name in ("train", "valid", "test"))
OURS = {RECORD, CHUNKS, *SPLIT_FILES}


@dataclass(frozen=True)
class Teacher:
    """A loaded teacher and how it translates (``engine`` None: tformer's search)."""

    runs: list[LoadedRun]
    cfg: DecodeConfig
    batching: Batching
    engine_name: str
    precision: str
    engine: SourcesEngine | None = None

    def provenance(self) -> dict[str, Any]:
        """What made the translations, for the record."""
        run = self.runs[0]
        return {
            "teacher": str(run.run_dir.resolve()),
            "teacher_sha256": file_sha256(run.run_dir / "model.pt"),
            "beam": self.cfg.beam, "alpha": self.cfg.alpha, "engine": self.engine_name,
            "precision": self.precision, "max_tokens": self.batching.max_tokens,
            "tformer": __version__,
        }  # fmt: skip


def check_output(out: Path, force: bool) -> None:
    """A one-line error, before anything loads, for an output that is a file, a folder holding
    anything else, or a finished distillation without ``force``."""
    if out.exists() and not out.is_dir():
        raise TformerError(f"{out} is a file: -o takes a folder")
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OURS and not tmp_file(p))
    if foreign:
        raise TformerError(f"{out} holds other files ({foreign[0]}, ...): give a new folder")
    if (out / RECORD).exists() and not force:
        raise TformerError(f"{out} holds a finished distillation: --force makes it again")


def tmp_file(path: Path) -> bool:
    """A temporary file that an interrupted ``atomic_write`` left."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def pairs_line(pairs: Iterator[tuple[str, str]]) -> Iterator[str]:
    """One JSON line ``{"src": ..., "tgt": ...}`` per pair (any text, tabs and newlines too)."""
    for src, tgt in pairs:
        yield json.dumps({"src": src, "tgt": tgt}, ensure_ascii=False) + "\n"


def split_pairs(split: Dataset, end: int | None = None) -> Iterator[tuple[str, str]]:
    """The pairs of ``split`` (its first ``end``), read ``ROWS`` at a time."""
    end = len(split) if end is None else end
    for start in range(0, end, ROWS):
        rows = split[start : min(start + ROWS, end)]
        yield from zip(rows["src"], rows["tgt"], strict=True)


def write_lines(path: Path, lines: Iterator[str]) -> None:
    """``lines`` into ``path``, whole or not at all."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines)

    atomic_write(path, write)


def resume_chunks(out: Path, settings: Mapping[str, Any], force: bool) -> int:
    """The number of chunks already written: the chunk folder started afresh (``force``, or
    nothing there) or resumed when its settings are these."""
    chunks = out / CHUNKS
    if force:
        (out / RECORD).unlink(missing_ok=True)
        shutil.rmtree(chunks, ignore_errors=True)
    kept = chunks / UNDER_WAY
    if kept.is_file():
        if json.loads(kept.read_text(encoding="utf-8")) != dict(settings):
            raise TformerError(
                f"{out} holds a distillation under way with other settings: --force starts over"
            )
    else:
        atomic_write_text(kept, json.dumps(settings, indent=2) + "\n")
    done = 0
    while (chunks / chunk_name(done)).is_file():
        done += 1
    return done


def chunk_name(k: int) -> str:
    """The file of the ``k``-th chunk."""
    return f"{k:06d}.jsonl"


def distill_corpus(
    teacher: Teacher, corpus: DatasetDict, out: Path, *, data: str, chunk_size: int = 2000,
    limit: int | None = None, mix: bool = False, force: bool = False,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Translate the training split of ``corpus`` (its first ``limit`` pairs) with ``teacher``
    into the corpus folder ``out`` (``mix``: the original pairs too), resuming a stopped run's
    chunks; ``data``: the corpus's name for the record, which is returned."""
    check_output(out, force)
    train = corpus["train"]
    n = len(train) if limit is None else min(limit, len(train))
    settings = {**teacher.provenance(), "data": data, "pairs": n, "chunk_size": chunk_size}
    done = resume_chunks(out, settings, force)
    if on_batch is not None and done:
        on_batch(min(done * chunk_size, n))
    sources = (src for src, _ in split_pairs(train.select(range(done * chunk_size, n))))
    chunks = translate_chunks(
        teacher.runs, sources, teacher.cfg, teacher.batching, chunk_size=chunk_size,
        on_batch=on_batch, engine=teacher.engine,
    )  # fmt: skip
    for k, results in enumerate(chunks, start=done):
        pairs = ((r.source, one_line(r.translations[0])) for r in results)
        write_lines(out / CHUNKS / chunk_name(k), pairs_line(pairs))
    return finish(out, corpus, {**settings, "mix": mix}, n)


def finish(out: Path, corpus: DatasetDict, record: dict[str, Any], n: int) -> dict[str, Any]:
    """The corpus made whole from the chunks (an empty translation left out and counted), then
    the record, and the chunks removed."""
    for name in ("valid", "test"):
        write_lines(out / f"{name}.jsonl", pairs_line(split_pairs(corpus[name])))
    chunks = sorted((out / CHUNKS).glob("*.jsonl"))
    counts = {"distilled": 0, "empty": 0}

    def train_lines() -> Iterator[str]:
        for path in chunks:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    kept = bool(json.loads(line)["tgt"].strip())
                    counts["distilled" if kept else "empty"] += 1
                    if kept:
                        yield line
        if record["mix"]:
            yield from pairs_line(split_pairs(corpus["train"], n))

    write_lines(out / "train.jsonl", train_lines())
    record = {**record, **counts, "original": n if record["mix"] else 0}
    atomic_write_text(out / RECORD, json.dumps(record, indent=2) + "\n")
    shutil.rmtree(out / CHUNKS, ignore_errors=True)
    return record


@contextmanager
def training_corpus(
    config: TrainConfig, data: str | None, src: str | None, tgt: str | None
) -> Iterator[tuple[str, DatasetDict]]:
    """The corpus to distill and its name, for a ``with`` block: ``data`` (default: the
    teacher's own) in the teacher's languages unless ``src``/``tgt`` say otherwise, its missing
    splits carved with the teacher's seed."""
    own = data is None
    files = {name: getattr(config, name) for name in PARALLEL_FILES} if own else {}
    spec = config.data if data is None else data
    langs = {"src_lang": src or config.src_lang, "tgt_lang": tgt or config.tgt_lang}
    with corpus_within(spec, **langs, seed=config.seed, **files) as corpus:
        named = [str(f) for f in files.values() if f is not None]
        yield ", ".join(named) if named else absolute_data(str(spec)), corpus
