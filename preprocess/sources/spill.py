"""Byte strings sorted in bounded memory: held until a budget is spent, then sorted and written
to a run file; iteration merges the runs. What lets a scan of any size sort its sources (a huge
class folder, a bucket listing) and find a manifest's repeated paths without holding them all.

Records compare as bytes. Callers encode what they sort so that byte order is the order they
want: UTF-8 (with ``surrogatepass``) keeps code point order, so names sort as Python's str
sort does, and a NUL (which no path holds) ends a field before any other byte would.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Final

RUN_BUDGET: Final = 64 << 20  # bytes of records held before a run is written out
RECORD_OVERHEAD: Final = 64  # what Python spends on one bytes object and its list slot
FAN_IN: Final = 64  # runs merged at once: each holds an open file and a read buffer
READ_BUFFER: Final = 1 << 16
_LENGTH: Final = struct.Struct("<I")


class SortedRuns:
    """Add records, then iterate them once in sorted order. Nothing touches the disk until the
    records held pass ``budget`` bytes; run files go in ``folder`` and are removed when read."""

    def __init__(self, folder: Path, budget: int | None = None) -> None:
        self.folder, self.budget = folder, RUN_BUDGET if budget is None else budget
        self.held: list[bytes] = []
        self.size = 0
        self.runs: list[Path] = []
        self.count = 0
        self.written = 0  # run files made, for their names

    def add(self, record: bytes) -> None:
        self.held.append(record)
        self.size += len(record) + RECORD_OVERHEAD
        self.count += 1
        if self.size > self.budget:
            self._spill()

    def extend(self, records: Iterable[bytes]) -> None:
        for record in records:
            self.add(record)

    def __iter__(self) -> Iterator[bytes]:
        self.held.sort()
        if not self.runs:  # the common case: all in memory, no file written
            held, self.held, self.size = self.held, [], 0
            return iter(held)
        self._spill()
        while len(self.runs) > FAN_IN:  # merge in passes, so that no pass opens too many files
            groups = [self.runs[k : k + FAN_IN] for k in range(0, len(self.runs), FAN_IN)]
            self.runs = [self._write_run(_merged(group)) for group in groups]
        return _merged(self.runs)

    def _spill(self) -> None:
        if self.held:
            self.held.sort()
            self.runs.append(self._write_run(iter(self.held)))
            self.held, self.size = [], 0

    def _write_run(self, records: Iterator[bytes]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"run-{id(self):x}-{self.written}"
        self.written += 1
        with open(path, "wb", buffering=READ_BUFFER) as f:
            for record in records:
                f.write(_LENGTH.pack(len(record)))
                f.write(record)
        return path


def _merged(runs: list[Path]) -> Iterator[bytes]:
    """The records of sorted run files, merged; each file removed once read to its end."""
    return heapq.merge(*(_read_run(path) for path in runs))


def _read_run(path: Path) -> Iterator[bytes]:
    with open(path, "rb", buffering=READ_BUFFER) as f:
        yield from _records(f)
    path.unlink(missing_ok=True)


def _records(f: BinaryIO) -> Iterator[bytes]:
    while header := f.read(_LENGTH.size):
        (n,) = _LENGTH.unpack(header)
        yield f.read(n)
