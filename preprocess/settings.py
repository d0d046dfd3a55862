"""Validated settings of a preprocessing run."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Final

from PIL import Image

from tilefeed.preprocess.errors import ConfigError
from tilefeed.preprocess.format import CODECS

MODES: Final = ("resize", "grid")
FITS: Final = ("crop", "pad", "stretch")
ICC: Final = ("ignore", "srgb")
RESAMPLERS: Final = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
DEFAULT_MAX_PIXELS: Final = 178_956_970  # PIL's own decompression-bomb error threshold


@dataclass(frozen=True)
class TileSettings:
    """How each source image becomes tiles. Part of the store's identity: a resume must match."""

    tile: int = 256  # the tile side T, in pixels
    mode: str = "resize"
    fit: str = "pad"  # the whole picture, as torchvision's crops see it (tilefeed bench aspect)
    stride: int = 0  # grid mode; 0 means the tile size (no overlap)
    resample: str = "bicubic"
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = DEFAULT_MAX_PIXELS
    icc: str = "ignore"  # embedded colour profiles: ignore (as Image.convert) or convert to sRGB

    def __post_init__(self) -> None:
        if not 8 <= self.tile <= 8192:
            raise ConfigError(f"--size must be in 8..8192 pixels, got {self.tile}")
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.fit not in FITS:
            raise ConfigError(f"--fit must be one of {', '.join(FITS)}, got {self.fit!r}")
        if self.resample not in RESAMPLERS:
            raise ConfigError(
                f"--resample must be one of {', '.join(RESAMPLERS)}, got {self.resample!r}"
            )
        if self.stride == 0:
            object.__setattr__(self, "stride", self.tile)
        if not 1 <= self.stride:
            raise ConfigError(f"--stride must be a positive number of pixels, got {self.stride}")
        if len(self.background) != 3 or not all(0 <= c <= 255 for c in self.background):
            raise ConfigError(f"--background must be three values in 0..255, got {self.background}")
        object.__setattr__(self, "background", tuple(int(c) for c in self.background))
        if self.icc not in ICC:
            raise ConfigError(f"--icc must be one of {', '.join(ICC)}, got {self.icc!r}")
        if self.max_pixels < 1:
            raise ConfigError(f"--max-pixels must be positive, got {self.max_pixels}")

    @property
    def resample_filter(self) -> Image.Resampling:
        return RESAMPLERS[self.resample]


@dataclass(frozen=True)
class StoreSettings:
    """How tiles are stored."""

    codec: str = "lz4"
    quality: int = 90
    shard_size: int = 1024  # tiles per shard

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ConfigError(f"--codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"--quality must be in 1..100, got {self.quality}")
        if not 1 <= self.shard_size <= 1_000_000:
            raise ConfigError(f"--shard-size must be in 1..1000000 tiles, got {self.shard_size}")


def usable_cores() -> int:
    """The cores this process may run on (its affinity), the one count every default uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def describe(tiles: TileSettings, store: StoreSettings) -> dict[str, Any]:
    d = {**asdict(tiles), **asdict(store)}
    d["background"] = list(tiles.background)
    if tiles.mode == "resize":
        del d["stride"]
    else:
        del d["fit"]
    if store.codec != "jpeg":
        del d["quality"]
    return d
