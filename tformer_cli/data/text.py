"""A split's text on disk: an Arrow stream file of string columns ``src``/``tgt`` (as
``datasets.Dataset.from_file`` maps it), written and read (not mapped) ``ROWS`` pairs at a time,
so that no side of a corpus's set-up holds the corpus in memory."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset
from datasets.table import MemoryMappedTable

from tformer_cli.files import write_error

ROWS = 10_000  # pairs a record batch holds: what is read, validated and written at a time
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


def write_pairs(pairs: Iterable[tuple[str, str]], path: Path) -> int:
    """Write ``pairs`` to the Arrow file ``path``, ``ROWS`` at a time; how many there were."""
    n, pairs = 0, iter(pairs)
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            while chunk := list(islice(pairs, ROWS)):
                src, tgt = zip(*chunk, strict=True)
                writer.write_batch(pa.record_batch([list(src), list(tgt)], schema=SCHEMA))
                n += len(chunk)
    except OSError as e:  # a full disk: name the file (Arrow's message does not)
        raise write_error(path, e) from None
    return n


def file_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of the Arrow file ``path``, read (not mapped) one at a time."""
    with pa.OSFile(str(path)) as source:
        yield from pa.ipc.open_stream(source)


def route(path: Path, labels: np.ndarray, outputs: Sequence[Path]) -> None:
    """Copy each pair of the Arrow file ``path`` to ``outputs[labels[i]]``, in order."""
    try:
        with ExitStack() as files:
            sinks = [files.enter_context(pa.OSFile(str(out), "wb")) for out in outputs]
            writers = [files.enter_context(pa.ipc.new_stream(f, SCHEMA)) for f in sinks]
            start = 0
            for batch in file_batches(path):
                label = labels[start : start + batch.num_rows]
                for k, writer in enumerate(writers):
                    if (mask := label == k).any():
                        writer.write_batch(batch.filter(pa.array(mask)))
                start += batch.num_rows
    except OSError as e:
        raise write_error(path.parent, e) from None


def read_batches(ds: Dataset, column: str) -> Iterator[pa.Array]:
    """The ``column`` of ``ds``, about ``ROWS`` rows at a time: from its Arrow file where ``ds``
    is that file as written, else through ``datasets``."""
    table, files = ds.data, ds.cache_files
    as_written = (
        isinstance(table, MemoryMappedTable)
        and ds._indices is None
        and all(op == "replace_schema_metadata" for op, *_ in table.replays)  # its features
        and len(files) == 1
    )
    if as_written:
        for batch in file_batches(Path(files[0]["filename"])):
            yield batch.column(column)
        return
    for start in range(0, len(ds), ROWS):
        yield pa.array(ds[start : start + ROWS][column], pa.string())
