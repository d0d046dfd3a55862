"""Whole shards of a bucket store in its mirror folder, fetched ahead of need in the order an
epoch reads them, on a few download threads, under a byte limit with least-recently-used
eviction.

The limit holds at every moment: the shards this process reads and fetches ahead (``pinned``)
are as many as the limit holds (the read-ahead shrinks to fit), room is made before a download
starts, and again, under the cache folder's lock, as the download is put in place; should the
pinned shards alone leave no room (a limit below what the reader holds at once), they are
evicted too, least recently used first, and a reader that loses a shard fetches it again.

Several processes (ranks, DataLoader workers) may share one cache folder: a shard is
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
                 tiles_per_shard: int, limit: int | None, shard_sha256: list[str] | None = None,
                 array: str = fmt.IMAGES) -> None:
        """``shard_sha256``: each shard's digest as the store records it; None for a store
        without, whose cached copies are used as found (size and crc32c checks only).
        ``array``: the sharded array these shards are of (``images``, or a store's ``masks``,
        which share the cache folder and its limit)."""
        self.storage, self.mirror, self.cache_dir = storage, mirror, cache_dir
        self.array = array
        self.shard_bytes, self.tiles_per_shard = shard_bytes, tiles_per_shard
        self.shard_sha256 = shard_sha256
        self.limit = limit
        # shards this process reads or fetched ahead for reading: evicted last (and only to keep the
        # limit); at most as many as the limit holds
        self.pinned: set[int] = set()
        self._recent: list[int] = []  # the last shards handed out, oldest first: those read now
        self._reserved: dict[int, int] = {}  # downloads under way here: the bytes room was made for
        # shards a reader of this process waits for now (how many readers): always fetched and
        # put in place, whatever the read-ahead decided when it was sent
        self._waiting: dict[int, int] = {}
        # what this process found in the cache and what it downloaded (Loader.stats())
        self.counts = {"hits": 0, "downloads": 0, "downloaded_bytes": 0}
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[int, Future[Path]] = {}
        # reentrant: a download that ends at once runs its done-callback inside _submit
        self._lock = threading.RLock()
        self._seq: list[int] = []
        self._pos: dict[int, int] = {}
        self._cursor = 0
        self._started = False  # a shard of the current plan was handed out
        self._tail: set[int] = set()  # the last plan's shards still to come when this one was made
        self.depth = 0
        self.window = 1
        # the other caches of this store that share the folder and its limit (a store's masks
        # beside its images): their pinned shards are kept here as this cache's own are
        self.peers: tuple[ShardCache, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        # threads and locks stay in their process; each process downloads on its own pool
        return {**self.__dict__, "_pool": None, "_inflight": {}, "_lock": None, "_reserved": {},
                "_waiting": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    @property
    def largest(self) -> int:
        return max(self.shard_bytes, default=0)

    def path(self, shard: int) -> Path:
        return fmt.shard_path(self.mirror, shard, self.array)

    def key(self, shard: int) -> str:
        """The shard's key under the store's root (in the bucket and in the mirror)."""
        return fmt.shard_relpath(shard, self.array)

    def fits(self, shards: int) -> bool:
        return self.limit is None or shards * self.largest <= self.limit

    @property
    def slots(self) -> int | None:
        """Shards of the largest size the limit holds; None without a limit."""
        return None if self.limit is None else self.limit // max(1, self.largest)

    def _held(self) -> int:
        """Shards handed out that stay pinned: the ``window`` read at once and the one after
        (a reader finishing one while the next begins), never more than the limit holds."""
        slots = self.slots
        return self.window + 1 if slots is None else max(1, min(self.window + 1, slots))

    # -- prefetch -------------------------------------------------------------------------------
    def plan(self, indices: np.ndarray, window: int, depth: int) -> None:
        """Shards in the order ``indices`` first need them; keep ``depth`` downloads ahead of
        the ``window`` + 1 shards being read, fewer where the limit holds fewer."""
        shards = np.asarray(indices, dtype=np.int64) // self.tiles_per_shard
        _, first = np.unique(shards, return_index=True)
        with self._lock:
            self.window = window
            slots = self.slots
            if slots is not None:
                depth = min(depth, slots - self._held())
            # a plan made while the last one's final shards are still read (the next epoch's):
            # those reads must not move this plan on
            self._tail = set(self._seq[self._cursor :]) if self._started else set()
            self._seq = shards[np.sort(first)].tolist()
            self._pos = {s: i for i, s in enumerate(self._seq)}
            self._cursor, self.depth, self._started = 0, max(0, depth), False
            self._fill()

    def used(self, shard: int) -> None:
        """The reader takes ``shard``: it counts among those read now, and the download window
        moves on to its place in the plan (never back: threads reading several batches take
        shards a little out of order). Until the plan's first shard comes, a shard the last
        plan had still to read is that plan's, and moves nothing."""
        with self._lock:
            if shard in self._recent:  # read again: the newest, and nothing else moves
                self._recent.remove(shard)
                self._recent.append(shard)
                return
            if self._started or shard not in self._tail:
                self._started, self._tail = True, set()
                self._cursor = max(self._cursor, self._pos.get(shard, self._cursor))
            self._recent.append(shard)
            del self._recent[: -self._held()]
            self._fill()

    def _fill(self) -> None:
        """Pin the shards read now and the next ``depth`` of the plan, and fetch the latter;
        the caller holds the lock."""
        ahead: list[int] = []
        at = self._cursor
        while len(ahead) < self.depth and at < len(self._seq):
            if self._seq[at] not in self._recent:
                ahead.append(self._seq[at])
            at += 1
        self.pinned = set(self._recent) | set(ahead)
        for shard in ahead:
            self._submit(shard)

    def _submit(self, shard: int) -> Future[Path]:
        fut = self._inflight.get(shard)
        if fut is None or fut.done():  # a finished download whose callback has not run yet is done
            if self._pool is None:
                self._pool = ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-fetch")
            fut = self._inflight[shard] = self._pool.submit(self._fetch, shard)
            fut.add_done_callback(partial(self._done, shard))
        return fut

    def _done(self, shard: int, fut: Future[Path]) -> None:
        with self._lock:
            if self._inflight.get(shard) is fut:  # not a later download of the same shard
                del self._inflight[shard]

    # -- fetch ----------------------------------------------------------------------------------
    def fetch(self, shard: int) -> Path:
        """The shard's local path, downloading it first if needed (waiting for one in flight).
        A copy already in the cache folder is used once it is known to match the store's digest
        (checked by ``_fetch``, once per process and file)."""
        self.used(shard)  # pinned from here on, while it is among those read now
        path = self.path(shard)
        if self._cached(shard, hash_it=False):
            with self._lock:
                self.counts["hits"] += 1
            return path
        with self._lock:
            self._waiting[shard] = self._waiting.get(shard, 0) + 1
        try:
            # a download sent ahead may have been dropped for want of room before this reader
            # came (or its shard evicted since): then it is sent again, as a shard waited for
            for _ in range(3):
                with self._lock:
                    fut = self._submit(shard)
                fut.result()
                if self._cached(shard, hash_it=False):
                    return path
            raise CacheError(f"shard {shard} of {self.mirror}: downloaded three times and gone each "
                                   "time: the cache folder is shared with readers whose cache_limit "
                                   "is too small for them all")
        finally:
            with self._lock:
                left = self._waiting.pop(shard) - 1
                if left:
                    self._waiting[shard] = left

    def refetch(self, shard: int) -> None:
        """Drop a cached copy that failed a tile's check and download it again."""
        unlink_entry(self.mirror, self.key(shard))
        self.fetch(shard)

    def _fetch(self, shard: int) -> Path:
        path, expected = self.path(shard), self.shard_bytes[shard]
        key = self.key(shard)
        *folders, name = key.split("/")
        # one download per shard, all processes (the images' lock keeps its name: a process of
        # an earlier version sharing the folder takes the same one)
        lock = str(shard) if self.array == fmt.IMAGES else f"{self.array}-{shard}"
        with exclusive_lock(self.mirror / ".locks" / lock, root=self.mirror):
            if self._cached(shard, hash_it=True):  # another process fetched it, or an earlier run
                return path
            dfd = open_dir(self.mirror, folders, create=True)
            try:
                for stale in os.listdir(dfd):  # left by a killed download
                    if stale.startswith(f".{name}.tmp-"):
                        unlink_at(dfd, stale)
                tmp = temporary_name(Path(name)).name
                try:
                    if self.limit is not None:  # room first: the download itself takes disk
                        with exclusive_lock(self.cache_dir / ".lock"):
                            if not self._make_room(shard, expected, placing=False) and not self._wanted(shard):
                                return path  # fetched ahead, no longer wanted, and no room: not fetched
                            with self._lock:
                                self._reserved[shard] = expected
                    with os.fdopen(create_new(tmp, 0o600, dir_fd=dfd), "w+b") as f:
                        digest = self._download_shard(key, f, expected, shard)
                        f.flush()
                        if digest:  # checked as it came: this process needs no second look
                            _remember(os.fstat(f.fileno()), digest)
                    if self.limit is None:
                        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    else:
                        # others may have filled the folder meanwhile: room made and taken in one step
                        with exclusive_lock(self.cache_dir / ".lock"):
                            if self._make_room(shard, expected, placing=True):
                                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                finally:
                    unlink_at(dfd, tmp)
                    with self._lock:
                        self._reserved.pop(shard, None)
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
        key = self.key(shard)
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

    def _wanted(self, shard: int) -> bool:
        with self._lock:
            return shard in self.pinned or shard in self._waiting

    def pinned_keys(self) -> tuple[set[str], set[str]]:
        """The shards this process reads (or waits for) and those it fetched ahead, as paths
        under the cache folder: the ones eviction keeps longest."""
        mine = f"{self.mirror.name}/"
        with self._lock:
            read = {mine + self.key(s) for s in {*self._recent, *self._waiting}}
            ahead = {mine + self.key(s) for s in self.pinned} - read
        return read, ahead

    def _make_room(self, shard: int, need: int, *, placing: bool) -> bool:
        """Evict least recently used shards (of any store in the cache folder) until ``need``
        bytes of ``shard`` fit beside them; the caller holds the cache folder's lock. True when
        they fit. Shards this process has pinned go only as a pinned shard is put in place
        (``placing``), after all others (those read before those fetched ahead, each least
        recently used first; its ``peers``' pinned shards count as pinned): the limit is kept
        whatever it takes, and a shard no longer pinned
        (fetched ahead of a plan since replaced) is not put in place at their cost. Before a
        download (not ``placing``) the other downloads under way here count too. Only real
        folders and files count: a link in the cache folder is neither followed nor removed."""
        assert self.limit is not None
        if need > self.limit:
            raise ConfigError(f"cache_limit {self.limit} bytes is smaller than one shard ({need} bytes): "
                              f"raise it to at least {self.largest}")
        own = f"{self.mirror.name}/{self.key(shard)}"
        read, ahead = self.pinned_keys()  # evicted last, this cache's and its peers'
        for peer in self.peers:
            theirs_read, theirs_ahead = peer.pinned_keys()
            read, ahead = read | theirs_read, (ahead | theirs_ahead) - theirs_read
        with self._lock:
            reserved = 0 if placing else sum(b for s, b in self._reserved.items() if s != shard)
            # a shard pinned or waited for by a reader goes in place at others' cost
            forced = placing and (shard in self.pinned or shard in self._waiting)
        files = [f for f in cached_shards(self.cache_dir) if f[2] != own]  # its own stale copy: replaced
        total = reserved + sum(size for _, size, _ in files)
        for _, size, rel in sorted(files, key=lambda f: (f[2] in read or f[2] in ahead, f[2] in ahead, f[0])):
            if total + need <= self.limit:
                break
            if not forced and (rel in read or rel in ahead):
                break  # only pinned shards are left
            unlink_entry(self.cache_dir, rel)
            total -= size
        return total + need <= self.limit

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

