"""A store in object storage, read through a local cache folder.

Opening lists the prefix once and copies the small objects (metadata, labels, boxes) into a
*mirror* folder laid out as the store itself, so the checks and readers of local stores serve
unchanged. Only the objects the store's attributes declare are fetched, each streamed to disk
and cut off at the most bytes it can hold; anything else under the prefix stays in the bucket.
The cache folder is made private to the user, and nothing there is created, locked, evicted or
deleted through a symbolic link: folders are entered with ``O_NOFOLLOW`` relative to their
parent, files are created afresh under temporary names, lock files are never truncated.
Shards then come two ways:

- ``ShardCache``: whole shards, fetched into the mirror ahead of need in the order an epoch
  reads them, on a few download threads, under a byte limit with least-recently-used eviction.
  Several processes (ranks, DataLoader workers) may share one cache folder: a shard is
  downloaded under a per-shard file lock to a temporary name and renamed, so it is fetched once
  and seen whole or not at all.
- ``RangedTiles``: when random order meets a cache smaller than the store, tiles are read by
  ranged requests (each shard's index once, then a batch's tiles of one shard in one coalesced
  request), nothing kept on disk.

Every download is checked before use: a shard's size and index crc32c, every tile's crc32c,
and the shard's sha256 against the one the store's attributes record (read from the bucket on
every open, never from the cache). A short or damaged download is fetched again, never yielded;
one whose sha256 differs twice is refused. A shard another process put in the cache folder is
used only once its sha256 matches, checked once per process and file (by device, inode, size
and modification time: recency is kept in the access time, so reading never changes the key).
The cache thus holds only what the bucket holds: a file of the right size with its chunks
swapped, each crc32c intact, is downloaded again, not read. A store written before shards had
digests is read with a warning (once per store and process) that its cache cannot be checked.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.atomic import CLOEXEC, NOFOLLOW, create_new, open_lock_file, temporary_name
from tilefeed.store.errors import (CacheError, ConfigError, CorruptChunkError, StoreFormatError,
                                        TilefeedError, UncheckedCacheWarning)
from tilefeed.store.storage import ATTEMPTS, DOWNLOAD_CHUNK, ObjectStorage, redact, redacted

DOWNLOAD_THREADS = 8  # concurrent requests: enough to hide per-request latency on object stores
# The most bytes the mirror takes for an object whose size the store does not record: the
# group document (it lists every reject: as much as any reader accepts), an array's document, a
# small array's chunk per row.
GROUP_BYTES = fmt.MAX_METADATA_BYTES
ARRAY_DOC_BYTES = 1 << 20
ROW_BYTES = 64  # labels, sources, rows, cols, boxes: at most four 8-byte numbers a row, compressed
PATH_ROW_BYTES = 8 << 10  # source_paths: a path or URL (4096 bytes at most on Linux), compressed
CHUNK_SLACK = 4096  # a compressed chunk's headers and checksum
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW | CLOEXEC
_FILE_FLAGS = os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a planted pipe never blocks
DIGEST_DOWNLOADS = 2  # a shard whose sha256 differs this many times is not the store's: refused
# Cached shard files whose sha256 this process has checked (or downloaded itself), by (device,
# inode, size, modification time, the digest they matched): each is hashed once, not every epoch.
_CHECKED: set[tuple[int, int, int, int, str]] = set()
_CHECKED_LOCK = threading.Lock()
_WARNED: set[str] = set()  # stores without shard digests already warned about in this process


def default_cache_dir() -> Path:
    base = os.environ.get("TILEFEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilefeed")
    return Path(base)


class RemoteStore:
    """The object-store side of a StoreReader: the listing, the mirror and the shard sources."""

    def __init__(self, url: str, options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None,
                 *, check: bool = True, warn: bool = True) -> None:
        """``check``: the small objects against the attributes' digests before anything is read
        (``verify`` reports them instead). ``warn``: the warning that a store which records no
        shard digests has a cache that cannot be checked (``verify`` reads no cache)."""
        try:
            self._open(url, options, cache_dir, cache_limit, check, warn)
        except TilefeedError as e:  # a message carries no credential, whoever wrote it
            raise redacted(e, options) from None

    def _open(self, url: str, options: dict[str, Any] | None, cache_dir: str | os.PathLike[str] | None,
              cache_limit: int | None, check: bool, warn: bool) -> None:
        self.storage = ObjectStorage(url, options)
        listing = self.storage.sizes("")  # bad credentials or no bucket: a one-line error here
        if "zarr.json" not in listing:
            if any(k.startswith(fmt.WORK_DIR + "/") for k in listing):
                raise StoreFormatError(f"store {url!r} is incomplete: preprocessing did not finish; "
                                       "rerun the same `tilefeed preprocess` command to resume it")
            raise StoreFormatError(f"{url!r} is not a tilefeed store (no tilefeed group metadata)")
        if listing["zarr.json"] > GROUP_BYTES:
            raise CorruptChunkError(self.storage.where("zarr.json"), None,
                                    f"{listing['zarr.json']} bytes, more than the {GROUP_BYTES} a store's "
                                    "group metadata may hold")
        group = _read_capped(self.storage, "zarr.json", GROUP_BYTES)
        attrs = fmt.parse_attrs(group)
        digest = (attrs or {}).get("digest", "")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        key = hashlib.sha256(f"{self.storage.url}\0{digest}".encode()).hexdigest()[:20]
        self.mirror = self.cache_dir / key
        make_cache_dir(self.cache_dir)
        os.close(_open_dir(self.cache_dir, [key], create=True))  # a link planted there: refused
        _put(self.mirror, "zarr.json", lambda f: f.write(group))
        self.attrs = fmt.load_attrs(self.mirror)
        # only what the store declares, each no larger than it can be: anything else under the
        # prefix is neither fetched nor kept
        self._small = _declared(self.attrs, listing, self.storage)
        self._mirror(listing, fresh=False)
        self.shard_sizes = [listing.get(fmt.shard_relpath(s)) for s in range(self.attrs["shards"])]
        self.bytes = sum(listing.values())
        if check:
            problems = self.problems()
            if problems:  # perhaps a stale copy in the mirror: fetch the small objects again
                self._mirror(listing, fresh=True)
                problems = self.problems()
            if problems:
                raise CorruptChunkError(problems[0][0], None, problems[0][1])
        shard_bytes = self.attrs["arrays"][fmt.IMAGES]["shard_bytes"]
        digests = self.attrs["arrays"][fmt.IMAGES].get("shard_sha256")  # checked by load_attrs
        if digests is None and warn and self.storage.url not in _WARNED:
            _WARNED.add(self.storage.url)
            warnings.warn(redact(
                f"{self.storage.url}: the store records no sha256 of its shards (it was written by an "
                f"older tilefeed), so the copies in the cache folder {str(self.cache_dir)!r} cannot be "
                "checked against the bucket; write it again with `tilefeed preprocess ... --overwrite` "
                "to have them checked", options), UncheckedCacheWarning, stacklevel=4)
        self.cache = ShardCache(self.storage, self.mirror, self.cache_dir, shard_bytes,
                                self.attrs["shard_size"], cache_limit, digests)
        self.ranges = RangedTiles(self.storage, shard_bytes, self.attrs["shard_size"])

    def close(self) -> None:
        self.cache.close()
        self.ranges.close()

    def _mirror(self, listing: dict[str, int], fresh: bool) -> None:
        """Copy the declared small objects missing from the mirror (digests are checked after),
        all at once: each is one round trip, and there are a dozen or so. One absent from the
        bucket is left for ``problems`` to name."""
        missing = [k for k in self._small if k in listing and (
            fresh or not _present(self.mirror / k, listing[k]))]

        def fetch(k: str) -> None:
            _put(self.mirror, k, lambda f: _download(self.storage, k, f, self._small[k]))

        with ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-mirror") as pool:
            for _ in pool.map(fetch, missing):
                pass

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
def _flock(path: Path, root: Path | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path``, created if absent and never truncated. The
    folders from ``root`` (default: ``path``'s own folder) down to it are made private, and
    neither they nor the file may be symbolic links."""
    base = path.parent if root is None else root
    parts = path.parent.relative_to(base).parts
    if root is None:
        make_cache_dir(base)
    dfd = _open_dir(base, parts, create=True)
    try:
        try:
            fd = open_lock_file(path.name, 0o600, dir_fd=dfd)
        except OSError as e:
            raise CacheError(f"cannot lock {str(path)!r}: {e.strerror or e}") from None
    finally:
        os.close(dfd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
        _unlink(self.mirror, fmt.shard_relpath(shard))
        self.fetch(shard)

    def _fetch(self, shard: int) -> Path:
        path, expected = self.path(shard), self.shard_bytes[shard]
        key = fmt.shard_relpath(shard)
        *folders, name = key.split("/")
        # one download per shard, all processes
        with _flock(self.mirror / ".locks" / str(shard), root=self.mirror):
            if self._cached(shard, hash_it=True):  # another process fetched it, or an earlier run
                return path
            dfd = _open_dir(self.mirror, folders, create=True)
            try:
                for stale in os.listdir(dfd):  # left by a killed download
                    if stale.startswith(f".{name}.tmp-"):
                        _unlink_at(dfd, stale)
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
                        with _flock(self.cache_dir / ".lock"):  # room made and taken in one step
                            self._make_room(expected)
                            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                finally:
                    _unlink_at(dfd, tmp)
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
            size, actual = _download_hashed(self.storage, key, f, expected)
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
            dfd = _open_dir(self.mirror, folders, create=False)
        except (OSError, CacheError):
            return False
        try:
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
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
                        if fmt.sha256_fd(fd) != digest:
                            _unlink_at(dfd, name)  # not what the bucket holds: downloaded again
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
        files = _cached_shards(self.cache_dir)
        total = sum(size for _, size, _ in files)
        mine = {f"{self.mirror.name}/{fmt.shard_relpath(s)}" for s in self.pinned}
        for _, size, rel in sorted(files, key=lambda f: f[0]):
            if total + need <= self.limit:
                break
            if rel in mine:
                continue
            _unlink(self.cache_dir, rel)
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


def _present(path: Path, size: int) -> bool:
    """True when ``path`` is a regular file (not a link) of ``size`` bytes."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def _shard_problem(f: IO[bytes], size: int, expected: int, tiles_per_shard: int, name: str) -> str:
    """What is wrong with a downloaded shard, or '' when its size and index are sound."""
    if size != expected:
        return f"downloaded {size} bytes, expected {expected}"
    tail = fmt.index_nbytes(tiles_per_shard)
    f.flush()
    index = os.pread(f.fileno(), tail, size - tail)
    try:
        fmt.ShardIndex.decode(index, tiles_per_shard, name)
    except CorruptChunkError as e:
        return e.detail
    return ""


# -- the cache folder: made private, entered and changed without following a link -------------
def make_cache_dir(path: Path) -> None:
    """The cache folder, created readable by this user only; an existing one must be this
    user's (another user could otherwise plant or swap what it holds)."""
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        owner = os.stat(path).st_uid
    except FileExistsError:
        raise CacheError(f"the cache folder {str(path)!r} is a file; remove it or choose another") from None
    except OSError as e:
        raise CacheError(f"cannot make the cache folder {str(path)!r}: {e.strerror or e}") from None
    if owner != os.getuid():
        raise CacheError(f"the cache folder {str(path)!r} belongs to another user (uid {owner}); "
                         "choose a folder of your own (cache_dir=, or $TILEFEED_CACHE)")


def _enter(fd: int, parts: Sequence[str], create: bool, where: Path) -> int:
    """A descriptor of the folder ``parts`` below the folder ``fd`` (which stays open), each
    entered without following a link and, with ``create``, made private where absent."""
    current = fd
    try:
        for k, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise CacheError(f"{str(where)!r}: {part!r} is no name of a cache entry")
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o700, dir_fd=current)
                except FileExistsError:
                    pass  # another process made it just now
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                at = where.joinpath(*parts[: k + 1])
                raise CacheError(f"{str(at)!r} in the cache is a symbolic link or a file where a "
                                 "folder belongs; tilefeed never follows one there: remove it") from None
            if current != fd:
                os.close(current)
            current = nxt
    except BaseException:
        if current != fd:
            os.close(current)
        raise
    return current if current != fd else os.dup(fd)


def _open_dir(root: Path, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of ``root/parts...``; ``root`` is the folder the user named (or made
    here), everything below it is entered as ``_enter`` does."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    try:
        return _enter(fd, parts, create, root)
    finally:
        os.close(fd)


def _unlink_at(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _unlink(root: Path, rel: str) -> None:
    """Remove the file ``root/rel`` (the entry itself, never a link's target); nothing when a
    folder on the way is absent or is a link."""
    *folders, name = rel.split("/")
    try:
        dfd = _open_dir(root, folders, create=False)
    except (FileNotFoundError, CacheError):
        return
    try:
        _unlink_at(dfd, name)
    finally:
        os.close(dfd)


def _put(root: Path, rel: str, fill: Any) -> None:
    """The file ``root/rel`` written whole by ``fill(file)``: under a temporary name created
    afresh in a folder entered without following links, then renamed."""
    *folders, name = rel.split("/")
    dfd = _open_dir(root, folders, create=True)
    tmp = temporary_name(Path(name)).name
    try:
        with os.fdopen(create_new(tmp, 0o600, dir_fd=dfd), "w+b") as f:
            fill(f)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        _unlink_at(dfd, tmp)
        os.close(dfd)


def _cached_shards(cache_dir: Path) -> list[tuple[float, int, str]]:
    """(last use, size, path under the cache folder) of every shard file there: real folders and
    regular files only, so a link planted in the cache folder leads nowhere. A shard's last use
    is its access time, which ``ShardCache`` sets as it hands the shard out."""
    found: list[tuple[float, int, str]] = []
    try:
        top = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except FileNotFoundError:
        return found
    try:
        with os.scandir(top) as mirrors:
            names = [e.name for e in mirrors if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
        for mirror in names:
            try:
                shards_fd = _enter(top, [mirror, fmt.IMAGES, "c"], False, cache_dir)
            except (OSError, CacheError):
                continue
            try:
                with os.scandir(shards_fd) as entries:
                    numbers = [e.name for e in entries if e.name.isdigit() and e.is_dir(follow_symlinks=False)]
                for n in numbers:
                    try:
                        fd = _enter(shards_fd, [n, "0", "0"], False, cache_dir)
                    except (OSError, CacheError):
                        continue
                    try:
                        st = os.stat("0", dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    finally:
                        os.close(fd)
                    if stat.S_ISREG(st.st_mode):
                        found.append((st.st_atime, st.st_size, f"{mirror}/{fmt.IMAGES}/c/{n}/0/0/0"))
            finally:
                os.close(shards_fd)
    finally:
        os.close(top)
    return found


# -- bounded downloads ------------------------------------------------------------------------
def _download(storage: ObjectStorage, key: str, f: IO[bytes], cap: int) -> int:
    """The object ``key`` streamed into ``f`` (emptied first), but never more than ``cap`` + 1
    bytes of it: the bytes written, ``cap`` + 1 meaning the object is larger than ``cap``."""
    return _download_hashed(storage, key, f, cap)[0]


def _download_hashed(storage: ObjectStorage, key: str, f: IO[bytes], cap: int) -> tuple[int, str]:
    """``_download``, and the sha256 (hex) of the bytes written, taken as they stream."""
    import obstore

    def get() -> tuple[int, str]:
        f.seek(0)
        f.truncate()
        written, h = 0, hashlib.sha256()
        for piece in obstore.get(storage.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
            view = memoryview(piece)[: cap + 1 - written]
            f.write(view)
            h.update(view)
            written += len(view)
            if written > cap:
                break  # dropping the stream closes the connection: nothing more is read
        f.flush()
        return written, h.hexdigest()

    return storage._call("reading", key, get)


def _read_capped(storage: ObjectStorage, key: str, cap: int) -> bytes:
    """The object ``key``, which must hold at most ``cap`` bytes, read in pieces."""
    import obstore

    def get() -> bytes:
        data = bytearray()
        for piece in obstore.get(storage.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
            data += memoryview(piece)[: cap + 1 - len(data)]
            if len(data) > cap:
                break
        return bytes(data)

    data = storage._call("reading", key, get)
    if len(data) > cap:
        raise CorruptChunkError(storage.where(key), None, f"larger than {cap} bytes")
    return data


def _declared(attrs: dict[str, Any], listing: Mapping[str, int], storage: ObjectStorage) -> dict[str, int]:
    """Every small object the store's attributes declare (array documents, small arrays'
    chunks) with the most bytes each may hold; one larger in the listing is refused here."""
    arrays = attrs.get("arrays")
    if not isinstance(arrays, dict) or fmt.IMAGES not in arrays:
        raise StoreFormatError(f"{storage.url}: the store's attributes list no arrays")
    keys: dict[str, int] = {}
    for name, rec in arrays.items():
        if name not in (fmt.IMAGES, *fmt.SMALL_ARRAYS):
            raise StoreFormatError(f"{storage.url}: the store's attributes list an unknown array {name!r}")
        keys[f"{name}/zarr.json"] = ARRAY_DOC_BYTES
        if name == fmt.IMAGES:
            continue
        try:
            length, chunk, ndim = int(rec["length"]), int(rec["chunk"]), int(rec.get("ndim", 1))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise StoreFormatError(f"{storage.url}: array {name!r} has no valid length and chunk") from None
        count = fmt.ceil_div(length, chunk) if chunk > 0 and length >= 0 else -1
        if count < 0 or count > len(listing) or not 1 <= ndim <= 8:
            raise StoreFormatError(f"{storage.url}: array {name!r} declares {length} rows in chunks of "
                                   f"{chunk} ({ndim} dimensions), which this store cannot hold")
        per_row = PATH_ROW_BYTES if name == fmt.SOURCE_PATHS else ROW_BYTES
        rest = "/0" * (ndim - 1)
        for i in range(count):
            rows = min(chunk, length - i * chunk)
            keys[f"{name}/c/{i}{rest}"] = rows * per_row + CHUNK_SLACK
    for key, cap in keys.items():
        size = listing.get(key)
        if size is not None and size > cap:
            raise CorruptChunkError(storage.where(key), None,
                                    f"{size} bytes, more than the {cap} the store's metadata allows")
    return keys




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
