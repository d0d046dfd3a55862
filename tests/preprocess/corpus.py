"""A corpus of every image format Pillow writes, in its variants, with the pixels each must give.

Each entry is written from a known RGB picture; ``expected`` is what a correct decoder returns
(after the conversion to RGB that the entry's mode implies), and ``lossy`` says whether the
comparison allows codec error. The broken variants of each file are made by ``damaged``.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageCms

from tilefeed.preprocess.plugins import register_plugins
from tests.helpers import photo

register_plugins()

SIDE = 48


@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes
    expected: np.ndarray  # (SIDE, SIDE, 3) uint8
    lossy: bool


def _save(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _grey(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L").convert("RGB"))


def _interlaced_png(rgb: np.ndarray) -> bytes:
    """An Adam7-interlaced 8-bit RGB PNG: Pillow reads these but cannot write them."""
    h, w = rgb.shape[:2]
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = rgb[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


T = Image.Transpose
# EXIF orientation -> the transpose that turns an upright picture into the stored pixels (the
# inverse of what the viewer applies)
ORIENTATIONS = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE,
                6: T.ROTATE_90, 7: T.TRANSVERSE, 8: T.ROTATE_270}


def _oriented(im: Image.Image, orientation: int) -> Sample:
    exif = Image.Exif()
    exif[274] = orientation
    stored = im.transpose(ORIENTATIONS[orientation])
    data = _save(stored, "JPEG", quality=95, subsampling="4:4:4", exif=exif)
    return Sample(f"jpeg-exif-{orientation}", data, np.asarray(im), True)


def build() -> list[Sample]:
    rgb = np.asarray(photo(11, SIDE, SIDE))
    im = Image.fromarray(rgb)
    grey = _grey(rgb)
    palette = im.quantize(64)
    pal_rgb = np.asarray(palette.convert("RGB"))
    one_bit = im.convert("1")
    one_rgb = np.asarray(one_bit.convert("RGB"))
    wide = Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257)
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    rgba[:8, :, 3] = 0  # transparent band: composited over white
    over_white = rgb.copy()
    over_white[:8] = 255
    cmyk = im.convert("CMYK")
    cmyk_rgb = np.asarray(cmyk.convert("RGB"))
    to_lab = ImageCms.buildTransform(ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB"),
                                     "RGB", "LAB")
    lab = ImageCms.applyTransform(im, to_lab)
    assert lab is not None
    frames = [im, Image.fromarray(255 - rgb)]

    s: list[Sample] = [
        Sample("jpeg-baseline-444", _save(im, "JPEG", quality=95, subsampling="4:4:4"), rgb, True),
        Sample("jpeg-420", _save(im, "JPEG", quality=95, subsampling="4:2:0"), rgb, True),
        Sample("jpeg-progressive", _save(im, "JPEG", quality=95, progressive=True), rgb, True),
        Sample("jpeg-cmyk", _save(cmyk, "JPEG", quality=95), cmyk_rgb, True),
        Sample("jpeg-grey", _save(im.convert("L"), "JPEG", quality=95), grey, True),
        *(_oriented(im, o) for o in ORIENTATIONS),
        Sample("png-rgb", _save(im, "PNG"), rgb, False),
        Sample("png-1bit", _save(one_bit, "PNG"), one_rgb, False),
        Sample("png-grey", _save(im.convert("L"), "PNG"), grey, False),
        Sample("png-16bit", _save(wide, "PNG"), grey, False),
        Sample("png-palette", _save(palette, "PNG"), pal_rgb, False),
        Sample("png-alpha", _save(Image.fromarray(rgba, "RGBA"), "PNG"), over_white, False),
        Sample("png-interlaced", _interlaced_png(rgb), rgb, False),
        Sample("gif", _save(palette, "GIF"), pal_rgb, False),
        Sample("gif-animated", _save(palette, "GIF", save_all=True,
                                     append_images=[Image.fromarray(255 - rgb).quantize(64)]),
               pal_rgb, False),
        Sample("webp-lossless", _save(im, "WEBP", lossless=True), rgb, False),
        Sample("webp-lossy", _save(im, "WEBP", quality=95), rgb, True),
        Sample("webp-animated", _save(frames[0], "WEBP", lossless=True, save_all=True,
                                      append_images=frames[1:]), rgb, False),
        *(Sample(f"tiff-{c}", _save(im, "TIFF", compression=c), rgb, c in ("jpeg", "webp"))
          for c in ("raw", "tiff_lzw", "tiff_deflate", "tiff_adobe_deflate", "packbits", "jpeg", "webp")),
        Sample("tiff-group4", _save(one_bit, "TIFF", compression="group4"), one_rgb, False),
        Sample("tiff-cmyk", _save(cmyk, "TIFF"), cmyk_rgb, False),
        Sample("tiff-lab", _save(lab, "TIFF"), rgb, True),
        Sample("tiff-16bit", _save(wide, "TIFF"), grey, False),
        Sample("bmp", _save(im, "BMP"), rgb, False),
        Sample("tga", _save(im, "TGA"), rgb, False),
        Sample("tga-rle", _save(im, "TGA", compression="tga_rle"), rgb, False),
        Sample("ppm", _save(im, "PPM"), rgb, False),
        Sample("pgm", _save(im.convert("L"), "PPM"), grey, False),
        Sample("ico", _save(im, "ICO", sizes=[(SIDE, SIDE)]), rgb, False),
        Sample("jpeg2000", _save(im, "JPEG2000"), rgb, False),
        Sample("jpeg2000-lossy", _save(im, "JPEG2000", quality_mode="rates", quality_layers=[4],
                                       irreversible=True), rgb, True),
        Sample("avif", _save(im, "AVIF", quality=95), rgb, True),
        Sample("heic", _save(im, "HEIF", quality=95), rgb, True),
        Sample("pcx", _save(im, "PCX"), rgb, False),
        Sample("sgi", _save(im, "SGI"), rgb, False),
        Sample("qoi", _save(im, "QOI"), rgb, False),
        Sample("dds", _save(im, "DDS"), rgb, False),
        Sample("im", _save(im, "IM"), rgb, False),
    ]
    return s


def damaged(data: bytes) -> dict[str, bytes]:
    """Broken copies of a file: cut in half, the second half zeroed, bytes flipped in the middle."""
    half = len(data) // 2
    flipped = bytearray(data)
    for k in range(half, min(len(data), half + 24)):
        flipped[k] ^= 0xA5
    return {
        "truncated": data[:half],
        "zeroed": data[:half] + b"\0" * (len(data) - half),
        "flipped": bytes(flipped),
    }
