"""What the Loader's engine reads: ``Reader``, the one contract of a store's reader.

``StoreReader`` (``reading.reader``) reads one store; ``MixedReader`` (``reading.mixed``) reads
several as one, by global ids. The batch source, the graph, the targets and the stats read either
through this contract alone, so nothing above the readers asks which one it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from tilefeed.pipeline.reading.mixed import MixedArray
    from tilefeed.pipeline.reading.mixed_targets import MixedTargets
    from tilefeed.store.codec import TileCodec
    from tilefeed.store.targets import StoreTargets


class CacheCounts(Protocol):
    """A bucket's shard cache, as ``stats()`` reports it."""

    @property
    def counts(self) -> dict[str, int]:
        """Shards fetched, hit, waited for and evicted, by name."""


class Remote(Protocol):
    """The part of a bucket store the Loader reads beside its tiles: its shard cache."""

    @property
    def cache(self) -> CacheCounts:
        """The shards fetched ahead of the epoch into the cache folder."""


class Reader(Protocol):
    """A store's reader, one store or a mixture of several: its samples' labels, picture boxes
    and targets, its tiles' bytes and pixels, and what reading them costs."""

    @property
    def tile(self) -> int:
        """The side of every tile, in pixels."""

    @property
    def codec(self) -> TileCodec:
        """How every tile is coded (a mixture's stores decode with one codec)."""

    @property
    def shard_size(self) -> int:
        """Samples per shard (a mixture's smallest)."""

    @property
    def padded(self) -> bool:
        """Some tile holds padding around its picture."""

    @property
    def location(self) -> str:
        """Where the store is, for messages."""

    @property
    def labels(self) -> np.ndarray | MixedArray:
        """(N,) int64 class ids."""

    @property
    def boxes(self) -> np.ndarray | MixedArray:
        """(N, 4) each tile's picture: top, left, height, width."""

    @property
    def targets(self) -> StoreTargets | MixedTargets | None:
        """The samples' boxes, frames and masks; None for a store made without targets."""

    @property
    def remote(self) -> Remote | None:
        """The bucket's cache where a store is in object storage; None for local stores."""

    @property
    def is_image_coded(self) -> bool:
        """Tiles are image files (JPEG), decoded rather than decompressed."""

    def __len__(self) -> int:
        """Samples."""

    def will_read(self, indices: np.ndarray) -> None:
        """Start fetching the shards of ``indices`` (a bucket store), in that order."""

    def payloads(self, indices: Sequence[int]) -> list[memoryview]:
        """The stored bytes of each tile."""

    def read_batch_into(self, indices: list[int], out: np.ndarray, fast_idct: bool = False) -> np.ndarray:
        """Tiles decoded into ``out`` (n, tile, tile, 3) uint8."""

    def read_into(self, index: int, out: np.ndarray) -> np.ndarray:
        """One tile decoded into ``out``."""

    def read(self, index: int) -> np.ndarray:
        """One tile, decoded."""

    def stored_nbytes(self, indices: np.ndarray) -> int:
        """Bytes the tiles of ``indices`` take in the store."""

    def close(self) -> None:
        """Release every map and thread."""
