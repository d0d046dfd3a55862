"""Validated settings of a preprocessing run.

Every option with a fixed set of values is a ``StrEnum`` (``Mode``, ``Fit``, ``Resample``,
``Icc``, and the store's ``Codec``), parsed once by ``store.choices.choice`` in the records'
``__post_init__``, so the writer and the workers compare members, and a misspelt value fails
where it is given, naming the option and the values it takes.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Final

from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import MAX_SHARD_SIZE, TILE_SIDES, Codec, MaskKind
from tilefeed.store.host import available_memory, usable_cores


class Mode(StrEnum):
    """How a source image becomes tiles (``--mode``); a member equals its string.

    ``RESIZE``: one tile per image, the picture fitted to it as ``Fit`` says. ``GRID``: the
    picture cut into T x T windows every ``stride`` pixels, not resized (edge tiles padded with
    the background).
    """

    RESIZE = "resize"
    GRID = "grid"


class Fit(StrEnum):
    """How resize mode fits a picture to its square tile (``--fit``); a member equals its string.

    ``CROP``: the centre square (the short side) scaled to the tile. ``PAD``: the whole picture,
    its longer side the tile's, centred on the background, its box recorded. ``STRETCH``: the
    whole picture scaled to the tile, its aspect distorted.
    """

    CROP = "crop"
    PAD = "pad"
    STRETCH = "stretch"


class Resample(StrEnum):
    """The antialiased filter that resizes a picture to its tile (``--resample``); a member
    equals its string, and its name is that of PIL's ``Image.Resampling`` filter."""

    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


class Icc(StrEnum):
    """What becomes of an embedded ICC colour profile (``--icc``); a member equals its string.

    ``IGNORE``: the pixels as PIL's ``Image.convert('RGB')`` gives them, as a torchvision PIL
    pipeline sees them. ``SRGB``: the pixels converted from their profile to sRGB (littlecms).
    """

    IGNORE = "ignore"
    SRGB = "srgb"


# plain strings, for the command line's choices
MODES: Final = tuple(mode.value for mode in Mode)
FITS: Final = tuple(fit.value for fit in Fit)
RESAMPLERS: Final = tuple(resample.value for resample in Resample)
ICC: Final = tuple(icc.value for icc in Icc)
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
    except ``worker_memory``, which like the worker count says what the machine gives.

    Attributes
    ----------
    tile : int, default 256
        The tile side T, in pixels (``--tile``).
    mode : Mode or str, default "resize"
        One tile per image, or a grid of tiles (``--mode``); a ``Mode`` once made.
    fit : Fit or str, default "pad"
        How resize mode fits the picture to its tile (``--fit``); a ``Fit`` once made. The
        default keeps the whole picture, as torchvision's crops see it (``tilefeed bench aspect``).
    stride : int, default 0
        Grid mode: pixels between tile origins (``--stride``); 0 means the tile side (no overlap).
    resample : Resample or str, default "bicubic"
        The resize filter (``--resample``); a ``Resample`` once made.
    background : tuple of int, default (255, 255, 255)
        The RGB value under transparent pixels, pad borders and grid edges (``--background``).
    max_pixels : int, default DEFAULT_MAX_PIXELS
        Larger images are rejects (``--max-pixels``); Pillow's own bomb check follows it.
    icc : Icc or str, default "ignore"
        What becomes of an embedded colour profile (``--icc``); an ``Icc`` once made.
    worker_memory : int, default DEFAULT_WORKER_MEMORY
        The most memory one worker may hold to decode and convert one image, in bytes
        (``--worker-memory``); a larger image is a reject naming its size.
    """

    tile: int = 256
    mode: Mode = Mode.RESIZE
    fit: Fit = Fit.PAD
    stride: int = 0
    resample: Resample = Resample.BICUBIC
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = DEFAULT_MAX_PIXELS
    icc: Icc = Icc.IGNORE
    worker_memory: int = DEFAULT_WORKER_MEMORY

    def __post_init__(self) -> None:
        low, high = TILE_SIDES
        if not low <= self.tile <= high:
            raise ConfigError(f"tile must be in {low}..{high} pixels (--tile), got {self.tile}")
        object.__setattr__(self, "mode", choice(Mode, self.mode, "--mode"))
        object.__setattr__(self, "fit", choice(Fit, self.fit, "--fit"))
        object.__setattr__(self, "resample", choice(Resample, self.resample, "--resample"))
        if self.stride == 0:
            object.__setattr__(self, "stride", self.tile)
        if not 1 <= self.stride:
            raise ConfigError(f"--stride must be a positive number of pixels, got {self.stride}")
        if len(self.background) != 3 or not all(0 <= c <= 255 for c in self.background):
            raise ConfigError(f"--background must be three values in 0..255, got {self.background}")
        object.__setattr__(self, "background", tuple(int(c) for c in self.background))
        object.__setattr__(self, "icc", choice(Icc, self.icc, "--icc"))
        if self.max_pixels < 1:
            raise ConfigError(f"--max-pixels must be positive, got {self.max_pixels}")
        if self.worker_memory < MIN_WORKER_MEMORY:
            raise ConfigError(f"--worker-memory must be at least {size_text(MIN_WORKER_MEMORY)}, "
                              f"got {self.worker_memory} bytes")

    def identity(self) -> dict[str, Any]:
        """The fields a resumed run must match, as plain JSON values (each option's string,
        never its member): what the run's fingerprint hashes and the attributes' ``made``
        records."""
        d = asdict(self)
        del d["worker_memory"]
        d.update(mode=self.mode.value, fit=self.fit.value, resample=self.resample.value, icc=self.icc.value)
        return d


@dataclass(frozen=True)
class StoreSettings:
    """How tiles are stored.

    Attributes
    ----------
    codec : Codec or str, default "lz4"
        The tile codec (``--codec``); a ``Codec`` once made.
    quality : int, default 90
        JPEG quality, for ``codec`` "jpeg" (``--quality``).
    shard_size : int, default 1024
        Tiles per shard file (``--shard-size``).
    """

    codec: Codec = Codec.LZ4
    quality: int = 90
    shard_size: int = 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", choice(Codec, self.codec, "--codec"))
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"--quality must be in 1..100, got {self.quality}")
        if not 1 <= self.shard_size <= MAX_SHARD_SIZE:
            raise ConfigError(f"--shard-size must be in 1..{MAX_SHARD_SIZE} tiles, got {self.shard_size}")

    def identity(self) -> dict[str, Any]:
        """The fields as plain JSON values (the codec's name a str, never the enum member): what
        the run's fingerprint hashes and the attributes' ``made`` records."""
        d = asdict(self)
        d["codec"] = self.codec.value
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
    """The settings as the attributes' ``made`` records them: plain JSON values, without the
    fields this mode or codec has no use for (resize mode's stride, grid mode's fit, a lossless
    codec's quality)."""
    d = {**tiles.identity(), **store.identity()}
    d["background"] = list(tiles.background)
    if tiles.mode is Mode.RESIZE:
        del d["stride"]
    else:
        del d["fit"]
    if store.codec is not Codec.JPEG:
        del d["quality"]
    return d
