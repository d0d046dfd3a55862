"""A store in object storage, read through a local cache folder.

Opening lists the prefix once and copies the small objects (metadata, labels, boxes) into a
*mirror* folder laid out as the store itself, so the checks and readers of local stores serve
unchanged. Shards then come two ways:

- ``ShardCache``: whole shards, fetched into the mirror ahead of need in the order an epoch
  reads them, on a few download threads, under a byte limit with least-recently-used eviction.
  Several processes (ranks, DataLoader workers) may share one cache folder: a shard is
  downloaded under a per-shard file lock to a temporary name and renamed, so it is fetched once
  and seen whole or not at all.
- ``RangedTiles``: when random order meets a cache smaller than the store, tiles are read by
  ranged requests (each shard's index once, then a batch's tiles of one shard in one coalesced
  request), nothing kept on disk.

Every download is checked before use: a shard's size and index crc32c, every tile's crc32c. A
short or damaged download is fetched again, never yielded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess.atomic import atomic_write, temporary_name
from tilefeed.preprocess.errors import ConfigError, CorruptChunkError, StoreFormatError
from tilefeed.preprocess.storage import ATTEMPTS, ObjectStorage

DOWNLOAD_THREADS = 8  # concurrent requests: enough to hide per-request latency on object stores


def default_cache_dir() -> Path:
    base = os.environ.get("TILEFEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilefeed")
    return Path(base)


class RemoteStore:
    """The object-store side of a StoreReader: the listing, the mirror and the shard sources."""

    def __init__(self, url: str, options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None,
                 *, check: bool = True) -> None:
        self.storage = ObjectStorage(url, options)
        listing = self.storage.sizes("")  # bad credentials or no bucket: a one-line error here
        if "zarr.json" not in listing:
            if any(k.startswith(fmt.WORK_DIR + "/") for k in listing):
                raise StoreFormatError(f"store {url!r} is incomplete: preprocessing did not finish; "
                                       "rerun the same `tilefeed preprocess` command to resume it")
            raise StoreFormatError(f"{url!r} is not a tilefeed store (no tilefeed group metadata)")
        group = self.storage.read("zarr.json")
        attrs = fmt.parse_attrs(group)
        digest = (attrs or {}).get("digest", "")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        key = hashlib.sha256(f"{self.storage.url}\0{digest}".encode()).hexdigest()[:20]
        self.mirror = self.cache_dir / key
        self._small = {k: n for k, n in listing.items()
                       if not k.startswith((f"{fmt.IMAGES}/c/", f"{fmt.WORK_DIR}/"))}
        self._mirror(group, fresh=False)
        self.attrs = fmt.load_attrs(self.mirror)
        self.shard_sizes = [listing.get(fmt.shard_relpath(s)) for s in range(self.attrs["shards"])]
        self.bytes = sum(listing.values())
        if check:
            problems = self.problems()
            if problems:  # perhaps a stale copy in the mirror: fetch the small objects again
                self._mirror(group, fresh=True)
                problems = self.problems()
            if problems:
                raise CorruptChunkError(problems[0][0], None, problems[0][1])
        shard_bytes = self.attrs["arrays"][fmt.IMAGES]["shard_bytes"]
        self.cache = ShardCache(self.storage, self.mirror, self.cache_dir, shard_bytes,
                                self.attrs["shard_size"], cache_limit)
        self.ranges = RangedTiles(self.storage, shard_bytes, self.attrs["shard_size"])

    def close(self) -> None:
        self.cache.close()
        self.ranges.close()

    def _mirror(self, group: bytes, fresh: bool) -> None:
        """Copy the small objects missing from the mirror (digests are checked after), all at
        once: each is one round trip, and there are a dozen or so."""
        self.mirror.mkdir(parents=True, exist_ok=True)
        atomic_write(self.mirror / "zarr.json", group)
        missing = [k for k, size in self._small.items() if k != "zarr.json" and (
            fresh or not _present(self.mirror / k, size))]
        with ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-mirror") as pool:
            for k, data in zip(missing, pool.map(self.storage.read, missing), strict=True):
                (self.mirror / k).parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.mirror / k, data)

    def problems(self) -> list[tuple[str, str]]:
        """What ``fmt.array_problems`` finds, for every array, named by URL rather than mirror path."""
        found = []
        for name in self.attrs["arrays"]:
            for path, detail in fmt.array_problems(self.mirror, self.attrs, name, self.shard_sizes):
                found.append((self.where(path), detail))
        return found

    def where(self, path: str | Path) -> str:
        """A mirror path as the object's URL, for messages."""
        text = str(path)
        mirror = str(self.mirror)
        return self.storage.where(text[len(mirror) + 1:]) if text.startswith(mirror + "/") else text


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class ShardCache:
    """Whole shards in the mirror folder, at most ``limit`` bytes of shards in the cache folder."""

    def __init__(self, storage: ObjectStorage, mirror: Path, cache_dir: Path, shard_bytes: list[int],
                 tiles_per_shard: int, limit: int | None) -> None:
        self.storage, self.mirror, self.cache_dir = storage, mirror, cache_dir
        self.shard_bytes, self.tiles_per_shard = shard_bytes, tiles_per_shard
        self.limit = limit
        self.pinned: set[int] = set()  # shards this process is about to read: never evicted by it
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
        """The shard's local path, downloading it first if needed (waiting for one in flight)."""
        self.used(shard)
        path = self.path(shard)
        if _present(path, self.shard_bytes[shard]):
            os.utime(path)  # least recently used goes first
            return path
        with self._lock:
            self.pinned.add(shard)
            fut = self._submit(shard)
        return fut.result()

    def refetch(self, shard: int) -> None:
        """Drop a cached copy that failed a tile's check and download it again."""
        self.path(shard).unlink(missing_ok=True)
        self.fetch(shard)

    def _fetch(self, shard: int) -> Path:
        path, expected = self.path(shard), self.shard_bytes[shard]
        with _flock(self.mirror / ".locks" / str(shard)):  # one download per shard, all processes
            if _present(path, expected):
                return path
            for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed download
                stale.unlink(missing_ok=True)
            key = fmt.shard_relpath(shard)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_name(path)
            try:
                problem = ""
                for _ in range(ATTEMPTS):
                    self.storage.download(key, tmp)
                    problem = _shard_problem(tmp, expected, self.tiles_per_shard, self.storage.where(key))
                    if not problem:
                        break
                else:
                    raise CorruptChunkError(self.storage.where(key), None,
                                            f"{problem} (after {ATTEMPTS} downloads)")
                if self.limit is None:
                    os.replace(tmp, path)
                else:
                    with _flock(self.cache_dir / ".lock"):  # room made and taken in one step
                        self._make_room(expected)
                        os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        return path

    def _make_room(self, need: int) -> None:
        """Evict least recently used shards (of any store in the cache folder) until ``need``
        fits; the caller holds the cache folder's lock."""
        assert self.limit is not None
        if need > self.limit:
            raise ConfigError(f"cache_limit {self.limit} bytes is smaller than one shard ({need} bytes)")
        files = []
        for path in self.cache_dir.glob(f"*/{fmt.IMAGES}/c/*/0/0/0"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        mine = {self.path(s) for s in self.pinned}
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total + need <= self.limit:
                break
            if path in mine:
                continue
            path.unlink(missing_ok=True)
            total -= size

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _present(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _shard_problem(path: Path, expected: int, tiles_per_shard: int, name: str) -> str:
    """What is wrong with a downloaded shard, or '' when its size and index are sound."""
    size = path.stat().st_size
    if size != expected:
        return f"downloaded {size} bytes, expected {expected}"
    tail = fmt.index_nbytes(tiles_per_shard)
    with open(path, "rb") as f:
        index = os.pread(f.fileno(), tail, size - tail)
    try:
        fmt.ShardIndex.decode(index, tiles_per_shard, name)
    except CorruptChunkError as e:
        return e.detail
    return ""


class RangedTiles:
    """Tiles by ranged requests: each shard's index fetched once, a batch's tiles of one shard in
    one request (obstore coalesces nearby ranges), shards of a batch fetched concurrently."""

    def __init__(self, storage: ObjectStorage, shard_bytes: list[int], tiles_per_shard: int) -> None:
        self.storage, self.shard_bytes, self.tiles_per_shard = storage, shard_bytes, tiles_per_shard
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
        key, size = fmt.shard_relpath(shard), self.shard_bytes[shard]
        tail = fmt.index_nbytes(self.tiles_per_shard)
        for attempt in range(ATTEMPTS):
            data = self.storage.read_ranges(key, [size - tail], [size])[0]
            try:
                table = fmt.ShardIndex.decode(data, self.tiles_per_shard, self.storage.where(key)).table
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
        table, key = self._table(shard), fmt.shard_relpath(shard)
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
