"""tilefeed: pre-tiled Zarr v3 image shards, a DALI loader that feeds the GPU, and a stall bench.

One import name for the three parts (``tilefeed.preprocess``, ``tilefeed.pipeline``,
``tilefeed.bench``) and the public API below, every name loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tilefeed.bench.harness.watch import RunResult, measure, watch
    from tilefeed.pipeline.reading.dataset import TileDataset
    from tilefeed.pipeline.loader.loader import Loader
    from tilefeed.pipeline.mixing.mix import Mix
    from tilefeed.pipeline.reading.reader import StoreReader
    from tilefeed.pipeline.recipe.batch_mix import BatchMix
    from tilefeed.pipeline.recipe.erasing import RandomErasing
    from tilefeed.pipeline.recipe.policies import AutoAugment
    from tilefeed.pipeline.recipe.recipe import ColorJitter, Interpolation, PhotometricDistort, Recipe
    from tilefeed.store.errors import (
        ConfigError,
        CorruptChunkError,
        DaliMissingError,
        SourceError,
        StoreExistsError,
        StoreFormatError,
        StoreWriteError,
        TilefeedError,
    )
    from tilefeed.preprocess.settings import StoreSettings, TargetOptions, TileSettings
    from tilefeed.preprocess.sources.scanning import SourceOptions
    from tilefeed.preprocess.writer import Summary, preprocess as preprocess_images

__version__: str  # the installed distribution's, looked up on first use (importlib.metadata is slow to load)

# public name -> (module, attribute): each loads on first use, so ``import tilefeed`` (every
# command, every spawned or Dask worker) costs no torch, zarr, DALI or numpy
_PUBLIC = {
    "RunResult": ("tilefeed.bench.harness.watch", "RunResult"),
    "measure": ("tilefeed.bench.harness.watch", "measure"),
    "watch": ("tilefeed.bench.harness.watch", "watch"),
    "TileDataset": ("tilefeed.pipeline.reading.dataset", "TileDataset"),
    "Loader": ("tilefeed.pipeline.loader.loader", "Loader"),
    "Mix": ("tilefeed.pipeline.mixing.mix", "Mix"),
    "StoreReader": ("tilefeed.pipeline.reading.reader", "StoreReader"),
    "Recipe": ("tilefeed.pipeline.recipe.recipe", "Recipe"),
    "ColorJitter": ("tilefeed.pipeline.recipe.recipe", "ColorJitter"),
    "Interpolation": ("tilefeed.pipeline.recipe.recipe", "Interpolation"),
    "PhotometricDistort": ("tilefeed.pipeline.recipe.recipe", "PhotometricDistort"),
    "AutoAugment": ("tilefeed.pipeline.recipe.policies", "AutoAugment"),
    "RandomErasing": ("tilefeed.pipeline.recipe.erasing", "RandomErasing"),
    "BatchMix": ("tilefeed.pipeline.recipe.batch_mix", "BatchMix"),
    "StoreSettings": ("tilefeed.preprocess.settings", "StoreSettings"),
    "TileSettings": ("tilefeed.preprocess.settings", "TileSettings"),
    "TargetOptions": ("tilefeed.preprocess.settings", "TargetOptions"),
    "SourceOptions": ("tilefeed.preprocess.sources.scanning", "SourceOptions"),
    "preprocess_images": ("tilefeed.preprocess.writer", "preprocess"),
    "Summary": ("tilefeed.preprocess.writer", "Summary"),
    **{name: ("tilefeed.store.errors", name) for name in (
        "ConfigError", "CorruptChunkError", "DaliMissingError", "SourceError", "StoreExistsError",
        "StoreFormatError", "StoreWriteError", "TilefeedError")},
}

__all__ = [
    "AutoAugment", "BatchMix", "ColorJitter", "ConfigError", "CorruptChunkError", "DaliMissingError",
    "Interpolation", "Loader", "Mix", "PhotometricDistort",
    "RandomErasing", "Recipe", "RunResult", "SourceError",
    "SourceOptions", "StoreExistsError", "StoreFormatError", "StoreReader", "StoreSettings",
    "StoreWriteError", "Summary", "TargetOptions", "TileDataset", "TileSettings", "TilefeedError",
    "__version__", "measure", "preprocess_images", "watch",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib import metadata

        version = globals()["__version__"] = metadata.version("tilefeed")
        return version
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'tilefeed' has no attribute {name!r}")
    return getattr(import_module(where[0]), where[1])
