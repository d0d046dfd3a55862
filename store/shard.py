"""A shard file of the images array: its index (the (offset, nbytes) table and crc32c at its
end), the checked reading of its chunks, and the sha256 digests the attributes record of it."""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from typing_extensions import Buffer

import crc32c as _crc32c
import numpy as np

from tilefeed.store.codec import TileCodec
from tilefeed.store.errors import CorruptChunkError, TileDecodeError
from tilefeed.store.format import (
    CRC_NBYTES,
    EMPTY_CHUNK,
    IMAGES,
    Codec,
    crc_bytes,
    index_nbytes,
    inside,
    shard_path,
)

if TYPE_CHECKING:
    from tilefeed.store.attrs import StoreAttrs

_CRC: Final = struct.Struct("<I")
GATHERED_CHUNK_BYTES: Final = 4096  # chunks gathered before decoding: at most this, on average
_ENTRY: Final = struct.Struct("<QQ")  # a shard index entry: offset, nbytes


class ShardIndex:
    """The (offset, nbytes) table at the end of a shard, with named operations (as zarr's
    ``_ShardIndex``): an entry of all ones marks a chunk that is not written."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table  # (S, 2) uint64

    @classmethod
    def packed(cls, tiles_per_shard: int, sizes: list[int]) -> ShardIndex:
        """The first ``len(sizes)`` chunks back to back from offset 0; the rest not written."""
        table = np.full((tiles_per_shard, 2), EMPTY_CHUNK, dtype=np.uint64)
        n = len(sizes)
        table[:n, 1] = sizes
        table[:n, 0] = np.cumsum(sizes, dtype=np.uint64) - table[:n, 1]
        return cls(table)

    @classmethod
    def decode(cls, buf: bytes | memoryview, tiles_per_shard: int, shard_name: str) -> ShardIndex:
        """Shard index bytes -> the table, after checking the crc32c."""
        expected = index_nbytes(tiles_per_shard)
        if len(buf) != expected:
            raise CorruptChunkError(shard_name, None, f"index is {len(buf)} bytes, expected {expected}")
        raw = memoryview(buf)[:-CRC_NBYTES]
        if crc_bytes(raw) != bytes(buf[-CRC_NBYTES:]):
            raise CorruptChunkError(shard_name, None, "index crc32c mismatch")
        return cls(np.frombuffer(raw, dtype="<u8").reshape(tiles_per_shard, 2).copy())

    def encode(self) -> bytes:
        raw = np.ascontiguousarray(self.table, dtype="<u8").tobytes()
        return raw + crc_bytes(raw)

    def is_empty(self, local: int) -> bool:
        return bool((self.table[local] == EMPTY_CHUNK).all())

    def written(self) -> int:
        """How many chunks the index lists as written."""
        return int(np.count_nonzero(~(self.table == EMPTY_CHUNK).all(axis=1)))


class ShardFile:
    """One shard, memory-mapped, its index checked once; chunks come out as crc-checked views."""

    # a store of a thousand shards keeps a thousand of these: slots keep each one compact
    __slots__ = ("path", "first", "_map", "_view", "_tail", "_tiles", "_data_end")

    def __init__(self, root: Path, shard: int, tiles_per_shard: int, array: str = IMAGES) -> None:
        self.path = shard_path(root, shard, array)
        self.first = shard * tiles_per_shard
        if not inside(root, self.path):
            raise CorruptChunkError(str(self.path), None, "lies outside the store (a link)")
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise CorruptChunkError(str(self.path), None, f"cannot map shard: {e}") from None
        self._view = memoryview(self._map)
        self._tail = index_nbytes(tiles_per_shard)
        self._tiles = tiles_per_shard
        if len(self._view) < self._tail:
            raise CorruptChunkError(str(self.path), None, "file is shorter than its index")
        self.index  # noqa: B018 - its crc32c checked once, here
        self._data_end = len(self._view) - self._tail
        # Entries are read from the map as tiles are: the page cache holds one copy for every
        # process, where a parsed copy per shard would grow each process with the store.

    @property
    def index(self) -> ShardIndex:
        return ShardIndex.decode(self._view[-self._tail:], self._tiles, str(self.path))

    def __len__(self) -> int:
        return self.index.written()

    def nbytes(self, local: int) -> int:
        """Bytes the ``local``-th tile's chunk occupies in the shard, as its index says."""
        return int(_ENTRY.unpack_from(self._map, self._data_end + _ENTRY.size * local)[1])

    def chunk(self, local: int) -> memoryview:
        """The payload (crc32c stripped) of this shard's ``local``-th tile, checked."""
        payload, end = self._payload(local)
        self._verify(local, payload, _CRC.unpack_from(self._map, end)[0])
        return payload

    def _payload(self, local: int) -> tuple[memoryview, int]:
        """The ``local``-th tile's payload, unchecked, and where its crc32c begins."""
        offset, nbytes = _ENTRY.unpack_from(self._map, self._data_end + _ENTRY.size * local)
        # one bounds check serves all: a chunk not written has offset and size 2**64 - 1
        if nbytes < CRC_NBYTES or offset + nbytes > self._data_end:
            raise self._invalid_entry(local, offset, nbytes)
        end = offset + nbytes - CRC_NBYTES
        return self._view[offset:end], end

    def _invalid_entry(self, local: int, offset: int, nbytes: int) -> CorruptChunkError:
        return CorruptChunkError(str(self.path), self.first + local,
                                 f"index entry ({offset}, {nbytes}) is invalid")

    def read_into(self, local: int, codec: TileCodec, out: np.ndarray, fast_idct: bool = False) -> None:
        """This shard's ``local``-th tile decoded into ``out``, checked."""
        payload, end = self._payload(local)
        self._decode_into(local, payload, _CRC.unpack_from(self._map, end)[0], codec, out, fast_idct)

    def _decode_into(self, local: int, payload: memoryview, crc: int, codec: TileCodec, out: np.ndarray,
                     fast_idct: bool) -> None:
        """``payload`` (its crc32c ``crc``) decoded into ``out``. An uncompressed tile is copied
        first and checked in ``out``: the check then reads bytes the copy left in the cache,
        where checking the payload first would read them from memory twice."""
        if codec.name is Codec.NONE:
            if len(payload) != out.nbytes:
                raise CorruptChunkError(str(self.path), self.first + local,
                                        f"chunk is {len(payload)} bytes, the tile {out.nbytes}")
            np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(out.shape))
            self._verify(local, out.data, crc)
            return
        self._verify(local, payload, crc)
        try:
            codec.decode(payload, out, fast_idct)
        except TileDecodeError as e:
            raise CorruptChunkError(str(self.path), self.first + local, e.detail) from None

    def _verify(self, local: int, payload: Buffer, crc: int) -> None:
        if _crc32c.crc32c(payload) != crc:
            raise CorruptChunkError(str(self.path), self.first + local, "chunk crc32c mismatch")

    def close(self) -> None:
        try:
            self._view.release()
            self._map.close()
        except BufferError:
            pass  # a caller still holds a chunk view; the map closes when the last one goes


# A batch's tiles lie at random places in a large store. Read one after another, each read waits
# for the misses (in the caches and in address translation) of the one before; one copy of all
# of a batch's index entries, then of all its chunks, lets the processor overlap those misses.

def _spans(files: Sequence[ShardFile], local: Sequence[int]) -> tuple[list[int], list[int]]:
    """Each tile's (offset, nbytes) from its shard's index, checked: ``local[k]`` of ``files[k]``."""
    size = _ENTRY.size
    entries = b"".join([f._view[(at := f._data_end + size * i):at + size]
                        for f, i in zip(files, local, strict=True)])
    table = np.frombuffer(entries, dtype="<u8").reshape(-1, 2)
    offsets, sizes = table[:, 0], table[:, 1]
    ends = np.array([f._data_end for f in files], dtype=np.uint64)
    bad = (sizes < CRC_NBYTES) | (offsets > ends) | (sizes > ends - offsets)  # as _payload
    if bad.any():
        k = int(bad.argmax())
        raise files[k]._invalid_entry(local[k], int(offsets[k]), int(sizes[k]))
    return offsets.tolist(), sizes.tolist()


def chunks(files: Sequence[ShardFile], local: Sequence[int]) -> list[memoryview]:
    """The payloads of ``local[k]`` of ``files[k]``, checked as ``ShardFile.chunk`` checks one
    (views into the maps)."""
    found = []
    for f, i, offset, nbytes in zip(files, local, *_spans(files, local), strict=True):
        end = offset + nbytes - CRC_NBYTES
        payload = f._view[offset:end]
        f._verify(i, payload, _CRC.unpack_from(f._map, end)[0])
        found.append(payload)
    return found


def read_tiles_into(files: Sequence[ShardFile], local: Sequence[int], codec: TileCodec, out: np.ndarray,
                    rows: Iterable[int], fast_idct: bool = False) -> None:
    """``local[k]`` of ``files[k]`` decoded into ``out[rows[k]]``, each checked as
    ``ShardFile.read_into`` checks one. Uncompressed tiles are copied once, straight into place;
    small compressed ones are first gathered into one buffer (larger ones are read where they
    lie: the processor streams through each, and a copy would cost more than it saves)."""
    if not files:
        return
    offsets, sizes = _spans(files, local)
    if codec.name is Codec.NONE or sum(sizes) > GATHERED_CHUNK_BYTES * len(sizes):
        places = [(f._view, offset) for f, offset in zip(files, offsets, strict=True)]
    else:
        gathered = memoryview(b"".join([f._view[o:o + n]
                                        for f, o, n in zip(files, offsets, sizes, strict=True)]))
        places = [(gathered, at) for at in itertools.accumulate(sizes[:-1], initial=0)]
    for (view, at), f, i, k, nbytes in zip(places, files, local, rows, sizes, strict=True):
        end = at + nbytes - CRC_NBYTES
        f._decode_into(i, view[at:end], _CRC.unpack_from(view, end)[0], codec, out[k], fast_idct)


def sha256_fd(fd: int) -> str:
    """sha256 of the whole file open as ``fd``, read from its start (the file position is not
    used, so other readers of the descriptor are not disturbed)."""
    h, offset = hashlib.sha256(), 0
    while block := os.pread(fd, 1 << 20, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


def shard_digest_problem(path: Path, store: StoreAttrs, shard: int, array: str = IMAGES) -> str:
    """'' when the shard file ``path`` has the sha256 the store records (or records none): what
    no file of the right size with its chunks moved about, each crc32c intact, passes."""
    recorded = store.shard_sha256 if array == IMAGES else store.masks.shard_sha256 if store.masks else None
    if recorded is None:
        return ""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        actual = sha256_fd(fd)
    finally:
        os.close(fd)
    if actual != recorded[shard]:
        return "differs from what was written (shard sha256 mismatch)"
    return ""


def sha256_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()

