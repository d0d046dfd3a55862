"""Feed a tilefeed store to training: a DALI ``Loader`` and a torch ``TileDataset``.

``Loader`` loads on first use, so ``TileDataset`` and ``StoreReader`` never load DALI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tilefeed.pipeline.dataset import TileDataset
from tilefeed.pipeline.reader import StoreReader
from tilefeed.preprocess.errors import ConfigError, CorruptChunkError, StoreFormatError

if TYPE_CHECKING:
    from tilefeed.pipeline.loader import Loader

__all__ = ["ConfigError", "CorruptChunkError", "Loader", "StoreFormatError", "StoreReader", "TileDataset"]


def __getattr__(name: str) -> Any:
    if name == "Loader":
        from tilefeed.pipeline.loader import Loader

        return Loader
    raise AttributeError(f"module 'tilefeed.pipeline' has no attribute {name!r}")
