"""torchvision v2's ``RandomSolarize`` as a recipe operation: ``Recipe(solarize=RandomSolarize(...))``.

Each sample is solarized (every channel value at or above ``threshold`` inverted, ``255 - x``)
with probability ``p``, drawn on the host from (seed, epoch, key) on a stream of its own, so
every other draw stays as it was. The sample's draw travels as one per-sample input, its
threshold (``NEVER`` where it is not solarized): the graph applies DALI's solarize to it, the
host path PIL's ``ImageOps.solarize``, torchvision's own kernel for PIL pictures. Solarizing
moves no pixel: boxes and masks are left as they are.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.store.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

STREAM = "tilefeed.recipe.solarize"  # the solarize draw stream (planning.counters.stream_seed)
INPUT = "solarize"  # the per-sample threshold the graph and the host kernels read
NEVER: Final = 256.0  # a threshold no uint8 value reaches: the sample is left as it is


@dataclass(frozen=True)
class RandomSolarize:
    """torchvision v2's ``RandomSolarize(threshold, p)`` on uint8 pixels.

    Parameters
    ----------
    threshold : float
        Values at or above it are inverted (torchvision's ``threshold``, in 0..255 for uint8
        images; above 255 is refused, as torchvision refuses it).
    p : float, default 0.5
        Probability that a sample is solarized.
    """

    threshold: float
    p: float = 0.5

    def __post_init__(self) -> None:
        for name, value, high in (("threshold", self.threshold, 255.0), ("p", self.p, 1.0)):
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= float(value) <= high:
                raise ConfigError(f"RandomSolarize {name} must be a number in [0, {high:g}], got {value!r}")
            object.__setattr__(self, name, float(value))


class Solarize:
    """The solarize operation of a recipe (``recipe.pixel_ops``' contract)."""

    field = "solarize"  # the Recipe field that holds its settings
    inputs: Mapping[str, np.dtype] = MappingProxyType({INPUT: np.dtype(np.float32)})

    def draw(self, settings: RandomSolarize, seed: int, epoch: int, keys: np.ndarray) -> dict[str, np.ndarray]:
        """Each sample's threshold: ``settings.threshold`` where its uniform falls below ``p``
        (``torch.rand(1) < p``), else ``NEVER``."""
        u = uniforms(stream_seed(seed, STREAM), epoch, np.asarray(keys), 1)[:, 0]
        return {INPUT: np.where(u < settings.p, settings.threshold, NEVER).astype(np.float32)}

    def graph(self, images: Any, inputs: Mapping[str, Any], settings: RandomSolarize) -> Any:
        """DALI's solarize of uint8 HWC ``images`` at each sample's threshold."""
        from nvidia.dali.auto_aug import augmentations

        return augmentations.solarize.op(images, inputs[INPUT])

    def host(self, image: Image.Image, inputs: Mapping[str, Any], settings: RandomSolarize) -> Image.Image:
        """PIL's solarize of one RGB picture at the sample's threshold."""
        from PIL import ImageOps

        threshold = float(inputs[INPUT])
        # PIL compares each value with the threshold: a float works, as torchvision passes it one
        return image if threshold >= NEVER else ImageOps.solarize(image, threshold)  # type: ignore[arg-type]
