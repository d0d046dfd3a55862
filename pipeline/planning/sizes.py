"""Output size as a function of the epoch: progressive resizing (FFCV's ImageNet recipes train
at low resolution first, then raise it).

A schedule is any ``epoch -> int`` callable; ``ramp`` is FFCV's. The Loader asks it once per
epoch, when the epoch starts (or is read ahead), so the size is fixed for a whole epoch and a
resumed run asks the same schedule for the same epochs. The size reaches the graph as a
per-sample input, so no size needs a graph of its own.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilefeed.store.errors import ConfigError

MIN_SIZE, MAX_SIZE = 8, 8192
Schedule = Callable[[int], int]


def check_size(value: Any, name: str = "size") -> int:
    """``value`` as an output side in pixels, else a ConfigError naming ``name``."""
    try:
        side = operator.index(value)
    except TypeError:
        side = None
    if side is None or isinstance(value, bool) or not MIN_SIZE <= side <= MAX_SIZE:
        raise ConfigError(f"{name} must be an int in {MIN_SIZE}..{MAX_SIZE}, got {value!r}")
    return side


@dataclass(frozen=True)
class Ramp:
    """FFCV's ``get_resolution``: ``min_res`` up to epoch ``start_ramp``, ``max_res`` from
    ``end_ramp`` on, and in between the straight line rounded to a multiple of ``step``
    (kept within ``min_res..max_res``)."""

    start_ramp: int
    end_ramp: int
    min_res: int
    max_res: int
    step: int = 32

    def __call__(self, epoch: int) -> int:
        if epoch <= self.start_ramp:
            return self.min_res
        if epoch >= self.end_ramp:
            return self.max_res
        along = (epoch - self.start_ramp) / (self.end_ramp - self.start_ramp)
        side = int(round((self.min_res + along * (self.max_res - self.min_res)) / self.step)) * self.step
        # kept inside the ramp's ends when they are not multiples of step: largest stays true
        return min(max(side, self.min_res), self.max_res)

    @property
    def largest(self) -> int:
        """The largest size the ramp asks for: what buffers are sized for up front."""
        return self.max_res


def ramp(start_ramp: int, end_ramp: int, min_res: int, max_res: int, step: int = 32) -> Ramp:
    """A schedule for ``Loader(size=...)``, as FFCV's ResNet-50 recipe uses it, e.g.
    ``ramp(start_ramp=11, end_ramp=13, min_res=160, max_res=192)`` over 16 epochs."""
    lo, hi = check_size(min_res, "min_res"), check_size(max_res, "max_res")
    if lo > hi:
        raise ConfigError(f"min_res must not exceed max_res, got {lo} > {hi}")
    start, end = operator.index(start_ramp), operator.index(end_ramp)
    if start > end:
        raise ConfigError(f"start_ramp must not come after end_ramp, got {start} > {end}")
    if operator.index(step) < 1:
        raise ConfigError(f"step must be a positive int, got {step!r}")
    return Ramp(start, end, lo, hi, step)
