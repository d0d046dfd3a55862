"""Random access to the tiles of a store, straight from memory-mapped shards.

Each shard file is mapped and its index parsed once, on first use; a tile is then a slice of
the map, crc32c-checked, handed on as encoded bytes or decompressed into a caller's buffer.
No zarr machinery and no per-tile Python objects beyond a memoryview on the hot path.

A store in a bucket (``s3://``, ``gs://``, ``az://``) reads the same way from a local cache
folder that ``store.remote`` keeps filled ahead of the epoch, or by ranged requests when
random order meets a cache smaller than the store (``stream``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.pipeline.stats import charge
from tilefeed.store.attrs import StoreAttrs
from tilefeed.store.codec import jpeg_size
from tilefeed.store.documents import open_store
from tilefeed.store.shard import ShardFile, chunks, read_tiles_into
from tilefeed.store import format as fmt
from tilefeed.store.pairs import sample_rows
from tilefeed.store.errors import ConfigError, CorruptChunkError, StoreFormatError, TileDecodeError
from tilefeed.store.checked import checked_arrays
from tilefeed.store.cache_dir import default_cache_dir
from tilefeed.store.remote import RemoteStore
from tilefeed.store.storage import is_url, local_path
from tilefeed.store.targets import StoreTargets, open_targets


class StoreReader:
    """A read-only view of a complete tilefeed store; safe to share between threads.

    Opening checks everything but the tiles (metadata, digests, labels, boxes); each tile is
    checked as it is read.

    Parameters
    ----------
    store : str or path-like
        A store folder, or a bucket URL (``s3://``, ``gs://``, ``az://``).
    storage_options : dict, optional
        For a bucket URL: settings added to the cloud's standard configuration.
    cache_dir : str or path-like, optional
        For a bucket URL: the local shard cache; default ``$TILEFEED_CACHE`` or
        ``~/.cache/tilefeed``.
    cache_limit : int, optional
        For a bucket URL: bytes of shards kept in the cache; default no limit.

    Raises
    ------
    StoreFormatError
        The store is incomplete, of another format version, or its metadata is damaged.
    CorruptChunkError
        An array chunk beside the tiles fails its checksum.
    ConfigError
        Bucket options given for a local folder.
    """

    def __init__(self, store: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None) -> None:
        """``store``: a folder, or a bucket URL with ``storage_options`` (added to the cloud's
        standard configuration), ``cache_dir`` (default ``~/.cache/tilefeed``, or
        ``$TILEFEED_CACHE``) and ``cache_limit`` (bytes of shards kept there; default no limit)."""
        self.remote: RemoteStore | None = None
        self.ranged = False  # a bucket store read by ranged requests only (see stream)
        if is_url(store):
            self.remote = RemoteStore(str(store), storage_options, cache_dir, cache_limit)
            self.root, self.location = self.remote.mirror, self.remote.storage.url
        else:
            if storage_options or cache_dir is not None or cache_limit is not None:
                raise ConfigError("storage_options, cache_dir and cache_limit apply to stores in "
                                  "object storage (s3://, gs://, az://), not to a local folder")
            self.root = local_path(store)
            self.location = str(self.root)
        if self.remote is not None:
            meta = StoreAttrs.from_dict(self.remote.attrs, f"store {self.location!r}")
        else:
            _, meta = open_store(self.root)
        self.samples: int = meta.samples
        self.tile: int = meta.tile
        self.shard_size: int = meta.shard_size
        self.classes: list[str] = list(meta.classes)
        self.codec = meta.tile_codec
        # Every array is checked against its recorded digests (the shards for presence and
        # size) once per node and store version, so a damaged store is refused here rather
        # than deep inside an epoch; later processes map what that check left (``checked``).
        self._meta = meta
        self._open_arrays()
        self._shards: list[ShardFile | None] = [None] * meta.shards
        self._mapped: OrderedDict[int, None] = OrderedDict()  # remote: maps kept, oldest first
        self._keep = self._maps_to_keep(window=1)
        self._lock = threading.Lock()

    def _open_arrays(self) -> None:
        cache = self.remote.cache_dir if self.remote is not None else default_cache_dir()
        arrays = checked_arrays(self.root, self._meta, self.location, Path(cache),
                                shards_here=self.remote is None)  # a remote one checked them
        self.labels: np.ndarray = arrays.labels  # (N,) int64
        self.boxes: np.ndarray = arrays.boxes  # (N, 4) top, left, height, width of each tile's picture
        self.padded = arrays.padded  # some tile holds padding (pad fit, grid edges)
        self._arrays_mapped = arrays.mapped
        # boxes, frames and masks of a store made with targets, checked; None without them
        self.targets: StoreTargets | None = open_targets(self.root, self._meta, self.location,
                                                         remote=self.remote, arrays=arrays.targets)

    @property
    def meta(self) -> StoreAttrs:
        """The store's attributes, every field checked (``StoreAttrs``): what it holds and how it
        was made (``meta.made``), each array's record (``meta.arrays``)."""
        return self._meta

    def options(self) -> dict[str, Any]:
        """The keyword arguments that open this store again (in another process)."""
        if self.remote is None:
            return {}
        return {"storage_options": self.remote.storage.options, "cache_dir": self.remote.cache_dir,
                "cache_limit": self.remote.cache.limit}

    def __len__(self) -> int:
        return self.samples

    @property
    def is_image_coded(self) -> bool:
        return self.codec.is_image_coded

    def stream(self, *, random_order: bool, window: int = 1, ahead: int = 4) -> None:
        """How a bucket store will be read: whole shards through the cache, ``ahead`` of the
        ``window`` being read, or (random order, a cache smaller than the store) ranged reads.
        A ``cache_limit`` must hold the ``window`` shards read at once and the next one (the
        smallest shard cache that works); the read-ahead shrinks to what it holds beyond them."""
        if self.remote is None:
            return
        cache = self.remote.cache
        self.ranged = random_order and not cache.fits(len(cache.shard_bytes))
        if self.targets is not None:  # a store's masks come the way its images do
            self.targets.ranged = self.ranged
        if self.ranged:
            return
        if not cache.fits(window + 1):
            raise ConfigError(
                f"cache_limit {cache.limit} bytes holds fewer than {window + 1} shards of "
                f"{cache.largest} bytes (the shuffle window plus the next shard): raise it to at least "
                f"{(window + 1) * cache.largest}")
        cache.window, cache.depth = window, ahead
        self._keep = self._maps_to_keep(window)
        if self.targets is not None:
            self.targets.keep = self._keep

    def _maps_to_keep(self, window: int) -> int:
        """Remote shards kept mapped: all when the cache holds the store, else those being read
        (a map keeps an evicted file's disk space until it closes)."""
        if self.remote is None or self.remote.cache.fits(len(self._shards)):
            return len(self._shards)
        return window + 2

    def will_read(self, indices: np.ndarray) -> None:
        """The samples about to be read, in order: a bucket store starts fetching their shards."""
        if self.remote is not None and not self.ranged:
            cache = self.remote.cache
            self.remote.plan(indices, cache.window, cache.depth)

    def shard_file(self, shard: int) -> ShardFile:
        """Shard ``shard``, mapped (a bucket store's fetched to the cache first)."""
        f = self._shards[shard]
        if f is None:
            if self.remote is not None:
                began = time.perf_counter()
                self.remote.cache.fetch(shard)  # outside the lock: other threads keep reading
                charge("download", time.perf_counter() - began)
            with self._lock:
                f = self._shards[shard]
                if f is None:
                    f = ShardFile(self.root, shard, self.shard_size)
                    self._shards[shard] = f
                    if self.remote is not None:
                        self._forget_old(shard)
        return f

    def _forget_old(self, shard: int) -> None:
        """Keep a few remote shards mapped: a dropped map closes when its last view goes, and
        the cache may then evict the file."""
        self._mapped[shard] = None
        while len(self._mapped) > self._keep:
            old, _ = self._mapped.popitem(last=False)
            self._shards[old] = None

    def _chunk(self, index: int) -> memoryview:
        shard, local = divmod(index, self.shard_size)
        try:
            return self.shard_file(shard).chunk(local)
        except CorruptChunkError:
            if self.remote is None:
                raise
            # a cached copy damaged on this disk: download it again, once
            with self._lock:
                self._shards[shard] = None
                self._mapped.pop(shard, None)
            self.remote.cache.refetch(shard)
            return self.shard_file(shard).chunk(local)

    def payloads(self, indices: Sequence[int]) -> list[memoryview]:
        """The encoded chunks of ``indices``, checksum verified (views into maps or downloads)."""
        if indices:
            self._check(min(indices), max(indices))
        if self.remote is not None:
            found = self._remote_payloads(indices)
        else:
            found = chunks(*self._places(indices))
        if self.codec.is_image_coded:
            self._check_pictures(indices, found)
        return found

    def _places(self, indices: Sequence[int]) -> tuple[list[ShardFile], list[int]]:
        """Each local sample's shard, mapped, and its place there."""
        per_shard, shard_of = self.shard_size, self.shard_file
        return [shard_of(i // per_shard) for i in indices], [i % per_shard for i in indices]

    def _check_pictures(self, indices: Sequence[int], payloads: list[memoryview]) -> None:
        """Each JPEG's header must declare the tile's size: a decoder handed these bytes sizes
        the picture by it (the check costs about a microsecond a tile)."""
        tile = (self.tile, self.tile)
        for index, payload in zip(indices, payloads, strict=True):
            try:
                size = jpeg_size(payload)
            except TileDecodeError as e:
                raise CorruptChunkError(self.location, index, e.detail) from None
            if size != tile:
                raise CorruptChunkError(self.location, index, f"the JPEG holds a {size[0]}x{size[1]} "
                                        f"picture, the tile is {tile[0]}x{tile[1]}")

    def _remote_payloads(self, indices: Sequence[int]) -> list[memoryview]:
        assert self.remote is not None
        if self.ranged:  # ranged requests: reading is downloading
            began = time.perf_counter()
            payloads = self.remote.ranges.payloads(indices)
            charge("download", time.perf_counter() - began)
            return payloads
        return [self._chunk(i) for i in indices]

    def _check(self, low: int, high: int) -> None:
        if low < 0 or high >= self.samples:
            bad = low if low < 0 else high
            raise IndexError(f"sample {bad} is out of range for {self.samples} samples")

    def read_into(self, index: int, out: np.ndarray) -> np.ndarray:
        """Decode sample ``index`` into ``out`` (T, T, 3) uint8."""
        return self.read_batch_into([index], out[None])[0]

    def read_batch_into(self, indices: list[int], out: np.ndarray, fast_idct: bool = False,
                        rows: Sequence[int] | None = None) -> np.ndarray:
        """Decode samples ``indices`` into ``out[k]``, or into ``out[rows[k]]`` (a mixture's
        part of a batch; nothing else of ``out`` is written). ``fast_idct``: JPEG tiles, see
        ``codec.decode_jpeg``."""
        rows = range(len(indices)) if rows is None else rows
        if self.remote is None:  # each tile straight from its shard's map into its place
            if indices:
                self._check(min(indices), max(indices))
            read_tiles_into(*self._places(indices), self.codec, out, rows, fast_idct)
            return out
        decode = self.codec.decode
        for k, i, payload in zip(rows, indices, self.payloads(indices), strict=True):
            try:
                decode(payload, out[k], fast_idct)
            except TileDecodeError as e:
                raise CorruptChunkError(self.location, i, e.detail) from None
        return out

    def stored_nbytes(self, indices: np.ndarray) -> int:
        """Bytes the samples ``indices`` occupy in their shards (a local store's shards are
        mapped by the time this is asked; others count 0)."""
        shards, per_shard = self._shards, self.shard_size
        return sum(f.nbytes(i % per_shard) for i in indices.tolist()
                   if (f := shards[i // per_shard]) is not None)

    def read(self, index: int) -> np.ndarray:
        return self.read_into(index, np.empty(self.codec.shape, dtype=np.uint8))

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        if self.targets is not None:
            self.targets.close()
        with self._lock:
            for f in self._shards:
                if f is not None:
                    f.close()
            self._shards = [None] * len(self._shards)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Maps and locks do not cross process boundaries; each process maps shards anew.
        state = self.__dict__.copy()
        state["_shards"] = [None] * len(self._shards)
        state["_mapped"] = OrderedDict()
        del state["_lock"]
        if self._arrays_mapped:  # mapped again there, not copied through the pipe
            del state["labels"], state["boxes"], state["targets"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if "labels" not in state:
            self._open_arrays()


def source_paths(reader: StoreReader, indices: np.ndarray) -> list[str]:
    """The source file of each sample, where the store keeps ``source_paths``; else empty
    strings.

    Parameters
    ----------
    reader : StoreReader
        The store.
    indices : numpy.ndarray
        Sample indices.

    Returns
    -------
    list of str
        Per sample, the path or URL its picture was read from, as the scan listed it.
    """
    arrays = reader.meta.arrays
    if fmt.SOURCE_PATHS not in arrays or fmt.SOURCES not in arrays:
        return [""] * len(indices)
    owners = sample_rows(reader.root, reader.meta)
    try:  # strings: zarr reads them (the reader checked the chunks' digests when it opened)
        import zarr

        paths = zarr.open_array(str(reader.root / fmt.SOURCE_PATHS), mode="r", zarr_format=3)
        wanted = np.unique(owners[indices])
        found = {int(o): str(paths[int(o)]) for o in wanted if 0 <= o < paths.shape[0]}
    except Exception as e:  # noqa: BLE001 - any failure to read them is the store's damage
        raise StoreFormatError(f"{reader.location}/{fmt.SOURCE_PATHS}: cannot be read: "
                               f"{type(e).__name__}: {e}") from None
    return [found.get(int(o), "") for o in owners[indices]]
