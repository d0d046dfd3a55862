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
    from tilefeed.pipeline.recipe.recipe import ColorJitter, Crop, Interpolation, PhotometricDistort, Recipe
    from tilefeed.pipeline.recipe.batch_mix import MixStyle
    from tilefeed.pipeline.recipe.erasing import Fill
    from tilefeed.pipeline.recipe.solarize import RandomSolarize
    from tilefeed.pipeline.recipe.policy_tables import Family, Policy, PolicyInterpolation, Table
    from tilefeed.pipeline.recipe.adapters import timm_options, torchvision_options
    from tilefeed.pipeline.recipe.open_clip_adapter import open_clip_options
    from tilefeed.pipeline.options import Layout, Shuffle, Targets, TargetsLayout
    from tilefeed.pipeline.planning.sizes import ramp
    from tilefeed.pipeline.loader.coco import dataset_samples, torchvision_detection_loader
    from tilefeed.pipeline.targets.geometry import Framing
    from tilefeed.pipeline.targets.mapping import boxes_to_source, map_boxes, source_to_output
    from tilefeed.bench.fixtures.coco import make_coco_folder
    from tilefeed.bench.fixtures.generated import make_image_folder
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
    from tilefeed.preprocess.settings import (Fit, Icc, Mode, Resample, StoreSettings, TargetOptions,
                                              TileSettings)
    from tilefeed.preprocess.sources.scanning import PairOptions, SourceKind, SourceOptions
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
    "MixStyle": ("tilefeed.pipeline.recipe.batch_mix", "MixStyle"),
    "Crop": ("tilefeed.pipeline.recipe.recipe", "Crop"),
    "Fill": ("tilefeed.pipeline.recipe.erasing", "Fill"),
    "RandomSolarize": ("tilefeed.pipeline.recipe.solarize", "RandomSolarize"),
    **{name: ("tilefeed.pipeline.recipe.policy_tables", name)
       for name in ("Family", "Policy", "PolicyInterpolation", "Table")},
    **{name: ("tilefeed.pipeline.options", name) for name in ("Layout", "Shuffle", "Targets", "TargetsLayout")},
    "ramp": ("tilefeed.pipeline.planning.sizes", "ramp"),
    # a training script's flags as Loader options, and torchvision's detection reference's loaders
    "timm_options": ("tilefeed.pipeline.recipe.adapters", "timm_options"),
    "torchvision_options": ("tilefeed.pipeline.recipe.adapters", "torchvision_options"),
    "open_clip_options": ("tilefeed.pipeline.recipe.open_clip_adapter", "open_clip_options"),
    "dataset_samples": ("tilefeed.pipeline.loader.coco", "dataset_samples"),
    "torchvision_detection_loader": ("tilefeed.pipeline.loader.coco", "torchvision_detection_loader"),
    # boxes between a batch's pixels and the source image's
    "Framing": ("tilefeed.pipeline.targets.geometry", "Framing"),
    **{name: ("tilefeed.pipeline.targets.mapping", name)
       for name in ("boxes_to_source", "map_boxes", "source_to_output")},
    # generated data to try things on: class folders of photo-like images, a COCO-format set
    "make_image_folder": ("tilefeed.bench.fixtures.generated", "make_image_folder"),
    "make_coco_folder": ("tilefeed.bench.fixtures.coco", "make_coco_folder"),
    "StoreSettings": ("tilefeed.preprocess.settings", "StoreSettings"),
    **{name: ("tilefeed.preprocess.settings", name) for name in ("Fit", "Icc", "Mode", "Resample")},
    "TileSettings": ("tilefeed.preprocess.settings", "TileSettings"),
    "TargetOptions": ("tilefeed.preprocess.settings", "TargetOptions"),
    **{name: ("tilefeed.preprocess.sources.scanning", name)
       for name in ("PairOptions", "SourceKind", "SourceOptions")},
    "preprocess_images": ("tilefeed.preprocess.writer", "preprocess"),
    "Summary": ("tilefeed.preprocess.writer", "Summary"),
    **{name: ("tilefeed.store.errors", name) for name in (
        "ConfigError", "CorruptChunkError", "DaliMissingError", "SourceError", "StoreExistsError",
        "StoreFormatError", "StoreWriteError", "TilefeedError")},
}

__all__ = [
    "AutoAugment", "BatchMix", "ColorJitter", "ConfigError", "CorruptChunkError", "Crop", "DaliMissingError",
    "Family", "Fill", "Fit", "Framing", "Icc", "Interpolation", "Layout", "Loader", "Mix", "MixStyle", "Mode",
    "PairOptions", "PhotometricDistort", "Policy", "PolicyInterpolation", "RandomErasing", "RandomSolarize",
    "Recipe", "Resample", "RunResult", "Shuffle", "SourceError", "SourceKind", "SourceOptions",
    "StoreExistsError", "StoreFormatError", "StoreReader", "StoreSettings", "StoreWriteError", "Summary",
    "Table", "TargetOptions", "Targets", "TargetsLayout", "TileDataset", "TileSettings", "TilefeedError",
    "boxes_to_source", "dataset_samples", "make_coco_folder", "make_image_folder", "map_boxes", "measure",
    "open_clip_options", "preprocess_images", "ramp", "source_to_output", "timm_options",
    "torchvision_detection_loader", "torchvision_options", "watch", "__version__",
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
