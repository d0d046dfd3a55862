"""A store in object storage, read through a local cache folder.

Opening lists the prefix once and copies the small objects (metadata, labels, boxes, captions
and fields) into a *mirror* folder laid out as the store itself, so the checks and readers of
local stores serve unchanged. Only the objects the store's attributes declare are fetched, each
streamed to disk and cut off at the most bytes it can hold; anything else under the prefix stays
in the bucket.
The mirror lies in the cache folder (``cache_dir``), which is never changed through a link.
Shards then come two ways:

- ``ShardCache`` (``shard_cache``): whole shards, fetched into the mirror ahead of need in the
  order an epoch reads them, shared by the processes that use one cache folder, each checked
  against the sha256 the store records.
- ``RangedTiles`` (``ranged_tiles``): when random order meets a cache smaller than the store,
  tiles are read by ranged requests, nothing kept on disk.

A store with masks has a second sharded array; its shards come the same two ways, checked the
same way (size, index and chunk crc32c, the sha256 the attributes record), into the same cache
folder under the same limit, fetched ahead only once masks are read.

The attributes, and so the digests everything is checked against, are read from the bucket on
every open, never from the cache. A store written before shards had digests is read with a
warning (once per store and process) that its cache cannot be checked.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.arrays import array_problems
from tilefeed.store.documents import load_attrs, parse_attrs
from tilefeed.store.cache_dir import default_cache_dir, make_cache_dir, open_dir, put_file
from tilefeed.store.errors import (CorruptChunkError, StoreFormatError, TilefeedError, UncheckedCacheWarning,
                                   unfinished_store)
from tilefeed.store.object_storage import DOWNLOAD_THREADS, ObjectStorage
from tilefeed.store.ranged_tiles import RangedTiles
from tilefeed.store.shard_cache import ShardCache
from tilefeed.store.storage import redact, redacted

# The most bytes the mirror takes for an object whose size the store does not record: the
# group document (it lists every reject: as much as any reader accepts), an array's document, a
# small array's chunk per row.
GROUP_BYTES = fmt.MAX_METADATA_BYTES
ARRAY_DOC_BYTES = 1 << 20
ROW_BYTES = 64  # labels, sources, rows, cols, boxes, frames: at most four 8-byte numbers a row, compressed
# (objects: six, given twice this)
PATH_ROW_BYTES = 8 << 10  # source_paths: a path or URL (4096 bytes at most on Linux), compressed
# (string fields too: MAX_PATH_BYTES a row, as a path)
TEXT_ROW_BYTES = fmt.MAX_TEXT_BYTES + 1024  # a caption, its length and zstd's worst case over it
CHUNK_SLACK = 4096  # a compressed chunk's headers and checksum
_WARNED: set[str] = set()  # stores without shard digests already warned about in this process


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
                raise unfinished_store(url)
            raise StoreFormatError(f"{url!r} is not a tilefeed store (no tilefeed group metadata): make one "
                                   f"with `tilefeed preprocess IMAGES {url}`")
        if listing["zarr.json"] > GROUP_BYTES:
            raise CorruptChunkError(self.storage.where("zarr.json"), None,
                                    f"{listing['zarr.json']} bytes, more than the {GROUP_BYTES} a store's "
                                    "group metadata may hold")
        group = self.storage.read_capped("zarr.json", GROUP_BYTES)
        attrs = parse_attrs(group)
        digest = (attrs or {}).get("digest", "")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        key = hashlib.sha256(f"{self.storage.url}\0{digest}".encode()).hexdigest()[:20]
        self.mirror = self.cache_dir / key
        make_cache_dir(self.cache_dir)
        os.close(open_dir(self.cache_dir, [key], create=True))  # a link planted there: refused
        put_file(self.mirror, "zarr.json", lambda f: f.write(group))
        self.attrs = load_attrs(self.mirror)
        # only what the store declares, each no larger than it can be: anything else under the
        # prefix is neither fetched nor kept
        self._small = _declared(self.attrs, listing, self.storage)
        self._mirror(listing, fresh=False)
        self.shard_sizes = [listing.get(fmt.shard_relpath(s)) for s in range(self.attrs["shards"])]
        # the masks' shards (a store with targets): listed and checked against the attributes by
        # size here, fetched as they are read
        self.mask_sizes = [listing.get(fmt.shard_relpath(s, fmt.MASKS)) for s in range(self.attrs["shards"])]
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
        self.mask_cache: ShardCache | None = None
        self.mask_ranges: RangedTiles | None = None
        masks = self.attrs["arrays"].get(fmt.MASKS)
        if masks is not None:  # its shard_bytes and shard_sha256 checked by load_attrs
            per_shard = self.attrs["shard_size"]
            self.mask_cache = ShardCache(self.storage, self.mirror, self.cache_dir, masks["shard_bytes"],
                                         per_shard, cache_limit, masks["shard_sha256"], fmt.MASKS)
            self.mask_ranges = RangedTiles(self.storage, masks["shard_bytes"], per_shard, fmt.MASKS)
            # one folder, one limit: neither cache evicts a shard the other holds pinned
            self.cache.peers, self.mask_cache.peers = (self.mask_cache,), (self.cache,)
        # the masks' read-ahead follows the images' plan once a mask is read: a Loader that asks
        # for no masks fetches none
        self.masks_read = False
        self._mask_lock = threading.Lock()
        self._plan: tuple[np.ndarray, int, int] | None = None

    def plan(self, indices: np.ndarray, window: int, depth: int) -> None:
        """Fetch the shards ``indices`` need in the order they need them (``ShardCache.plan``):
        the images', and the masks' once masks are read."""
        self._plan = (indices, window, depth)
        self.cache.plan(indices, window, depth)
        if self.mask_cache is not None and self.masks_read:
            self.mask_cache.plan(indices, window, depth)

    def mask_shard(self, shard: int) -> None:
        """Masks shard ``shard`` in the mirror, fetched and checked first if needed."""
        assert self.mask_cache is not None
        with self._mask_lock:  # reader threads ask at once: the first plans, once
            first, self.masks_read = not self.masks_read, True
        if first and self._plan is not None:  # the rest of this epoch's masks fetched ahead too
            self.mask_cache.plan(*self._plan)
        self.mask_cache.fetch(shard)

    def close(self) -> None:
        self.cache.close()
        self.ranges.close()
        if self.mask_cache is not None and self.mask_ranges is not None:
            self.mask_cache.close()
            self.mask_ranges.close()

    def _mirror(self, listing: dict[str, int], fresh: bool) -> None:
        """Copy the declared small objects missing from the mirror (digests are checked after),
        all at once: each is one round trip, and there are a dozen or so. One absent from the
        bucket is left for ``problems`` to name."""
        missing = [k for k in self._small if k in listing and (
            fresh or not _present(self.mirror / k, listing[k]))]

        def fetch(k: str) -> None:
            put_file(self.mirror, k, lambda f: self.storage.download_capped(k, f, self._small[k]))

        with ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="tilefeed-mirror") as pool:
            for _ in pool.map(fetch, missing):
                pass

    def problems(self) -> list[tuple[str, str]]:
        """What ``array_problems`` finds, for every array, named by URL rather than mirror path."""
        found = []
        for name in self.attrs["arrays"]:
            sizes = self.mask_sizes if name == fmt.MASKS else self.shard_sizes
            for path, detail in array_problems(self.mirror, self.attrs, name, sizes):
                found.append((self.where(path), detail))
        return found

    def where(self, path: str | Path) -> str:
        """A mirror path as the object's URL, for messages."""
        text = str(path)
        mirror = str(self.mirror)
        return self.storage.where(text[len(mirror) + 1:]) if text.startswith(mirror + "/") else text


def _present(path: Path, size: int) -> bool:
    """True when ``path`` is a regular file (not a link) of ``size`` bytes."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def _declared(attrs: dict[str, Any], listing: Mapping[str, int], storage: ObjectStorage) -> dict[str, int]:
    """Every small object the store's attributes declare (array documents, small arrays'
    chunks) with the most bytes each may hold; one larger in the listing is refused here."""
    arrays = attrs.get("arrays")
    if not isinstance(arrays, dict) or fmt.IMAGES not in arrays:
        raise StoreFormatError(f"{storage.url}: the store's attributes list no arrays")
    numeric = _numeric_fields(attrs)
    keys: dict[str, int] = {}
    for name, rec in arrays.items():
        # a caption or field array's name is checked against PAIR_NAME: a key under the prefix,
        # never one that leads out of the mirror
        if name not in (fmt.IMAGES, fmt.MASKS, *fmt.SMALL_ARRAYS) and not fmt.is_pair_array(name):
            raise StoreFormatError(f"{storage.url}: the store's attributes list an unknown array {name!r}")
        keys[f"{name}/zarr.json"] = ARRAY_DOC_BYTES
        if name in (fmt.IMAGES, fmt.MASKS):  # shards: fetched as they are read
            continue
        try:
            length, chunk, ndim = int(rec["length"]), int(rec["chunk"]), int(rec.get("ndim", 1))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise StoreFormatError(f"{storage.url}: array {name!r} has no valid length and chunk") from None
        count = fmt.ceil_div(length, chunk) if chunk > 0 and length >= 0 else -1
        if count < 0 or count > len(listing) or not 1 <= ndim <= 8:
            raise StoreFormatError(f"{storage.url}: array {name!r} declares {length} rows in chunks of "
                                   f"{chunk} ({ndim} dimensions), which this store cannot hold")
        per_row = _row_bytes(name, numeric)
        for i in range(count):
            rows = min(chunk, length - i * chunk)
            keys[fmt.small_chunk_path(Path(), name, i, ndim).as_posix()] = rows * per_row + CHUNK_SLACK
    for key, cap in keys.items():
        size = listing.get(key)
        if size is not None and size > cap:
            raise CorruptChunkError(storage.where(key), None,
                                    f"{size} bytes, more than the {cap} the store's metadata allows")
    return keys


def _numeric_fields(attrs: dict[str, Any]) -> set[str]:
    """The arrays of the fields the attributes say hold numbers (``int64``, ``float64``); any
    other field is bounded as strings, the larger, until the attributes' own checks judge it."""
    fields = attrs.get("fields")
    entries = fields if isinstance(fields, list) else []
    return {fmt.field_array(f["name"]) for f in entries if isinstance(f, dict)
            and isinstance(f.get("name"), str) and f.get("dtype") in ("int64", "float64")}


def _row_bytes(name: str, numeric: set[str]) -> int:
    """The most bytes a row of small array ``name`` takes in its chunk object, compressed."""
    if name.startswith(fmt.TEXT_PREFIX):
        return TEXT_ROW_BYTES
    if name == fmt.SOURCE_PATHS or (name.startswith(fmt.FIELD_PREFIX) and name not in numeric):
        return PATH_ROW_BYTES
    return ROW_BYTES * (2 if name == fmt.OBJECTS else 1)
