"""Metric records kept as columns until someone reads them.

The native reader (`_fastscan.dict_records`) turns a run of console dict lines into columns
(bytes): building a Python dict per step costs more than parsing the line did, and most of a
long log's records are only ever counted, charted or stored. `RecordBatch` holds one such run;
`rows()` builds the dicts, identical to what MetricsParser's Python path makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from collections.abc import Iterator

from tunedeck.core.ingest.native import fastscan


class RecordBatch:
    """Records of consecutive lines, in strictly rising step order."""

    __slots__ = ("cols", "rank", "steps", "first", "last")

    def __init__(
        self,
        steps: bytes,
        values: bytes,
        present: bytes,
        ints: bytes,
        order: bytes,
        rank: int | None,
    ) -> None:
        self.cols = (steps, values, present, ints, order)
        self.rank = rank
        self.steps = memoryview(steps).cast("q")
        self.first, self.last = self.steps[0], self.steps[-1]

    def __len__(self) -> int:
        return len(self.steps)

    def rows(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        return fastscan.rows(*self.cols, self.rank, start, len(self) if stop is None else stop)


class BatchList(Sequence):
    """A poll's new records when they all came from batches: a sequence of dicts built on
    access (len() and the step range cost nothing)."""

    def __init__(self, batches: list[RecordBatch]) -> None:
        self.batches = batches
        self._len = sum(len(b) for b in batches)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for b in self.batches:
            yield from b.rows()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        for b in self.batches:
            if i < len(b):
                return b.rows(i, i + 1)[0]
            i -= len(b)
        raise IndexError(i)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))
