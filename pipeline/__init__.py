"""Feed a tilefeed store to training: a DALI ``Loader`` and a torch ``TileDataset``.

Each name loads on first use: ``TileDataset`` and ``StoreReader`` never load DALI.
"""

from __future__ import annotations

if __name__ != "tilefeed.pipeline":  # the repository's folder imported as itself, from a checkout's root
    raise ImportError(f"import tilefeed.pipeline, not {__name__}: the same module under two names would be "
                      "two modules (two graph pools, two caches)")

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tilefeed.pipeline.reading.dataset import TileDataset
    from tilefeed.pipeline.loader.loader import Loader
    from tilefeed.pipeline.mixing.mix import Mix
    from tilefeed.pipeline.reading.reader import StoreReader
    from tilefeed.store.errors import ConfigError, CorruptChunkError, StoreFormatError

_PUBLIC = {
    "TileDataset": "tilefeed.pipeline.reading.dataset", "Loader": "tilefeed.pipeline.loader.loader",
    "Mix": "tilefeed.pipeline.mixing.mix",
    "StoreReader": "tilefeed.pipeline.reading.reader", "ConfigError": "tilefeed.store.errors",
    "CorruptChunkError": "tilefeed.store.errors", "StoreFormatError": "tilefeed.store.errors",
}
__all__ = ["ConfigError", "CorruptChunkError", "Loader", "Mix", "StoreFormatError", "StoreReader",
           "TileDataset"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tilefeed.pipeline' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
