"""An encoded split of parallel data, and the one rule for which pairs a model can read. A split
from the data cache holds no pair in memory: its columns are views of the memory-mapped Arrow
file (``ArrowColumn``), read a row at a time (``MappedFile``), shared by every process."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa

T = TypeVar("T")


class MappedFile:
    """An Arrow file both mapped and open: its offsets read through the map, its token ids by
    ``os.pread``, which leaves no page of the file in the process's memory."""

    def __init__(self, path: Path, source: pa.MemoryMappedFile) -> None:
        source.seek(0)
        self.base = source.read_buffer(1).address  # where the map starts
        source.seek(0)
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)

    def int32s(self, values: pa.Array, start: int, stop: int) -> list[int]:
        """``values[start:stop]`` of an int32 array of the mapped file, read from the file."""
        at = values.buffers()[1].address - self.base + 4 * (values.offset + start)
        data = os.pread(self.fd, 4 * (stop - start), at)
        return np.frombuffer(data, dtype=np.int32).tolist()  # type: ignore[no-any-return]


class ArrowColumn(Sequence[T]):
    """Rows of a column of a memory-mapped ``file``'s Arrow arrays, through an optional row
    index ``rows``: ``list[int]`` (token ids) or ``str`` (references). Slices are views."""

    def __init__(
        self, chunks: Sequence[pa.Array], file: MappedFile, rows: np.ndarray | None = None
    ) -> None:
        self.chunks = list(chunks)
        sizes = [len(c) for c in self.chunks]
        self.starts = np.cumsum([0, *sizes])  # first row of each chunk, and the total
        self.rows = rows
        self.file = file
        self.offsets: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.rows is None else len(self.rows)

    def _read(self, row: int) -> T:
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        chunk, i = self.chunks[k], row - int(self.starts[k])
        if not pa.types.is_list(chunk.type):
            return chunk[i].as_py()
        offsets = self._offsets(k)  # token ids: a slice of the flat values
        return self.file.int32s(chunk.values, int(offsets[i]), int(offsets[i + 1]))  # type: ignore[return-value]

    def _offsets(self, k: int) -> np.ndarray:
        """Chunk k's offsets, a numpy view of the file (no copy)."""
        if k not in self.offsets:
            self.offsets[k] = self.chunks[k].offsets.to_numpy()
        return self.offsets[k]

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> ArrowColumn[T]: ...
    def __getitem__(self, i: int | slice) -> T | ArrowColumn[T]:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i = i % n
        return self._read(int(i if self.rows is None else self.rows[i]))

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def take(self, rows: Sequence[int] | np.ndarray) -> ArrowColumn[T]:
        """A view of the rows at ``rows``, in that order."""
        picked = np.asarray(rows, dtype=np.int64)
        return ArrowColumn(
            self.chunks, self.file, picked if self.rows is None else self.rows[picked]
        )

    def lengths(self) -> np.ndarray:
        """(n,) int32: each row's list length, from the offsets alone (no row is read)."""
        each = [np.diff(self._offsets(k)) for k in range(len(self.chunks))]
        whole = np.concatenate(each or [np.zeros(0, np.int32)]).astype(np.int32)
        return whole if self.rows is None else whole[self.rows]


def lengths(column: Sequence[Sequence[Any]]) -> np.ndarray:
    """(n,) int32: the length of each row of ``column`` (an ``ArrowColumn`` or lists)."""
    if isinstance(column, ArrowColumn):
        return column.lengths()
    return np.fromiter(map(len, column), dtype=np.int32, count=len(column))


def _take(column: Sequence[T], keep: Sequence[int] | np.ndarray) -> Sequence[T]:
    if isinstance(column, ArrowColumn):
        return column.take(keep)
    return [column[i] for i in keep]


@dataclass(frozen=True)
class Split:
    """Token ids without specials, and the raw target text (the references for BLEU): lists,
    or ``ArrowColumn`` views of the data cache."""

    src: Sequence[Sequence[int]]
    tgt: Sequence[Sequence[int]]
    refs: Sequence[str]

    def select(self, keep: Sequence[int] | np.ndarray) -> Split:
        """The pairs at indices ``keep``, in that order."""
        return Split(_take(self.src, keep), _take(self.tgt, keep), _take(self.refs, keep))


def fits_positions(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], max_positions: int
) -> list[int]:
    """Indices of the pairs a model of ``max_positions`` positions reads whole (each side at
    most ``max_positions - 1`` tokens: room for ``</s>`` or ``<s>``)."""
    longest = max_positions - 1
    return np.flatnonzero(np.maximum(lengths(src), lengths(tgt)) <= longest).tolist()
