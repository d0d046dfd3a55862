"""Random access to the tiles of a store, straight from memory-mapped shards.

Each shard file is mapped and its index parsed once, on first use; a tile is then a slice of
the map, crc32c-checked, handed on as encoded bytes or decompressed into a caller's buffer.
No zarr machinery and no per-tile Python objects beyond a memoryview on the hot path.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess.zarr_codecs import read_small_array


class StoreReader:
    """A read-only view of a complete tilefeed store; safe to share between threads."""

    def __init__(self, store: str | Path) -> None:
        self.root = Path(store)
        attrs = fmt.load_attrs(self.root)
        self.attrs = attrs
        self.samples: int = attrs["samples"]
        self.tile: int = attrs["tile"][0]
        self.shard_size: int = attrs["shard_size"]
        self.classes: list[str] = list(attrs["classes"])
        self.codec = fmt.TileCodec(attrs["codec"], self.tile, attrs["quality"] or 90)
        # Every array is checked against its recorded digests (the shards for presence and
        # size), each once, so a damaged store is refused here rather than deep inside an
        # epoch: one read of the small arrays, none of the tiles.
        for name in attrs["arrays"]:
            if name not in (fmt.LABELS, fmt.BOXES):  # those two are checked as they are read
                fmt.check_array(self.root, attrs, name)
        self.labels = read_small_array(self.root, attrs, fmt.LABELS).astype(np.int64, copy=False)
        if self.labels.shape != (self.samples,):
            raise fmt.StoreFormatError(
                f"store {str(self.root)!r}: labels hold {self.labels.shape[0]} entries, "
                f"expected {self.samples}")
        # (N, 4) top, left, height, width of each tile's picture; crops and framing stay inside it
        self.boxes = read_small_array(self.root, attrs, fmt.BOXES).astype(np.int64, copy=False)
        full = np.array([0, 0, self.tile, self.tile])
        self.padded = bool((self.boxes != full).any())  # some tile holds padding (pad fit, grid edges)
        self._shards: list[fmt.ShardFile | None] = [None] * attrs["shards"]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.samples

    @property
    def is_image_coded(self) -> bool:
        return self.codec.is_image_coded

    def _shard(self, shard: int) -> fmt.ShardFile:
        f = self._shards[shard]
        if f is None:
            with self._lock:
                f = self._shards[shard]
                if f is None:
                    f = fmt.ShardFile(self.root, shard, self.shard_size)
                    self._shards[shard] = f
        return f

    def _check(self, low: int, high: int) -> None:
        if low < 0 or high >= self.samples:
            bad = low if low < 0 else high
            raise IndexError(f"sample {bad} is out of range for {self.samples} samples")

    def payload(self, index: int) -> memoryview:
        """The encoded chunk of sample ``index`` (a view into the map), checksum verified."""
        self._check(index, index)
        return self._shard(index // self.shard_size).chunk(index % self.shard_size)

    def read_into(self, index: int, out: np.ndarray) -> np.ndarray:
        """Decode sample ``index`` into ``out`` (T, T, 3) uint8."""
        return self.codec.decode(self.payload(index), out=out)

    def read_batch_into(self, indices: list[int], out: np.ndarray) -> np.ndarray:
        """Decode samples ``indices`` into ``out[k]``: the loop of read_into, with the range check
        done once and the lookups hoisted out of it."""
        if indices:
            self._check(min(indices), max(indices))
        per_shard, shard_of, decode = self.shard_size, self._shard, self.codec.decode
        for k, index in enumerate(indices):
            decode(shard_of(index // per_shard).chunk(index % per_shard), out=out[k])
        return out

    def read(self, index: int) -> np.ndarray:
        return self.read_into(index, np.empty(self.codec.shape, dtype=np.uint8))

    def close(self) -> None:
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
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
