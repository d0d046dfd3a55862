"""Random erasing of a normalised batch on its device, each sample's rectangles a function of the sample.

torchvision v2's ``RandomErasing(p, scale, ratio, value)`` and timm's ``RandomErasing(probability,
min_area, max_area, min_aspect, max_aspect, mode, min_count, max_count)`` are one operation here
(``RandomErasing``; ``RandomErasing.from_timm`` takes timm's names): with probability ``p`` a
sample gets a number of boxes drawn uniformly from ``count`` (torchvision: always one), each of
area ``scale`` (a fraction of the image, uniform, shared out over the boxes as timm does) and
aspect ratio height/width log-uniform in ``ratio``; ten tries per box, a box that fits in none is
left out (both libraries do so). The box is filled with ``value``: a constant (per channel, in
the normalised units of the batch), standard normal noise per pixel (torchvision's ``'random'``,
timm's ``'pixel'``), or one standard normal value per channel and box (timm's ``'rand'``).

Determinism: every number of a sample's boxes comes from (seed, epoch, sample key) through
``pipeline.planning.counters.uniforms`` on a stream of its own (a seed derived from the Loader's seed:
the crop windows and flips keep their draws), and its noise from a ``torch.Generator`` on the
batch's device seeded from the same draws. A sample erased alone, in another batch, on another
rank or after a resume on another world size is erased exactly alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import torch

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.options import Layout
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError

TRIES = 10  # per box, as both torchvision and timm try
_HEAD = 3  # per sample: the coin, the count, the noise generator's seed
_PER_TRY = 4  # area, aspect, top, left
STREAM = "tilefeed.recipe.erasing"  # this operation's draw stream (planning.counters.stream_seed)
# the erasing stream: the Loader's seed mixed with a constant of its own, so its draws share


class Fill(StrEnum):
    """Random fills of an erased box (a constant fill is given as numbers instead).

    ``RANDOM``: standard normal noise per pixel and channel (torchvision's ``value='random'``,
    timm's ``mode='pixel'``). ``CHANNEL``: one standard normal value per channel and box
    (timm's ``mode='rand'``).
    """

    RANDOM = "random"
    CHANNEL = "channel"



@dataclass(frozen=True)
class Boxes:
    """The boxes a batch's samples get, one row per box, in the order they are filled.

    ``sample`` is the row of the batch, ``box`` the box's number within its sample; ``top``,
    ``left``, ``height`` and ``width`` are in pixels; ``noise_seed`` seeds the sample's noise.
    """

    sample: np.ndarray
    box: np.ndarray
    top: np.ndarray
    left: np.ndarray
    height: np.ndarray
    width: np.ndarray
    noise_seed: np.ndarray


def _pair(name: str, value: Sequence[float]) -> tuple[float, float]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise ConfigError(f"{name} must be a (min, max) pair, got {value!r}")
    lo, hi = (float(v) for v in value)
    if not lo <= hi:
        raise ConfigError(f"{name} must be (min, max) with min <= max, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class RandomErasing:
    """torchvision v2's ``RandomErasing``, per sample of a batch, drawn from the sample's key.

    Parameters
    ----------
    p
        Probability that a sample is erased at all.
    scale
        Range of the erased area as a fraction of the image (for ``count`` above one, of all
        the sample's boxes together, each box ``1 / count`` of it, as timm shares it out).
    ratio
        Range of the box's aspect ratio, height over width, drawn log-uniformly.
    value
        The fill: a number, one number per channel, ``'random'`` (per-pixel standard normal)
        or ``Fill.CHANNEL`` (one standard normal value per channel and box). Numbers are in the
        batch's normalised units, as torchvision takes them after ``Normalize``.
    count
        (min, max) number of boxes of an erased sample, drawn uniformly (timm's ``min_count``,
        ``max_count``); torchvision's is (1, 1).
    inplace
        Erase the given batch itself (timm always does) rather than a copy (torchvision's default).
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | tuple[float, ...] | Fill | str = 0.0  # a str names a Fill
    count: tuple[int, int] = (1, 1)
    inplace: bool = False
    _log_ratio: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # torchvision's checks (its warning for a reversed range is an error here: torch's
        # uniform_ refuses that range on the first call anyway)
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"p should be a floating point value in the interval [0.0, 1.0], got {self.p!r}")
        scale = _pair("scale", self.scale)
        if scale[0] < 0 or scale[1] > 1:
            raise ConfigError(f"scale should be between 0 and 1, got {self.scale!r}")
        ratio = _pair("ratio", self.ratio)
        if ratio[0] <= 0:
            raise ConfigError(f"ratio must be positive (it is drawn log-uniformly), got {self.ratio!r}")
        value = self.value
        if isinstance(value, str):
            try:
                value = Fill(value)
            except ValueError:
                raise ConfigError(f"value, if a string, should be 'random' or 'channel', "
                                  f"got {value!r}") from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(value, Sequence) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            value = tuple(float(v) for v in value)
        else:
            raise ConfigError(f"value should be a number, a sequence of numbers or 'random', got {value!r}")
        count = self.count
        if (not isinstance(count, Sequence) or len(count) != 2
                or not all(isinstance(c, int) and not isinstance(c, bool) for c in count)
                or not 1 <= count[0] <= count[1]):
            raise ConfigError(f"count must be (min, max) whole numbers with 1 <= min <= max, got {count!r}")
        object.__setattr__(self, "p", float(self.p))
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "count", (int(count[0]), int(count[1])))
        object.__setattr__(self, "_log_ratio", (math.log(ratio[0]), math.log(ratio[1])))

    @classmethod
    def from_timm(cls, probability: float = 0.5, min_area: float = 0.02, max_area: float = 1 / 3,
                  min_aspect: float = 0.3, max_aspect: float | None = None, mode: str = "const",
                  min_count: int = 1, max_count: int | None = None, num_splits: int = 0,
                  device: object = None) -> RandomErasing:
        """timm's ``RandomErasing`` with timm's parameters and defaults (it erases in place).

        ``mode``: ``'const'`` (or ``''``) fills with 0, ``'rand'`` with one normal value per
        channel and box, ``'pixel'`` with per-pixel noise. ``num_splits`` above one (leave
        the first split of an AugMix batch clean) is refused: which samples it spares depends
        on the batch, not on the sample. ``device`` is accepted for timm's signature: the
        noise is made on the batch's own device.
        """
        del device  # where the noise is made: always the batch's device here
        if num_splits > 1:
            raise ConfigError(f"num_splits={num_splits} (a clean AugMix split) is not supported: "
                              "erasing is per sample")
        fills: dict[str, float | Fill] = {"": 0.0, "const": 0.0, "rand": Fill.CHANNEL, "pixel": Fill.RANDOM}
        if not isinstance(mode, str) or mode.lower() not in fills:
            raise ConfigError(f"mode must be one of 'const', 'rand', 'pixel', got {mode!r}")
        if not min_aspect > 0:
            raise ConfigError(f"min_aspect must be positive, got {min_aspect!r}")
        return cls(p=probability, scale=(min_area, max_area), ratio=(min_aspect, max_aspect or 1 / min_aspect),
                   value=fills[mode.lower()], count=(min_count, max_count or min_count), inplace=True)

    @property
    def draws(self) -> int:
        """Uniform draws a sample takes from the erasing stream."""
        return _HEAD + self.count[1] * TRIES * _PER_TRY

    def boxes(self, keys: np.ndarray | torch.Tensor, seed: int, epoch: int, height: int, width: int) -> Boxes:
        """The boxes of samples ``keys`` in images of ``height`` x ``width``, for ``seed`` and ``epoch``.

        Per sample: the coin (erase when below ``p``), the count, then per box and try the
        area, the aspect, the top and the left, as torchvision and timm draw them: a box fits
        when it is smaller than the image both ways; the first try that fits is taken.
        """
        keys = np.asarray(keys.cpu() if isinstance(keys, torch.Tensor) else keys, dtype=np.int64).reshape(-1)
        n, most = len(keys), self.count[1]
        u = uniforms(stream_seed(seed, STREAM), epoch, keys, self.draws)
        erased = u[:, 0] < self.p
        low = self.count[0]
        count = low + np.minimum(np.floor(u[:, 1] * (most - low + 1)), most - low).astype(np.int64)
        noise_seed = np.floor(u[:, 2] * (1 << 53)).astype(np.int64)
        tries = u[:, _HEAD:].reshape(n, most, TRIES, _PER_TRY)
        area = float(height * width)
        target = (self.scale[0] + (self.scale[1] - self.scale[0]) * tries[..., 0]) * area / count[:, None, None]
        lo, hi = self._log_ratio
        aspect = np.exp(lo + (hi - lo) * tries[..., 1])
        # round half to even, like Python's round() in both libraries
        h = np.rint(np.sqrt(target * aspect))
        w = np.rint(np.sqrt(target / aspect))
        fits = (h < height) & (w < width)
        first = np.argmax(fits, axis=2)
        found = np.take_along_axis(fits, first[..., None], axis=2)[..., 0]
        pick = (np.arange(n)[:, None], np.arange(most)[None, :], first)
        bh, bw = h[pick], w[pick]
        top = np.floor(tries[..., 2][pick] * (height - bh + 1))
        left = np.floor(tries[..., 3][pick] * (width - bw + 1))
        used = erased[:, None] & found & (np.arange(most)[None, :] < count[:, None])
        sample, box = np.nonzero(used)
        return Boxes(sample, box, top[used].astype(np.int64), left[used].astype(np.int64),
                     bh[used].astype(np.int64), bw[used].astype(np.int64), noise_seed[sample])

    def erase(self, batch: torch.Tensor, keys: np.ndarray | torch.Tensor, seed: int, epoch: int,
              layout: Layout | str = Layout.NCHW) -> torch.Tensor:
        """Erase the samples of ``batch`` (keys ``keys``) for ``seed`` and ``epoch``.

        Parameters
        ----------
        batch
            Normalised images, float32, float16 or bfloat16, on any device; ``layout`` ``'NCHW'``
            or ``'channels_last'`` (shape N, C, H, W) or ``'NHWC'`` (shape N, H, W, C).
        keys
            One key per sample: what the sample's crop is drawn from (its index, or a mixture's
            position).
        seed, epoch
            The Loader's seed and the epoch.
        layout
            How ``batch`` is laid out; it is erased through an N, C, H, W view, never copied
            to another layout.

        Returns
        -------
        torch.Tensor
            ``batch`` itself when ``inplace``, else an erased copy, in the same layout.
        """
        if not batch.dtype.is_floating_point:
            raise ConfigError(f"random erasing needs a normalised float batch, got {batch.dtype}: "
                              "use dtype float32, float16 or bfloat16")
        if batch.ndim != 4:
            raise ConfigError("random erasing takes a batch of images (4 dimensions), "
                              f"got shape {tuple(batch.shape)}")
        layout = choice(Layout, layout, "layout")  # channels_last: NCHW-shaped, nothing to turn
        out = batch if self.inplace else batch.clone()  # clone keeps the strides: same layout
        view = out.permute(0, 3, 1, 2) if layout is Layout.NHWC else out
        n, channels, height, width = view.shape
        keys_np = np.asarray(keys.cpu() if isinstance(keys, torch.Tensor) else keys, dtype=np.int64).reshape(-1)
        if len(keys_np) != n:
            raise ConfigError(f"keys must hold one key per sample: {len(keys_np)} keys for {n} samples")
        if isinstance(self.value, tuple) and len(self.value) not in (1, channels):
            raise ConfigError(f"value must have 1 or {channels} numbers (the batch's channels), "
                              f"got {len(self.value)}")
        b = self.boxes(keys_np, seed, epoch, height, width)
        if not len(b.sample):
            return out
        constant = None
        if not isinstance(self.value, Fill):
            numbers = self.value if isinstance(self.value, tuple) else (self.value,)
            constant = torch.tensor(numbers, dtype=torch.float32).to(device=view.device,
                                                                     dtype=view.dtype)[:, None, None]
        generator = None if constant is not None else torch.Generator(device=view.device)
        last = -1
        for i, top, left, h, w, noise in zip(b.sample.tolist(), b.top.tolist(), b.left.tolist(),
                                             b.height.tolist(), b.width.tolist(), b.noise_seed.tolist(),
                                             strict=True):
            region = view[i, :, top:top + h, left:left + w]
            if constant is not None:
                region.copy_(constant.expand_as(region))
                continue
            assert generator is not None
            if i != last:  # one generator stream per sample, its boxes drawn in order
                generator.manual_seed(noise)
                last = i
            # float32 noise then the batch's dtype, as torchvision makes it: the same values
            # at every precision
            shape = (channels, h, w) if self.value is Fill.RANDOM else (channels, 1, 1)
            values = torch.randn(shape, generator=generator, device=view.device, dtype=torch.float32)
            region.copy_(values.to(view.dtype).expand_as(region))
        return out
