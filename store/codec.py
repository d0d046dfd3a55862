"""Tiles to chunk bytes and back: ``TileCodec``, the JPEG coder, and the decoded sizes a
compressed chunk's header declares, read before anything is decompressed.

This is the fast path both sides share: plain numcodecs/simplejpeg/PIL calls, no zarr
machinery, and byte for byte what zarr-python writes and reads for the same entry of
``format.CODEC_TABLE`` (``zarr_codecs.images_codecs``).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from typing_extensions import Buffer

import numpy as np
from numcodecs import Blosc, Zstd, blosc
from numcodecs.abc import Codec as Compressor

from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError, TileDecodeError, one_line
from tilefeed.store.format import (
    CODEC_TABLE,
    JPEG_CODEC_ID,
    JPEG_SUBSAMPLING,
    TILE_SIDES,
    Codec,
    CodecSpec,
    crc_bytes,
)

_SHUFFLES: Final = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}


def _numcodec(spec: CodecSpec) -> Compressor:
    """The numcodecs compressor that writes what zarr-python's codec of the same settings does."""
    s = spec.settings
    if spec.compressor == "blosc":
        return Blosc(cname=s["cname"], clevel=s["clevel"], shuffle=_SHUFFLES[s["shuffle"]],
                     blocksize=s["blocksize"], typesize=s["typesize"])
    if spec.compressor == "zstd":
        return Zstd(level=s["level"], checksum=s["checksum"])
    raise ValueError(f"no numcodecs compressor for {spec.compressor!r}")


# Built once, by codec name: the hot paths encode and decode a tile per call. Parallelism comes
# from worker processes and reader threads; blosc's own threads would only contend with them.
# numcodecs already keeps them out of any thread but a process's main one (the reader's
# threads); the writer's worker processes turn them off for themselves (``tasks.write_part``),
# and importing tilefeed changes no setting of the caller's process.
COMPRESSORS: Final[Mapping[str, Compressor]] = {  # keyed by Codec members, found by their strings too
    name: _numcodec(spec) for name, spec in CODEC_TABLE.items() if spec.compressor is not None}


@dataclass(frozen=True)
class TileCodec:
    """Encodes one (T, T, 3) uint8 tile into chunk bytes (crc32c appended) and back. ``name``
    may be given as a string; it is a ``Codec`` once made."""

    name: Codec | str
    tile: int
    quality: int = 90
    nbytes: int = field(init=False, repr=False, compare=False)  # of one decoded tile
    # the compressor's zarr name, or the serializer's when there is none: what decoding checks
    _kind: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        codec = choice(Codec, self.name, "codec")
        object.__setattr__(self, "name", codec)
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality must be in 1..100, got {self.quality}")
        if not TILE_SIDES[0] <= self.tile <= TILE_SIDES[1]:
            raise ConfigError(f"tile size must be in {TILE_SIDES[0]}..{TILE_SIDES[1]} pixels, got {self.tile}")
        object.__setattr__(self, "nbytes", self.tile * self.tile * 3)
        spec = CODEC_TABLE[codec]
        object.__setattr__(self, "_kind", spec.compressor or spec.serializer)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.tile, self.tile, 3)

    @property
    def is_image_coded(self) -> bool:
        """True when chunk payloads are images a decoder (nvJPEG) reads, not raw pixels."""
        return self._kind == JPEG_CODEC_ID

    def encode(self, tile: np.ndarray) -> bytes:
        return b"".join(self.encode_parts(tile))

    def encode_parts(self, tile: np.ndarray) -> tuple[bytes, bytes]:
        """(payload, crc32c): the chunk is their concatenation; writers skip the copy."""
        if tile.shape != self.shape or tile.dtype != np.uint8:
            raise ValueError(f"tile must be uint8 {self.shape}, got {tile.dtype} {tile.shape}")
        payload = self._compress(np.ascontiguousarray(tile))
        return payload, crc_bytes(payload)

    def _compress(self, tile: np.ndarray) -> bytes:
        if self._kind == JPEG_CODEC_ID:
            return encode_jpeg(tile, self.quality)
        if self._kind == "bytes":
            return tile.tobytes()
        return bytes(COMPRESSORS[self.name].encode(tile))

    def decode(self, payload: bytes | memoryview, out: np.ndarray | None = None,
               fast_idct: bool = False) -> np.ndarray:
        """Chunk payload (crc32c already stripped) -> (T, T, 3) uint8. ``fast_idct``: see
        ``decode_jpeg``.

        Exactly the tile's bytes or TileDecodeError: a crc32c only says the chunk is the one
        written, not that it holds a whole tile. Sizes are read from the frame header before
        anything is decompressed, so a chunk never writes past the tile nor leaves part of
        ``out`` as it was (another sample's pixels)."""
        if out is None:
            out = np.empty(self.shape, dtype=np.uint8)
        expected, nbytes, name, kind = self.nbytes, len(payload), self.name, self._kind
        if out.nbytes != expected:
            raise ValueError(f"out must hold one {self.shape} tile, got {out.dtype} {out.shape}")
        try:  # the checks are inline: they run once per tile on the hot path
            if kind == "blosc":
                if nbytes < 16 or _BLOSC_HEADER.unpack_from(payload) != (expected, nbytes):
                    raise _size_error(name, blosc_sizes(payload), expected, nbytes)
                blosc.decompress(payload, out)
            elif kind == "zstd":
                declared = zstd_content_size(payload)
                if declared != expected:
                    raise _size_error(name, (declared, nbytes), expected, nbytes)
                COMPRESSORS[name].decode(payload, out=out)
            elif kind == "bytes":
                if nbytes != expected:
                    raise _size_error(name, (nbytes, nbytes), expected, nbytes)
                np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(self.shape))
            else:
                decode_jpeg(payload, out, fast_idct)
        except TileDecodeError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a codec raises on a bad chunk is its reason
            raise TileDecodeError(f"{name} chunk", None, f"does not decode: {one_line(e)}") from None
        return out


def encode_jpeg(tile: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(tile, "RGB").save(buf, "JPEG", quality=quality, subsampling=JPEG_SUBSAMPLING)
    return buf.getvalue()


def decode_jpeg(payload: Buffer, out: np.ndarray | None = None, fast_idct: bool = False,
                pixels: str = "RGB") -> np.ndarray:
    """The pixels of a JPEG tile, decoded straight into ``out`` when given (contiguous, the
    tile's shape), with the GIL released: simplejpeg's libjpeg-turbo, faster than DALI's CPU
    decoder on the same threads (``tilefeed bench parts``). ``fast_idct``: libjpeg-turbo's
    fast integer IDCT (FFCV's), a little faster, a few levels off. ``pixels``: "RGB", or
    "RGBX" (a fourth, unused byte per pixel: how PIL holds RGB)."""
    import simplejpeg

    if out is None:  # the header sizes the picture: refuse one no tile could be before allocating it
        height, width = jpeg_size(payload)
        if not (0 < height <= TILE_SIDES[1] and 0 < width <= TILE_SIDES[1]):
            raise TileDecodeError("jpeg chunk", None, f"the JPEG holds a {height}x{width} picture, "
                                  f"larger than any tile ({TILE_SIDES[1]} pixels a side)")
    decoded = simplejpeg.decode_jpeg(payload, pixels, fastdct=fast_idct, buffer=out)
    if out is not None and decoded.shape != out.shape:  # a smaller picture fills only the front
        raise TileDecodeError("jpeg chunk", None,
                              f"the JPEG holds a {decoded.shape} picture, the tile is {out.shape}")
    return decoded  # type: ignore[no-any-return]


def jpeg_size(payload: Buffer) -> tuple[int, int]:
    """(height, width) from a JPEG's header, without decoding it: TileDecodeError if unreadable."""
    import simplejpeg

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(payload)
    except Exception as e:  # noqa: BLE001 - any failure to read a header is the chunk's damage
        raise TileDecodeError("jpeg chunk", None, f"no readable JPEG header: {one_line(e)}") from None
    return int(height), int(width)


# The decoded size each compressed chunk declares in its header, read before decompressing.
_BLOSC_HEADER: Final = struct.Struct("<4xI4xI")  # blosc1: nbytes at 4, cbytes at 12 of 16 bytes
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_ZSTD_FCS_BYTES: Final = (0, 2, 4, 8)  # by the frame header's size flag (0: 1 byte if single segment)


def blosc_sizes(payload: Buffer) -> tuple[int, int]:
    """(decoded bytes, frame bytes) a blosc frame's header declares; (-1, -1) without a header.
    numcodecs decompresses ``nbytes`` into the buffer it is given, however large that is, and
    reads ``cbytes`` of input whatever the input's length: both are checked by the caller."""
    if len(memoryview(payload)) < 16:
        return -1, -1
    nbytes, cbytes = _BLOSC_HEADER.unpack_from(payload)
    return int(nbytes), int(cbytes)


def zstd_content_size(payload: Buffer) -> int:
    """The decoded size the first zstd frame declares (RFC 8878, 3.1.1.1); -1 when there is no
    frame or it declares no size. A frame whose content differs from its declared size does not
    decode (zstd checks), and frames after it only add bytes, which overflow the buffer."""
    head = memoryview(payload)[:18].tobytes()
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        return -1
    descriptor = head[4]
    single_segment, dict_bytes = descriptor >> 5 & 1, (0, 1, 2, 4)[descriptor & 3]
    size_bytes = _ZSTD_FCS_BYTES[descriptor >> 6] or single_segment
    start = 5 + (0 if single_segment else 1) + dict_bytes
    if descriptor & 0x08 or not size_bytes or len(head) < start + size_bytes:  # reserved bit, no size
        return -1
    return int.from_bytes(head[start : start + size_bytes], "little") + (256 if size_bytes == 2 else 0)


def _size_error(codec: str, declared: tuple[int, int], expected: int, nbytes: int) -> TileDecodeError:
    """What is wrong with a chunk whose header does not declare exactly the tile's decoded bytes
    in a frame of its own length."""
    size, frame = declared
    if size != expected:
        what = "no decoded size" if size < 0 else f"{size} decoded bytes"
        return TileDecodeError(f"{codec} chunk", None, f"declares {what}, the tile holds {expected}")
    return TileDecodeError(f"{codec} chunk", None, f"declares a {frame}-byte frame in {nbytes} bytes")
