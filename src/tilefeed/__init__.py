"""tilefeed: pre-tiled Zarr v3 image shards, a DALI loader that feeds the GPU, and a stall bench.

One import name for the three parts (``tilefeed.preprocess``, ``tilefeed.pipeline``,
``tilefeed.bench``) and the public API below. ``Loader`` loads lazily, so ``import tilefeed``
and the DALI-free parts (``TileDataset``, ``StoreReader``) never load DALI.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from tilefeed.bench.harness import RunResult, measure, watch
from tilefeed.pipeline.dataset import TileDataset
from tilefeed.pipeline.reader import StoreReader
from tilefeed.preprocess.errors import (
    ConfigError,
    CorruptChunkError,
    DaliMissingError,
    SourceError,
    StoreExistsError,
    StoreFormatError,
    StoreWriteError,
    TilefeedError,
)
from tilefeed.preprocess.settings import StoreSettings, TileSettings
from tilefeed.preprocess.sources import SourceOptions

if TYPE_CHECKING:
    from tilefeed.pipeline.loader import Loader
    from tilefeed.preprocess.writer import Summary, preprocess as preprocess_images

__version__ = metadata.version("tilefeed")

__all__ = [
    "ConfigError", "CorruptChunkError", "DaliMissingError", "Loader", "RunResult", "SourceError",
    "SourceOptions", "StoreExistsError", "StoreFormatError", "StoreReader", "StoreSettings",
    "StoreWriteError", "Summary", "TileDataset", "TileSettings", "TilefeedError", "__version__",
    "measure", "preprocess_images", "watch",
]


def __getattr__(name: str) -> Any:
    if name == "Loader":
        from tilefeed.pipeline.loader import Loader

        return Loader
    if name in ("preprocess_images", "Summary"):
        from tilefeed.preprocess import writer

        return writer.preprocess if name == "preprocess_images" else writer.Summary
    raise AttributeError(f"module 'tilefeed' has no attribute {name!r}")
