"""The recipe's pixel operations added one module each: ``PixelOperation``, and their registry.

An operation here is one object that names the ``Recipe`` field holding its settings, declares
the per-sample inputs it sends (names and dtypes), draws them on the host from (seed, epoch,
key) on a stream of its own, and applies them: in the graph (``graph``, DALI; both shapes) and on
the host path (``host``, PIL). The graph and the host kernels apply the registered operations
after the recipe's others, in ``PIXEL_OPERATIONS``' order; ``Recipe.identity`` leaves out a
registered operation that is off. A new one is its module and one line of ``PIXEL_OPERATIONS``
(and its field on ``Recipe``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tilefeed.pipeline.recipe.solarize import Solarize

if TYPE_CHECKING:
    from PIL import Image


class PixelOperation(Protocol):
    """One pixel operation of a recipe, on the uint8 pixels after the resize."""

    field: str  # the Recipe field holding its settings (None: off)
    inputs: Mapping[str, np.dtype]  # its per-sample inputs and their dtypes

    def draw(self, settings: Any, seed: int, epoch: int, keys: np.ndarray) -> dict[str, np.ndarray]:
        """Its inputs for the samples of ``keys`` in ``epoch``."""

    def graph(self, images: Any, inputs: Mapping[str, Any], settings: Any) -> Any:
        """It applied to uint8 HWC ``images`` in the DALI graph."""

    def host(self, image: Image.Image, inputs: Mapping[str, Any], settings: Any) -> Image.Image:
        """It applied to one RGB picture, with the sample's own values of its inputs."""


PIXEL_OPERATIONS: tuple[PixelOperation, ...] = (Solarize(),)
