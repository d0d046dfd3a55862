"""The scanned sources on disk, in store order: what lets the writer's memory stay the same
whatever the number of sources.

A list is a folder of three files. ``paths``: every source path as UTF-8, each ended by a NUL
(no path holds one; a newline it may). ``labels``: one little-endian int64 per source.
``index``: little-endian int64 byte offsets into ``paths`` of sources 0, stride, 2 * stride,
..., then the file's size, so that a run of strides (a writer's part) is read as one byte
range, without reading or indexing the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

PATHS: Final = "paths"
LABELS: Final = "labels"
INDEX: Final = "index"
WRITE_BUFFER: Final = 1 << 18
READ_SIZE: Final = 4 << 20
_OFFSET: Final = np.dtype("<i8")


@dataclass(frozen=True)
class SourceList:
    """A finished list: ``count`` sources in ``folder``, indexed every ``stride`` sources."""

    folder: Path
    count: int
    stride: int

    def __len__(self) -> int:
        return self.count

    def read(self, first: int, count: int) -> bytes:
        """The NUL-ended paths of sources [first, first + count), as stored: ``first`` is a
        multiple of the stride, and so is ``count`` unless the range ends the list."""
        stop = min(first + count, self.count)
        index = self.folder / INDEX
        start, end = _pread_offset(index, first // self.stride), _pread_offset(index, -(-stop // self.stride))
        return _pread(self.folder / PATHS, start, end - start)

    def labels(self, first: int, count: int) -> np.ndarray:
        """The labels of sources [first, first + count)."""
        return np.fromfile(self.folder / LABELS, dtype="<i8", count=count, offset=first * 8)

    def blocks(self, size: int) -> Iterator[tuple[list[bytes], np.ndarray]]:
        """Every source in order, ``size`` at a time: (UTF-8 paths, int64 labels)."""
        with open(self.folder / PATHS, "rb") as paths, open(self.folder / LABELS, "rb") as labels:
            pending: list[bytes] = []
            tail = b""
            while data := paths.read(READ_SIZE):
                pieces = (tail + data).split(b"\0")
                tail = pieces.pop()  # a path cut by the read's end, completed by the next read
                pending += pieces
                while len(pending) >= size:
                    names, pending = pending[:size], pending[size:]
                    yield names, np.frombuffer(labels.read(8 * size), dtype="<i8")
            if pending:
                yield pending, np.frombuffer(labels.read(8 * len(pending)), dtype="<i8")

    def paths(self) -> Iterator[bytes]:
        """Every path, in order (UTF-8)."""
        for names, _ in self.blocks(1 << 16):
            yield from names


def _pread(path: Path, offset: int, count: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, count, offset)
    finally:
        os.close(fd)


def _pread_offset(path: Path, k: int) -> int:
    return int.from_bytes(_pread(path, 8 * k, 8), "little")


def split_paths(data: bytes) -> list[bytes]:
    """NUL-ended paths, as one read from ``paths`` holds them."""
    return data.split(b"\0")[:-1]


def decode_paths(data: bytes) -> list[str]:
    """NUL-ended paths as text; ``surrogateescape`` gives back a path that was not UTF-8 as the
    file system's own name, as Python names it."""
    return data.decode("utf-8", "surrogateescape").split("\0")[:-1]


class SourceListWriter:
    """Appends sources in store order; ``close`` gives the finished ``SourceList``."""

    def __init__(self, folder: Path, stride: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.stride = folder, stride
        self._paths = open(folder / PATHS, "wb", buffering=WRITE_BUFFER)
        self._labels = open(folder / LABELS, "wb", buffering=WRITE_BUFFER)
        self._index = open(folder / INDEX, "wb", buffering=WRITE_BUFFER)
        self.count = 0
        self.nbytes = 0

    def add(self, paths: Sequence[bytes], labels: int | np.ndarray) -> None:
        """Sources with these UTF-8 paths (no NUL in any) and labels (one for all, or one each)."""
        if paths:
            self.add_joined(b"\0".join(paths) + b"\0", labels)

    def add_joined(self, data: bytes, labels: int | np.ndarray) -> None:
        """Sources given as their NUL-ended UTF-8 paths, back to back (as ``paths`` holds them)."""
        if not data:
            return
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0) + (1 + self.nbytes)
        n = len(ends)
        # offsets of the sources here that begin a stride: the end of the one before
        first = -self.count % self.stride
        starts = np.concatenate(([self.nbytes], ends[:-1]))[first :: self.stride]
        self._index.write(starts.astype(_OFFSET).tobytes())
        self._paths.write(data)
        label_values = np.full(n, labels, dtype="<i8") if isinstance(labels, int) else labels.astype("<i8")
        self._labels.write(label_values.tobytes())
        self.count += n
        self.nbytes = int(ends[-1])

    def close(self) -> SourceList:
        self._index.write(np.array([self.nbytes], dtype=_OFFSET).tobytes())
        for f in (self._paths, self._labels, self._index):
            f.close()
        return SourceList(self.folder, self.count, self.stride)

