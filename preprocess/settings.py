"""Validated settings of a preprocessing run."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Final

from tilefeed.store.errors import ConfigError
from tilefeed.store.format import CODECS, MAX_SHARD_SIZE, TILE_SIDES, Codec, MaskKind
from tilefeed.store.host import available_memory, usable_cores

MODES: Final = ("resize", "grid")
FITS: Final = ("crop", "pad", "stretch")
ICC: Final = ("ignore", "srgb")
RESAMPLERS: Final = ("bilinear", "bicubic", "lanczos")  # antialiased; images.py maps each to PIL's filter
DEFAULT_MAX_PIXELS: Final = 178_956_970  # PIL's own decompression-bomb error threshold
# What one worker may hold to decode and convert one image: a 16-bit 13000 x 13000 PNG needs
# about 0.5 GB, an RGBA picture at the default --max-pixels about 1.6 GB.
DEFAULT_WORKER_MEMORY: Final = 2 << 30
MIN_WORKER_MEMORY: Final = 16 << 20
# A COCO annotations file is parsed whole in the driver, which takes several times its size in
# memory (full COCO train2017's 450 MB takes several GB): larger files are refused unread.
DEFAULT_MAX_ANNOTATIONS: Final = 1 << 30
_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class TileSettings:
    """How each source image becomes tiles. Part of the store's identity (a resume must match),
    except ``worker_memory``, which like the worker count says what the machine gives: the most
    memory one worker may hold to decode and convert one image (bytes); a larger image is a
    reject naming its size."""

    tile: int = 256  # the tile side T, in pixels
    mode: str = "resize"
    fit: str = "pad"  # the whole picture, as torchvision's crops see it (tilefeed bench aspect)
    stride: int = 0  # grid mode; 0 means the tile size (no overlap)
    resample: str = "bicubic"
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = DEFAULT_MAX_PIXELS
    icc: str = "ignore"  # embedded colour profiles: ignore (as Image.convert) or convert to sRGB
    worker_memory: int = DEFAULT_WORKER_MEMORY

    def __post_init__(self) -> None:
        low, high = TILE_SIDES
        if not low <= self.tile <= high:
            raise ConfigError(f"tile must be in {low}..{high} pixels (--tile), got {self.tile}")
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
        if self.worker_memory < MIN_WORKER_MEMORY:
            raise ConfigError(f"--worker-memory must be at least {size_text(MIN_WORKER_MEMORY)}, "
                              f"got {self.worker_memory} bytes")

    def identity(self) -> dict[str, Any]:
        """The fields a resumed run must match."""
        d = asdict(self)
        del d["worker_memory"]
        return d


@dataclass(frozen=True)
class StoreSettings:
    """How tiles are stored. ``codec`` may be given as a string; it is a ``Codec`` once made."""

    codec: Codec | str = Codec.LZ4
    quality: int = 90
    shard_size: int = 1024  # tiles per shard

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ConfigError(f"--codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        object.__setattr__(self, "codec", Codec(self.codec))
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"--quality must be in 1..100, got {self.quality}")
        if not 1 <= self.shard_size <= MAX_SHARD_SIZE:
            raise ConfigError(f"--shard-size must be in 1..{MAX_SHARD_SIZE} tiles, got {self.shard_size}")

    @property
    def codec_name(self) -> Codec:
        """``codec`` typed as the ``Codec`` it is once made."""
        return Codec(self.codec)

    def identity(self) -> dict[str, Any]:
        """The fields as plain JSON values (the codec's name a str, never the enum member): what
        the run's fingerprint hashes and the attributes' ``made`` records."""
        d = asdict(self)
        d["codec"] = self.codec_name.value
        return d


class TargetKind(StrEnum):
    """Where a store's targets come from: ``COCO``, an instances JSON (``--annotations``);
    ``YOLO``, ``labels/*.txt`` beside ``images/`` (``--yolo``); ``SEMANTIC``, a PNG of class
    ids per image (``--masks DIR``)."""

    COCO = "coco"
    YOLO = "yolo"
    SEMANTIC = "semantic"


@dataclass(frozen=True)
class TargetOptions:
    """The targets read beside the images (detection and segmentation): one source of boxes,
    or semantic masks, or a COCO file's boxes with a semantic mask per image.

    Attributes
    ----------
    annotations : str or None
        A COCO instances JSON: SRC is the image folder its ``file_name`` entries are relative
        to; boxes, category ids and crowd flags are stored.
    instance_masks : bool
        With ``annotations``: each object's polygons or RLE stored as an instance mask too.
    yolo : bool
        SRC holds ``images/`` and ``labels/`` (YOLO text labels, boxes only), and the class
        names in ``data.yaml`` or ``classes.txt``.
    masks : str or None
        A folder of semantic masks: for SRC's ``a/b.jpg``, ``MASKS/a/b.png`` of class ids. With
        ``annotations``, a semantic mask per image beside its boxes, its ids the file's
        category ids.
    max_annotations_size : int
        The largest ``annotations`` file read, in bytes (``--max-annotations-size``): the file
        is parsed whole, which takes several times its size in memory, so a larger one is
        refused before it is read. Not part of the store's identity.
    """

    annotations: str | None = None
    instance_masks: bool = False
    yolo: bool = False
    masks: str | None = None
    max_annotations_size: int = DEFAULT_MAX_ANNOTATIONS

    def __post_init__(self) -> None:
        # --annotations and --masks go together: the file's boxes, and masks of its category ids
        if self.yolo and (self.annotations is not None or self.masks is not None):
            other = "--annotations" if self.annotations is not None else "--masks"
            raise ConfigError(f"--yolo and {other}: a store takes its targets from one source")
        if self.instance_masks and self.masks is not None:
            raise ConfigError("--instance-masks and --masks: a store holds one kind of mask, instance or "
                              "semantic")
        if self.max_annotations_size < 1:
            raise ConfigError("--max-annotations-size must be a positive size, got "
                              f"{self.max_annotations_size}")
        if self.instance_masks and self.annotations is None:
            raise ConfigError("--instance-masks reads a COCO file's segmentations: give --annotations FILE")
        if self.instance_masks and importlib.util.find_spec("pycocotools") is None:
            raise ConfigError("--instance-masks decodes polygons and RLE with pycocotools, which is not "
                              "installed: pip install 'tilefeed[coco]'")

    @property
    def kind(self) -> TargetKind | None:
        """Which source, or None when no targets are read."""
        if self.annotations is not None:
            return TargetKind.COCO
        if self.yolo:
            return TargetKind.YOLO
        return TargetKind.SEMANTIC if self.masks is not None else None

    @property
    def mask_kind(self) -> MaskKind | None:
        """The masks the store will hold."""
        if self.masks is not None:
            return MaskKind.SEMANTIC
        return MaskKind.INSTANCE if self.instance_masks else None



def default_workers(worker_memory: int) -> int:
    """Worker processes for a run: every usable core, but no more than the available memory
    holds at ``worker_memory`` each (at least one)."""
    cores = usable_cores()
    free = available_memory()
    return cores if free is None else max(1, min(cores, free // worker_memory))


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5G' or a number of bytes -> bytes (K, M, G, T are powers of 1024)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _UNITS and value[-1:] else ""
    try:
        return int(float(value[: len(value) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise ConfigError(f"expected a size such as 2G, 512M or a number of bytes, got {text!r}") from None


def size_text(nbytes: int) -> str:
    """Bytes as a short size: '2.0 GiB', '512 MiB', '4.0 KiB', '900 bytes'."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.0f} MiB"
    return f"{nbytes / (1 << 10):.1f} KiB" if nbytes >= 1 << 10 else f"{nbytes} bytes"


def describe(tiles: TileSettings, store: StoreSettings) -> dict[str, Any]:
    d = {**tiles.identity(), **store.identity()}
    d["background"] = list(tiles.background)
    if tiles.mode == "resize":
        del d["stride"]
    else:
        del d["fit"]
    if store.codec_name is not Codec.JPEG:
        del d["quality"]
    return d
