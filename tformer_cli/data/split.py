"""An encoded split of parallel data, as training validates on it and `tformer eval` scores it,
and the one rule for which pairs a model can read.

A split read from the data cache holds no pair in memory: its columns are views of the Arrow
file, memory-mapped (``ArrowColumn``), read a row at a time; N processes that map the same file
share one copy in the page cache. In memory per pair: at most a row index (``take``) and the
lengths that batching plans with (``lengths``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa

T = TypeVar("T")


class ArrowColumn(Sequence[T]):
    """Rows of a column of Arrow arrays (the record batches of a memory-mapped file), through
    an optional row index ``rows``: ``list[int]`` for a list<int32> column (token ids), ``str``
    for a string column (references). Indexing reads the file; slicing and ``take`` make views."""

    def __init__(self, chunks: Sequence[pa.Array], rows: np.ndarray | None = None) -> None:
        self.chunks = list(chunks)
        sizes = [len(c) for c in self.chunks]
        self.starts = np.cumsum([0, *sizes])  # first row of each chunk, and the total
        self.rows = rows
        self.flat: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.rows is None else len(self.rows)

    def _read(self, row: int) -> T:
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        chunk, i = self.chunks[k], row - int(self.starts[k])
        if not pa.types.is_list(chunk.type):
            return chunk[i].as_py()
        offsets, values = self._flat(k)  # token ids: a slice of the flat values
        return values[offsets[i] : offsets[i + 1]].tolist()  # type: ignore[no-any-return]

    def _flat(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk k's offsets and flat values as numpy views of the file (no copy)."""
        if k not in self.flat:
            chunk = self.chunks[k]
            self.flat[k] = (chunk.offsets.to_numpy(), chunk.values.to_numpy())
        return self.flat[k]

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
        return ArrowColumn(self.chunks, picked if self.rows is None else self.rows[picked])

    def lengths(self) -> np.ndarray:
        """(n,) int32: each row's list length, from the offsets alone (no row is read)."""
        each = [np.diff(self._flat(k)[0]) for k in range(len(self.chunks))]
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
    """Indices of the pairs a model of ``max_positions`` positions reads whole: each side at
    most ``max_positions - 1`` tokens, leaving room for ``</s>`` (source) or ``<s>`` (target)."""
    longest = max_positions - 1
    return np.flatnonzero(np.maximum(lengths(src), lengths(tgt)) <= longest).tolist()
