"""Tiles by ranged requests, nothing kept on disk: for random order over a store larger than
the cache folder may hold. Each shard's index is read once; a batch's tiles of one shard come in
one request, every tile checked against its crc32c and fetched again when damaged."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.shard import ShardIndex
from tilefeed.store.errors import CorruptChunkError
from tilefeed.store.object_storage import ATTEMPTS, DOWNLOAD_THREADS, ObjectStorage


class RangedTiles:
    """Tiles by ranged requests: each shard's index fetched once, a batch's tiles of one shard in
    one request (obstore coalesces nearby ranges), shards of a batch fetched concurrently."""

    def __init__(self, storage: ObjectStorage, shard_bytes: list[int], tiles_per_shard: int,
                 array: str = fmt.IMAGES) -> None:
        self.storage, self.shard_bytes, self.tiles_per_shard = storage, shard_bytes, tiles_per_shard
        self.array = array  # images, or a store's masks
        self._index: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def _table(self, shard: int) -> np.ndarray:
        """The shard's index, by one ranged request on first use (fetched again if damaged)."""
        table = self._index.get(shard)
        if table is not None:
            return table
        key, size = fmt.shard_relpath(shard, self.array), self.shard_bytes[shard]
        tail = fmt.index_nbytes(self.tiles_per_shard)
        for attempt in range(ATTEMPTS):
            data = self.storage.read_ranges(key, [size - tail], [size])[0]
            try:
                table = ShardIndex.decode(data, self.tiles_per_shard, self.storage.where(key)).table
            except CorruptChunkError:
                if attempt == ATTEMPTS - 1:
                    raise
                continue
            self._index[shard] = table
            return table
        raise AssertionError("unreachable")

    def payloads(self, indices: Sequence[int]) -> list[memoryview]:
        per = self.tiles_per_shard
        groups: dict[int, list[int]] = {}
        for k, index in enumerate(indices):
            groups.setdefault(index // per, []).append(k)
        out: list[memoryview] = [memoryview(b"")] * len(indices)
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-range")
        futures = [self._pool.submit(self._shard_tiles, shard, [indices[k] for k in ks])
                   for shard, ks in groups.items()]
        for (_, ks), fut in zip(groups.items(), futures, strict=True):
            for k, payload in zip(ks, fut.result(), strict=True):
                out[k] = payload
        return out

    def _shard_tiles(self, shard: int, indices: list[int]) -> list[memoryview]:
        table, key = self._table(shard), fmt.shard_relpath(shard, self.array)
        local = [i - shard * self.tiles_per_shard for i in indices]
        starts = [int(table[j, 0]) for j in local]
        ends = [s + int(table[j, 1]) for s, j in zip(starts, local, strict=True)]
        size = self.shard_bytes[shard]
        if any(e - s < fmt.CRC_NBYTES or e > size for s, e in zip(starts, ends, strict=True)):
            raise CorruptChunkError(self.storage.where(key), indices[0], "index entry is invalid")
        for attempt in range(ATTEMPTS):
            chunks = self.storage.read_ranges(key, starts, ends)
            bad = [i for i, c in zip(indices, chunks, strict=True)
                   if fmt.crc_bytes(memoryview(c)[: -fmt.CRC_NBYTES]) != c[-fmt.CRC_NBYTES:]]
            if not bad:
                return [memoryview(c)[: -fmt.CRC_NBYTES] for c in chunks]
            if attempt == ATTEMPTS - 1:
                raise CorruptChunkError(self.storage.where(key), bad[0],
                                        f"chunk crc32c mismatch (after {ATTEMPTS} downloads)")
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
