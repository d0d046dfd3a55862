"""Whole shards of a bucket store in its mirror folder, fetched ahead of need in the order an
epoch reads them, on a few download threads, under a byte limit with least-recently-used
eviction. Several processes (ranks, DataLoader workers) may share one cache folder: a shard is
downloaded under a per-shard file lock to a temporary name and renamed, so it is fetched once and
seen whole or not at all.

Every download is checked before use: its size, its index crc32c, and its sha256 against the one
the store's attributes record (read from the bucket on every open, never from the cache). A short
or damaged download is fetched again, never yielded; one whose sha256 differs twice is refused. A
shard another process put in the cache folder is used only once its sha256 matches, checked once
per process and file (by device, inode, size and modification time: recency is kept in the
access time, so reading never changes the key). The cache thus holds only what the bucket holds:
a file of the right size with its chunks swapped, each crc32c intact, is downloaded again, not
read.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.shard import ShardIndex, sha256_fd
from tilefeed.store.atomic import create_new, temporary_name
from tilefeed.store.cache_dir import (cached_shards, exclusive_lock, open_dir, open_file_at, unlink_at,
                                     unlink_entry)
from tilefeed.store.errors import CacheError, ConfigError, CorruptChunkError
from tilefeed.store.object_storage import ATTEMPTS, DOWNLOAD_THREADS, ObjectStorage

DIGEST_DOWNLOADS = 2  # a shard whose sha256 differs this many times is not the store's: refused
# Cached shard files whose sha256 this process has checked (or downloaded itself), by (device,
# inode, size, modification time, the digest they matched): each is hashed once, not every epoch.
_CHECKED: set[tuple[int, int, int, int, str]] = set()
_CHECKED_LOCK = threading.Lock()


class ShardCache:
    """Whole shards in the mirror folder, at most ``limit`` bytes of shards in the cache folder."""

    def __init__(self, storage: ObjectStorage, mirror: Path, cache_dir: Path, shard_bytes: list[int],
                 tiles_per_shard: int, limit: int | None, shard_sha256: list[str] | None = None) -> None:
        """``shard_sha256``: each shard's digest as the store records it; None for a store
        without, whose cached copies are used as found (size and crc32c checks only)."""
        self.storage, self.mirror, self.cache_dir = storage, mirror, cache_dir
        self.shard_bytes, self.tiles_per_shard = shard_bytes, tiles_per_shard
        self.shard_sha256 = shard_sha256
        self.limit = limit
        self.pinned: set[int] = set()  # shards this process is about to read: never evicted by it
        # what this process found in the cache and what it downloaded (Loader.stats())
        self.counts = {"hits": 0, "downloads": 0, "downloaded_bytes": 0}
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[int, Future[Path]] = {}
        # reentrant: a download that ends at once runs its done-callback inside _submit
        self._lock = threading.RLock()
        self._seq: list[int] = []
        self._pos: dict[int, int] = {}
        self._cursor = 0
        self.depth = 0
        self.window = 1

    def __getstate__(self) -> dict[str, Any]:
        # threads and locks stay in their process; each process downloads on its own pool
        return {**self.__dict__, "_pool": None, "_inflight": {}, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    @property
    def largest(self) -> int:
        return max(self.shard_bytes, default=0)

    def path(self, shard: int) -> Path:
        return fmt.shard_path(self.mirror, shard)

    def fits(self, shards: int) -> bool:
        return self.limit is None or shards * self.largest <= self.limit

    # -- prefetch -------------------------------------------------------------------------------
    def plan(self, indices: np.ndarray, window: int, depth: int) -> None:
        """Shards in the order ``indices`` first need them; keep ``depth`` downloads ahead."""
        if self.limit is not None:
            depth = min(depth, self.limit // max(1, self.largest) - window - 1)
        shards = np.asarray(indices, dtype=np.int64) // self.tiles_per_shard
        _, first = np.unique(shards, return_index=True)
        with self._lock:
            self._seq = shards[np.sort(first)].tolist()
            self._pos = {s: i for i, s in enumerate(self._seq)}
            self._cursor, self.window, self.depth = 0, window, max(0, depth)
        self._fill()

    def used(self, shard: int) -> None:
        """The reader reached ``shard``: the download window moves on."""
        i = self._pos.get(shard)
        if i is not None and i > self._cursor:
            with self._lock:
                self._cursor = max(self._cursor, i)
            self._fill()

    def _fill(self) -> None:
        with self._lock:
            lo = max(0, self._cursor - self.window)
            ahead = self._seq[self._cursor : self._cursor + self.depth + 1]
            self.pinned = set(self._seq[lo : self._cursor + 1]) | set(ahead)
            for shard in ahead:
                self._submit(shard)

    def _submit(self, shard: int) -> Future[Path]:
        fut = self._inflight.get(shard)
        if fut is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-fetch")
            fut = self._inflight[shard] = self._pool.submit(self._fetch, shard)
            fut.add_done_callback(partial(self._done, shard))
        return fut

    def _done(self, shard: int, _: Future[Path]) -> None:
        with self._lock:
            self._inflight.pop(shard, None)

    # -- fetch ----------------------------------------------------------------------------------
    def fetch(self, shard: int) -> Path:
        """The shard's local path, downloading it first if needed (waiting for one in flight).
        A copy already in the cache folder is used once it is known to match the store's digest
        (checked by ``_fetch``, once per process and file)."""
        self.used(shard)
        path = self.path(shard)
        if self._cached(shard, hash_it=False):
            with self._lock:
                self.counts["hits"] += 1
            return path
        with self._lock:
            self.pinned.add(shard)
            fut = self._submit(shard)
        return fut.result()

    def refetch(self, shard: int) -> None:
        """Drop a cached copy that failed a tile's check and download it again."""
        unlink_entry(self.mirror, fmt.shard_relpath(shard))
        self.fetch(shard)

    def _fetch(self, shard: int) -> Path:
        path, expected = self.path(shard), self.shard_bytes[shard]
        key = fmt.shard_relpath(shard)
        *folders, name = key.split("/")
        # one download per shard, all processes
        with exclusive_lock(self.mirror / ".locks" / str(shard), root=self.mirror):
            if self._cached(shard, hash_it=True):  # another process fetched it, or an earlier run
                return path
            dfd = open_dir(self.mirror, folders, create=True)
            try:
                for stale in os.listdir(dfd):  # left by a killed download
                    if stale.startswith(f".{name}.tmp-"):
                        unlink_at(dfd, stale)
                tmp = temporary_name(Path(name)).name
                try:
                    with os.fdopen(create_new(tmp, 0o600, dir_fd=dfd), "w+b") as f:
                        digest = self._download_shard(key, f, expected, shard)
                        f.flush()
                        if digest:  # checked as it came: this process needs no second look
                            _remember(os.fstat(f.fileno()), digest)
                    if self.limit is None:
                        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    else:
                        with exclusive_lock(self.cache_dir / ".lock"):  # room made and taken in one step
                            self._make_room(expected)
                            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                finally:
                    unlink_at(dfd, tmp)
            finally:
                os.close(dfd)
        return path

    def _download_shard(self, key: str, f: IO[bytes], expected: int, shard: int) -> str:
        """The shard into ``f``, checked (size, index, and sha256 when the store records one);
        the sha256 it was checked against, or ''. At most ``expected`` bytes (what the store
        records) are taken from the server, however large the object there is."""
        problem, attempts, mismatches = "", 0, 0
        digest = self.shard_sha256[shard] if self.shard_sha256 is not None else ""
        while attempts < ATTEMPTS and mismatches < DIGEST_DOWNLOADS:
            attempts += 1
            size, actual = self.storage.download_capped(key, f, expected)
            if size > expected:  # the object is not the store's shard: no retry makes it one
                raise CorruptChunkError(self.storage.where(key), None,
                                        f"larger than the {expected} bytes the store records")
            problem = _shard_problem(f, size, expected, self.tiles_per_shard, self.storage.where(key))
            if not problem and digest and actual != digest:
                problem = "differs from what the store records (shard sha256 mismatch)"
                mismatches += 1
            if not problem:
                with self._lock:
                    self.counts["downloads"] += 1
                    self.counts["downloaded_bytes"] += size
                return digest
        raise CorruptChunkError(self.storage.where(key), None, f"{problem} (after {attempts} downloads)")

    def _cached(self, shard: int, *, hash_it: bool) -> bool:
        """True when the cache folder holds shard ``shard`` as the store records it: a regular
        file (never a link) of its size and, when the store records digests, of its sha256,
        known to this process already or (``hash_it``) hashed now. A file of the right size that
        fails the digest is removed (``hash_it`` is passed under the shard's lock). Marks the
        file recently used: its access time, so that the modification time stays the key."""
        key = fmt.shard_relpath(shard)
        *folders, name = key.split("/")
        try:
            dfd = open_dir(self.mirror, folders, create=False)
        except (OSError, CacheError):
            return False
        try:
            try:
                fd = open_file_at(dfd, name)
            except OSError:  # absent, or a link planted there
                return False
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size != self.shard_bytes[shard]:
                    return False
                if self.shard_sha256 is not None:
                    digest = self.shard_sha256[shard]
                    if not _checked(st, digest):
                        if not hash_it:
                            return False
                        if sha256_fd(fd) != digest:
                            unlink_at(dfd, name)  # not what the bucket holds: downloaded again
                            return False
                        _remember(st, digest)
                os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))  # least recently used goes first
                return True
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def _make_room(self, need: int) -> None:
        """Evict least recently used shards (of any store in the cache folder) until ``need``
        fits; the caller holds the cache folder's lock. Only real folders and files count: a
        link in the cache folder is neither followed nor removed."""
        assert self.limit is not None
        if need > self.limit:
            raise ConfigError(f"cache_limit {self.limit} bytes is smaller than one shard ({need} bytes)")
        files = cached_shards(self.cache_dir)
        total = sum(size for _, size, _ in files)
        mine = {f"{self.mirror.name}/{fmt.shard_relpath(s)}" for s in self.pinned}
        for _, size, rel in sorted(files, key=lambda f: f[0]):
            if total + need <= self.limit:
                break
            if rel in mine:
                continue
            unlink_entry(self.cache_dir, rel)
            total -= size

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _checked(st: os.stat_result, digest: str) -> bool:
    with _CHECKED_LOCK:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, digest) in _CHECKED


def _remember(st: os.stat_result, digest: str) -> None:
    with _CHECKED_LOCK:
        _CHECKED.add((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, digest))


def _shard_problem(f: IO[bytes], size: int, expected: int, tiles_per_shard: int, name: str) -> str:
    """What is wrong with a downloaded shard, or '' when its size and index are sound."""
    if size != expected:
        return f"downloaded {size} bytes, expected {expected}"
    tail = fmt.index_nbytes(tiles_per_shard)
    f.flush()
    index = os.pread(f.fileno(), tail, size - tail)
    try:
        ShardIndex.decode(index, tiles_per_shard, name)
    except CorruptChunkError as e:
        return e.detail
    return ""

