"""What the Loader does to each tile, as settings: no DALI here, so the torch-side tools (the
PIL baseline, TileDataset users) import it without loading DALI."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD

if TYPE_CHECKING:
    from tilefeed.pipeline.recipe.recipe import Recipe



@dataclass(frozen=True)
class Augment:
    """What the graph does to each tile, whatever the output size.

    The size is not here: it may change from epoch to epoch (``pipeline.planning.sizes``), reaches the
    graph as a per-sample input, and so never calls for another graph. ``windows`` (always when
    training): the crop window and flip of each sample arrive as per-sample inputs computed on
    the host (``pipeline.engine.crops``, inside each tile's picture box); the graph cuts, resizes,
    flips and normalises. Evaluation of a store whose tiles are whole pictures uses fixed ops
    instead: torchvision's framing (resize to ``size / crop_pct``, centre-crop ``size``).
    A ``recipe`` (``pipeline.recipe``) adds per-sample inputs: the resize filter, and when
    training the flips and pixel operations, applied to the uint8 pixels after the resize.
    """

    train: bool
    tile: int
    normalize: bool  # False for uint8 output: pixels pass through unscaled
    half: bool  # float16 output straight from DALI
    channels_first: bool
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_pct: float = 0.875
    windows: bool = False  # per-sample crop windows (training, or tiles with padding)
    fast_idct: bool = False  # JPEG tiles on the CPU: libjpeg-turbo's fast integer IDCT
    scaled_decode: bool = True  # JPEG tiles on the CPU: decoded at 1/2, 1/4 or 1/8 where that suffices
    recipe: Recipe | None = None  # filter, flips and pixel operations (None: bilinear, hflip 0.5, no more)

    def resize_to(self, size: int) -> int:
        """Evaluation: the side the tile is resized to before the centre crop to ``size``."""
        return self.tile if size == self.tile else math.floor(size / self.crop_pct + 1e-9)

    @property
    def passthrough(self) -> bool:
        """uint8 NHWC eval output: the (resized) tiles as they are, with no per-pixel op."""
        return not (self.windows or self.normalize or self.channels_first)

    def stored_tiles(self, size: int) -> bool:
        """The output at ``size`` is the stored tiles themselves: uint8 NHWC at the tile's size."""
        return self.passthrough and size == self.tile
