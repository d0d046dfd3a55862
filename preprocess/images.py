"""One source image -> RGB uint8 tiles, or a one-line reason it cannot be used.

Everything a worker does per image lives here: open, size check, JPEG draft (DCT scaling),
EXIF orientation, conversion of every PIL mode to RGB (colour-managed where asked), and the
resize or grid cut. Any exception on the way makes the image a reject: Pillow's plugins raise
dozens of types on malformed input, so no closed list of them can be complete.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from tilefeed.preprocess.plugins import register_plugins
from tilefeed.preprocess.settings import TileSettings
from tilefeed.preprocess.storage import is_url, read_object

register_plugins()


@dataclass(frozen=True)
class Tiles:
    pixels: np.ndarray  # (n, T, T, 3) uint8
    rows: np.ndarray  # (n,) int32, grid row of each tile (0 in resize mode)
    cols: np.ndarray  # (n,) int32
    boxes: np.ndarray  # (n, 4) int32: top, left, height, width of the picture in each tile


class Rejected(Exception):
    """A source image that cannot enter the store; str() is the one-line reason."""


def load_tiles(path: str, settings: TileSettings) -> Tiles:
    """Decode ``path`` and cut it into tiles; raises Rejected with the reason on any bad input."""
    source: str | io.BytesIO = path
    try:
        if is_url(path):
            source = io.BytesIO(read_object(path))
            size = len(source.getbuffer())
        else:
            size = os.stat(path).st_size
    except FileNotFoundError:
        raise Rejected("missing: file not found") from None
    except OSError as e:
        raise Rejected(f"unreadable: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - anything reading one input fails with: this input only
        raise Rejected(f"unreadable: {type(e).__name__}: {_one_line(e)}") from None
    if size == 0:
        raise Rejected("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's per-file warnings become reasons or are noise
            with Image.open(source) as im:
                rgb = _to_rgb(_open_checked(im, settings), settings)
            if settings.mode == "grid":
                return _grid(rgb, settings)
            tile, box = _fit(rgb, settings)
    except Rejected:
        raise
    except UnidentifiedImageError:
        raise Rejected("not an image: no decoder recognises the file") from None
    except PermissionError as e:
        raise Rejected(f"unreadable: {e.strerror}") from None
    except Image.DecompressionBombError as e:
        raise Rejected(f"too large: {_one_line(e)}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        # how PIL itself reports truncated and corrupt streams
        raise Rejected(f"corrupt or truncated: {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - any other failure of any plugin: this image only
        raise Rejected(f"{type(e).__name__}: {_one_line(e)}") from None
    zero = np.zeros(1, dtype=np.int32)
    return Tiles(np.asarray(tile, dtype=np.uint8)[None], zero, zero, np.array([box], dtype=np.int32))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


def _open_checked(im: Image.Image, settings: TileSettings) -> Image.Image:
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
    if settings.mode == "resize" and im.format == "JPEG":
        # DCT scaling: libjpeg decodes at 1/2, 1/4 or 1/8 scale while both sides stay >= T,
        # which is enough for every fit mode and far cheaper than a full decode.
        im.draft("RGB", (settings.tile, settings.tile))
    im.load()
    if "exif" not in im.info and im.format != "TIFF":
        return im  # no orientation to apply; parsing EXIF costs ~5% of a small JPEG's decode
    return ImageOps.exif_transpose(im) or im


def _to_rgb(im: Image.Image, settings: TileSettings) -> Image.Image:
    mode = im.mode
    if settings.icc == "srgb" and im.info.get("icc_profile") and mode in ("RGB", "RGBA", "CMYK", "L"):
        im = _profile_to_srgb(im)
        mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in im.info):
        return _composite(im.convert("RGBA"), settings.background)
    if mode in ("L", "1", "P", "CMYK", "YCbCr", "HSV"):
        return im.convert("RGB")
    if mode.startswith("I") or mode == "F":
        return _wide_to_rgb(im)
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


def _wide_to_rgb(im: Image.Image) -> Image.Image:
    """16/32-bit integer and float greyscale -> 8-bit RGB without clipping.

    Integer data is taken as 16-bit (scaled by 255/65535) when it fits in 16 bits, which is what
    16-bit PNG and TIFF hold; floats in [0, 1] are scaled by 255; anything else is min-max scaled.
    """
    a = np.asarray(im)
    if a.ndim == 3:
        a = a[..., 0]
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(a.min()), float(a.max())
    if im.mode == "F" and lo >= 0.0 and hi <= 1.0:
        scaled = a * 255.0
    elif im.mode != "F" and lo >= 0 and hi <= 65535:
        scaled = a * (255.0 / 65535.0)
    else:
        scaled = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
    grey = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    return Image.fromarray(np.repeat(grey[..., None], 3, axis=2), "RGB")


def _fit(im: Image.Image, settings: TileSettings) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """The tile and the box (top, left, height, width) the picture fills in it."""
    t = settings.tile
    w, h = im.size
    resample = settings.resample_filter
    if settings.fit == "stretch":
        return im.resize((t, t), resample), (0, 0, t, t)
    if settings.fit == "crop":
        # Scale the short side to T and take the centre, in one resize over the source box.
        side = min(w, h)
        left, top = (w - side) / 2, (h - side) / 2
        return im.resize((t, t), resample, box=(left, top, left + side, top + side)), (0, 0, t, t)
    # pad: the whole picture, its longer side T, centred on the background
    scale = t / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    canvas = Image.new("RGB", (t, t), settings.background)
    top, left = (t - nh) // 2, (t - nw) // 2
    canvas.paste(im.resize((nw, nh), resample), (left, top))
    return canvas, (top, left, nh, nw)


def grid_positions(length: int, tile: int, stride: int) -> list[int]:
    """Tile origins along one axis: every ``stride`` pixels until the image is covered."""
    count = 1 if length <= tile else math.ceil((length - tile) / stride) + 1
    return [i * stride for i in range(count)]


def _grid(im: Image.Image, settings: TileSettings) -> Tiles:
    t = settings.tile
    a = np.asarray(im, dtype=np.uint8)
    h, w = a.shape[:2]
    ys, xs = grid_positions(h, t, settings.stride), grid_positions(w, t, settings.stride)
    n = len(ys) * len(xs)
    tiles = np.empty((n, t, t, 3), dtype=np.uint8)
    tiles[...] = np.asarray(settings.background, dtype=np.uint8)  # edge tiles are padded
    rows = np.repeat(np.arange(len(ys), dtype=np.int32), len(xs))
    cols = np.tile(np.arange(len(xs), dtype=np.int32), len(ys))
    boxes = np.zeros((n, 4), dtype=np.int32)
    for k, (r, c) in enumerate(zip(rows, cols, strict=True)):
        patch = a[ys[r] : ys[r] + t, xs[c] : xs[c] + t]
        tiles[k, : patch.shape[0], : patch.shape[1]] = patch
        boxes[k] = (0, 0, patch.shape[0], patch.shape[1])  # edge tiles: the rest is padding
    return Tiles(tiles, rows, cols, boxes)
