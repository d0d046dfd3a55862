"""One source image -> RGB uint8 tiles, or a one-line reason it cannot be used.

Everything a worker does per image lives here: open, size check, JPEG draft (DCT scaling),
EXIF orientation, conversion of every PIL mode to RGB (colour-managed where asked), and the
resize or grid cut. Any exception on the way makes the image a reject: Pillow's plugins raise
dozens of types on malformed input, so no closed list of them can be complete.

Memory is bounded per image: after the header is read (and a JPEG's DCT scale chosen), the
most the decode and conversion would hold at once is estimated from the size and mode, and an
image over ``TileSettings.worker_memory`` is a reject naming both. Greyscale stays one byte a
pixel until the tile (widened to RGB there), 16-bit and float pictures are scaled to 8 bits in
strips (no whole-image float copy), and each intermediate picture is let go as soon as the
next exists. ``--max-pixels`` is the one pixel limit: Pillow's own bomb check follows it.

A 13000 x 13000 16-bit PNG (under the default --max-pixels) decodes in a worker that stays
under the bound ``tests/preprocess/test_hostile_inputs.py`` holds it to; converting the whole picture
through float copies, as a plain NumPy conversion would, needs several times the picture.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tilefeed.preprocess.plugins import register_plugins
from tilefeed.preprocess.settings import Fit, Icc, Mode, Resample, TileSettings, size_text
from tilefeed.store.errors import one_line
from tilefeed.store.object_storage import read_object
from tilefeed.store.storage import is_url, redact


STRIP_BYTES = 8 << 20  # float64 working set of one strip of a 16-bit or float picture
WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
RESAMPLING = {r: Image.Resampling[r.name] for r in Resample}  # --resample's filters, by name


@dataclass(frozen=True)
class Placement:
    """Where a tile takes its pixels from: the source box ``box`` (x, y, width, height, in
    source pixels) resized to ``size`` (width, height) with its top left corner at ``at`` (x, y)
    in the tile. Resize mode: the fit's; grid mode: the tile's own window of the picture, not
    resized (``size`` is the window's, ``at`` is (0, 0)). The same geometry moves the picture's
    boxes and masks."""

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    at: tuple[int, int]

    @property
    def frame(self) -> tuple[float, float, float, float]:
        """(sx, sy, tx, ty): tile_x = source_x * sx + tx, tile_y = source_y * sy + ty."""
        x, y, w, h = self.box
        sx, sy = self.size[0] / w, self.size[1] / h
        return sx, sy, self.at[0] - x * sx, self.at[1] - y * sy


@dataclass(frozen=True)
class Tiles:
    pixels: np.ndarray  # (n, T, T, 3) uint8
    rows: np.ndarray  # (n,) int32, grid row of each tile (0 in resize mode)
    cols: np.ndarray  # (n,) int32
    boxes: np.ndarray  # (n, 4) int32: top, left, height, width of the picture in each tile
    size: tuple[int, int] = (0, 0)  # the source picture's width and height as decoded
    placements: tuple[Placement, ...] = ()  # each tile's: where its part of the picture went in it


class Rejected(Exception):
    """A source image that cannot enter the store; str() is the one-line reason."""


def load_tiles(path: str, settings: TileSettings, exact: bool = False, data: bytes | None = None) -> Tiles:
    """Decode ``path`` and cut it into tiles; raises Rejected with the reason on any bad input.

    ``exact`` (an image with targets): decoded at full size, without JPEG DCT scaling (which
    rounds an odd side up, so its pixels no longer map exactly onto the annotations'), and
    without its EXIF orientation: annotations are made in the stored pixels' coordinates, as
    pycocotools and torchvision's ``CocoDetection`` read them. ``data``: the image's bytes,
    already read (a tar member, a parquet row); ``path`` then only names it, and the bytes go
    through the same checks a file's do."""
    register_plugins()  # once per process, on first use: importing changes nothing of PIL's
    source: str | io.BytesIO = path
    try:
        if data is not None:
            source = io.BytesIO(data)
            size = len(data)
        elif is_url(path):
            source = io.BytesIO(read_object(path))
            size = len(source.getbuffer())
        else:
            size = os.stat(path).st_size
    except FileNotFoundError:
        raise Rejected("missing: file not found") from None
    except OSError as e:
        raise Rejected(redact(f"unreadable: {e.strerror or one_line(e)}")) from None
    except Exception as e:  # noqa: BLE001 - anything reading one input fails with: this input only
        raise Rejected(redact(f"unreadable: {type(e).__name__}: {one_line(e)}")) from None
    if size == 0:
        raise Rejected("empty file (0 bytes)")
    try:
        with warnings.catch_warnings(), _pillow_limit(settings.max_pixels):
            warnings.simplefilter("ignore")  # PIL's per-file warnings become reasons or are noise
            # each step rebinds ``im``, so the picture before it is freed as soon as it is done
            im: Image.Image = Image.open(source)
            if im.format == "PNG":
                _check_png_checksums(source)
            im = _open_checked(im, settings, exact)
            im = _to_rgb(im, settings)
            if settings.mode is Mode.GRID:
                return _grid(im, settings)
            picture = im.size
            tile, box, where = _fit(im, settings)
            del im
    except Rejected:
        raise
    except UnidentifiedImageError:
        raise Rejected("not an image: no decoder recognises the file") from None
    except PermissionError as e:
        raise Rejected(f"unreadable: {e.strerror}") from None
    except Image.DecompressionBombError as e:
        raise Rejected(f"too large: over --max-pixels {settings.max_pixels} ({one_line(e)})") from None
    except MemoryError:
        raise Rejected("too large: out of memory while decoding; "
                       "lower --processes or --worker-memory") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        # how PIL itself reports truncated and corrupt streams
        raise Rejected(f"corrupt or truncated: {one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - any other failure of any plugin: this image only
        raise Rejected(f"{type(e).__name__}: {one_line(e)}") from None
    zero = np.zeros(1, dtype=np.int32)
    return Tiles(np.asarray(tile, dtype=np.uint8)[None], zero, zero, np.array([box], dtype=np.int32),
                 picture, (where,))


def _check_png_checksums(source: str | io.BytesIO) -> None:
    """Pillow decodes a PNG's image data without checking its chunks' CRCs, so a damaged chunk
    can decode as other pixels without an error: its ``verify()`` checks every CRC (a second,
    cheap pass over the file, on a handle of its own) and raises on the first bad one."""
    again = io.BytesIO(source.getbuffer()) if isinstance(source, io.BytesIO) else source
    with Image.open(again) as png:
        png.verify()


@contextmanager
def _pillow_limit(max_pixels: int) -> Iterator[None]:
    """Pillow's decompression-bomb check set by --max-pixels (it refuses at twice its limit,
    after this module's own check at the limit), whatever Pillow's default is."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _pixel_bytes(mode: str) -> int:
    """Bytes a pixel of ``mode`` takes in Pillow's memory (2- to 4-band pictures take 4)."""
    if mode in ("1", "L", "P"):
        return 1
    return 2 if mode.startswith("I;16") else 4


def peak_bytes(width: int, height: int, mode: str, settings: TileSettings, *, turned: bool = True) -> int:
    """About the most memory decoding and converting a ``width`` x ``height`` picture in
    ``mode`` holds at once: the decoded picture, a turned copy (EXIF orientation, when
    ``turned``), what the conversion to RGB holds beside it, and the tiles of grid mode."""
    px = width * height
    decoded = px * _pixel_bytes(mode)
    if mode in ("RGB", "L"):
        conversion = 0
    elif mode == "1":
        conversion = px
    elif mode in WIDE_MODES:
        conversion = px + 2 * STRIP_BYTES
    elif mode in ALPHA_MODES or mode == "P":  # RGBA copy, RGB canvas and the alpha band
        conversion = 9 * px
    else:
        conversion = 4 * px
    if settings.icc is Icc.SRGB:
        conversion += 8 * px  # the profile's output, and an RGB copy of an RGBA picture
    tiles = 0
    if settings.mode is Mode.GRID:
        t, stride = settings.tile, settings.stride
        tiles = len(grid_positions(height, t, stride)) * len(grid_positions(width, t, stride)) * t * t * 3
    return decoded * (2 if turned else 1) + conversion + tiles


def _open_checked(im: Image.Image, settings: TileSettings, exact: bool = False) -> Image.Image:
    width, height = im.size
    if width * height > settings.max_pixels:
        raise Rejected(
            f"too large: {width}x{height} = {width * height} pixels exceeds "
            f"--max-pixels {settings.max_pixels}"
        )
    if width < 1 or height < 1:
        raise Rejected(f"corrupt: image size {width}x{height}")
    if getattr(im, "n_frames", 1) > 1:
        im.seek(0)  # animations: the first frame
    if settings.mode is Mode.RESIZE and im.format == "JPEG" and not exact:
        # DCT scaling: libjpeg decodes at 1/2, 1/4 or 1/8 scale while both sides stay >= T,
        # which is enough for every fit mode and far cheaper than a full decode.
        im.draft("RGB", (settings.tile, settings.tile))
    oriented = ("exif" in im.info or im.format == "TIFF") and not exact
    need = peak_bytes(*im.size, im.mode, settings, turned=oriented)
    if need > settings.worker_memory and oriented:
        # the orientation may be the plain one, which needs no turned copy
        oriented = im.getexif().get(0x0112, 1) not in (0, 1)
        need = peak_bytes(*im.size, im.mode, settings, turned=oriented)
    if need > settings.worker_memory:
        raise Rejected(
            f"too large: {width}x{height} pixels ({im.mode}) need about {size_text(need)} to decode "
            f"and convert, over --worker-memory {size_text(settings.worker_memory)}"
        )
    im.load()
    if exact or "exif" not in im.info and im.format != "TIFF":
        return im  # no orientation to apply: EXIF is not parsed at all
    return ImageOps.exif_transpose(im) or im


def _to_rgb(im: Image.Image, settings: TileSettings) -> Image.Image:
    """RGB, or L for a greyscale picture (``_fit`` and ``_grid`` widen its tiles to RGB)."""
    mode = im.mode
    if settings.icc is Icc.SRGB and im.info.get("icc_profile") and mode in ("RGB", "RGBA", "CMYK", "L"):
        im = _profile_to_srgb(im)
        mode = im.mode
    if mode in ("RGB", "L"):
        return im
    if mode in ALPHA_MODES or (mode == "P" and "transparency" in im.info):
        return _composite(im.convert("RGBA"), settings.background)
    if mode == "1":
        return im.convert("L")
    if mode in ("P", "CMYK", "YCbCr", "HSV"):
        return im.convert("RGB")
    if mode.startswith("I") or mode == "F":
        return _wide_to_grey(im)
    if mode == "LAB":
        return _lab_to_rgb(im)
    raise Rejected(f"unsupported: PIL mode {mode}")


def _lab_to_rgb(im: Image.Image) -> Image.Image:
    """CIE L*a*b* -> sRGB through littlecms, as upstream Pillow's ImageCms does."""
    from PIL import ImageCms

    lab = ImageCms.createProfile("LAB")
    srgb = ImageCms.createProfile("sRGB")
    rgb = ImageCms.profileToProfile(im, lab, srgb, outputMode="RGB")
    if rgb is None:
        raise Rejected("unsupported: LAB conversion failed")
    return rgb


def _profile_to_srgb(im: Image.Image) -> Image.Image:
    """Pixels in their embedded ICC profile -> sRGB (``--icc srgb``), alpha kept aside."""
    from PIL import ImageCms

    source = ImageCms.ImageCmsProfile(io.BytesIO(im.info["icc_profile"]))
    srgb = ImageCms.createProfile("sRGB")
    alpha = im.getchannel("A") if im.mode == "RGBA" else None
    base = im.convert("RGB") if im.mode == "RGBA" else im
    rgb = ImageCms.profileToProfile(base, source, srgb, outputMode="RGB")
    if rgb is None:
        raise Rejected("unsupported: ICC conversion failed")
    if alpha is not None:
        rgb.putalpha(alpha)
    return rgb


def _composite(rgba: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    canvas = Image.new("RGB", rgba.size, background)
    canvas.paste(rgba, mask=rgba.getchannel("A"))
    return canvas


def _strips(im: Image.Image) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, pixels) of horizontal strips of a one-band picture, a few MB each."""
    width, height = im.size
    rows = max(1, STRIP_BYTES // (8 * width))
    for y in range(0, height, rows):
        a = np.asarray(im.crop((0, y, width, min(height, y + rows))))
        yield y, (a[..., 0] if a.ndim == 3 else a)


def _wide_to_grey(im: Image.Image) -> Image.Image:
    """16/32-bit integer and float greyscale -> 8-bit greyscale without clipping, strip by strip.

    Integer data is taken as 16-bit (scaled by 255/65535) when it fits in 16 bits, which is what
    16-bit PNG and TIFF hold; floats in [0, 1] are scaled by 255; anything else is min-max scaled.
    NaN and infinities count as 0.
    """
    is_float = im.mode == "F"
    lo, hi, odd = math.inf, -math.inf, False
    for _, a in _strips(im):  # the value range first: it decides the scale
        if is_float:
            finite = np.isfinite(a)
            if not finite.all():
                odd = True
                a = a[finite]
        if a.size:
            lo, hi = min(lo, float(a.min())), max(hi, float(a.max()))
    if odd:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if is_float and lo >= 0.0 and hi <= 1.0:
        offset, scale = 0.0, 255.0
    elif not is_float and lo >= 0 and hi <= 65535:
        offset, scale = 0.0, 255.0 / 65535.0
    elif hi > lo:
        offset, scale = lo, 255.0 / (hi - lo)
    else:
        offset, scale = 0.0, 0.0
    width, height = im.size
    grey = np.empty((height, width), dtype=np.uint8)
    for y, a in _strips(im):
        f = a.astype(np.float64)
        if odd:
            np.nan_to_num(f, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        if offset:
            f -= offset
        f *= scale
        np.rint(f, out=f)
        np.clip(f, 0, 255, out=f)
        grey[y : y + len(f)] = f
    return Image.fromarray(grey, "L")


def _rgb(im: Image.Image) -> Image.Image:
    return im if im.mode == "RGB" else im.convert("RGB")


def placement(width: int, height: int, settings: TileSettings) -> Placement:
    """Where resize mode's fit puts a ``width`` x ``height`` picture in its tile: stretch, the
    whole picture onto the tile; crop, the centre square (the short side) onto the tile; pad,
    the whole picture, its longer side T, centred (its other side rounded to whole pixels)."""
    t, w, h = settings.tile, width, height
    if settings.fit is Fit.STRETCH:
        return Placement((0.0, 0.0, float(w), float(h)), (t, t), (0, 0))
    if settings.fit is Fit.CROP:
        side = min(w, h)
        return Placement(((w - side) / 2, (h - side) / 2, float(side), float(side)), (t, t), (0, 0))
    scale = t / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    return Placement((0.0, 0.0, float(w), float(h)), (nw, nh), ((t - nw) // 2, (t - nh) // 2))


def _fit(im: Image.Image, settings: TileSettings) -> tuple[Image.Image, tuple[int, int, int, int], Placement]:
    """The tile, the box (top, left, height, width) the picture fills in it, and its placement."""
    t = settings.tile
    resample = RESAMPLING[settings.resample]
    where = placement(*im.size, settings)
    x, y, w, h = where.box
    if settings.fit in (Fit.STRETCH, Fit.CROP):
        # crop: the short side scaled to T and the centre taken, in one resize over the source box
        box = None if settings.fit is Fit.STRETCH else (x, y, x + w, y + h)
        return _rgb(im.resize((t, t), resample, box=box)), (0, 0, t, t), where
    # pad: the whole picture, its longer side T, centred on the background
    (nw, nh), (left, top) = where.size, where.at
    canvas = Image.new("RGB", (t, t), settings.background)
    canvas.paste(_rgb(im.resize((nw, nh), resample)), (left, top))
    return canvas, (top, left, nh, nw), where


def grid_positions(length: int, tile: int, stride: int) -> list[int]:
    """Tile origins along one axis: every ``stride`` pixels until the image is covered, each
    inside the image (a stride over the tile side leaves gaps, never a tile of padding alone)."""
    count = 1 if length <= tile else min(math.ceil((length - tile) / stride) + 1, math.ceil(length / stride))
    return [i * stride for i in range(count)]


def _grid(im: Image.Image, settings: TileSettings) -> Tiles:
    """Every tile of the grid, read from the picture one row of tiles at a time."""
    t = settings.tile
    w, h = im.size
    ys, xs = grid_positions(h, t, settings.stride), grid_positions(w, t, settings.stride)
    n = len(ys) * len(xs)
    tiles = np.empty((n, t, t, 3), dtype=np.uint8)
    tiles[...] = np.asarray(settings.background, dtype=np.uint8)  # edge tiles are padded
    rows = np.repeat(np.arange(len(ys), dtype=np.int32), len(xs))
    cols = np.tile(np.arange(len(xs), dtype=np.int32), len(ys))
    boxes = np.zeros((n, 4), dtype=np.int32)
    placements: list[Placement] = []
    for r, y in enumerate(ys):
        strip = np.asarray(im.crop((0, y, w, min(h, y + t))), dtype=np.uint8)
        if strip.ndim == 2:  # greyscale: widened here, a tile row at a time
            strip = strip[..., None]
        for c, x in enumerate(xs):
            k = r * len(xs) + c
            patch = strip[:, x : x + t]
            tiles[k, : patch.shape[0], : patch.shape[1]] = patch
            boxes[k] = (0, 0, patch.shape[0], patch.shape[1])  # edge tiles: the rest is padding
            # the window at (x, y), not resized: its frame is a shift by whole pixels
            ph, pw = patch.shape[:2]
            placements.append(Placement((float(x), float(y), float(pw), float(ph)), (pw, ph), (0, 0)))
    return Tiles(tiles, rows, cols, boxes, (w, h), tuple(placements))
