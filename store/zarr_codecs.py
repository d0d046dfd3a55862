"""The store's arrays as zarr-python declares them, and the ``tilefeed.jpeg`` codec.

``tilefeed.jpeg``: each chunk (1, T, T, 3) uint8 is one baseline JPEG. Registered through
zarr's ``zarr.codecs`` entry point, so any zarr-python with tilefeed installed reads JPEG-coded
stores as pixels; GPU readers hand the same bytes to nvJPEG instead. The contract itself
(``format``) imports neither zarr nor this module; both sides build their codecs from
``format.CODEC_TABLE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.buffer import Buffer, NDBuffer

from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

from tilefeed.store.codec import decode_jpeg, encode_jpeg
from tilefeed.store.format import CODEC_TABLE, JPEG_CODEC_ID, MASK_CODEC, SMALL_ARRAY_CODEC, Codec, CodecSpec

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec


@dataclass(frozen=True)
class JpegCodec(ArrayBytesCodec):
    is_fixed_size = False

    quality: int = 90

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        config = data.get("configuration") or {}
        quality = config.get("quality", 90) if isinstance(config, dict) else None
        if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
            raise ValueError(f"{JPEG_CODEC_ID}: quality must be a whole number in 1..100, got {quality!r}")
        return cls(quality=quality)

    def to_dict(self) -> dict[str, Any]:
        return {"name": JPEG_CODEC_ID, "configuration": {"quality": self.quality}}

    def _tile_shape(self, spec: ArraySpec) -> tuple[int, ...]:
        if spec.dtype.to_native_dtype() != np.uint8 or len(spec.shape) != 4 or spec.shape[-1] != 3:
            raise ValueError(f"{JPEG_CODEC_ID} needs uint8 chunks of shape (1, T, T, 3)")
        return tuple(spec.shape)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        """Exactly one tile of the chunk's shape: the picture is decoded into a buffer of that
        shape, never sized by its own header (which a damaged or hostile chunk sets)."""
        shape = self._tile_shape(chunk_spec)
        pixels = np.empty(shape[1:], dtype=np.uint8)
        decode_jpeg(chunk_bytes.as_numpy_array().data, pixels)  # TileDecodeError unless it fills them
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(pixels.reshape(shape))  # type: ignore[arg-type]

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        shape = self._tile_shape(chunk_spec)
        tile = np.asarray(chunk_array.as_ndarray_like()).reshape(shape[1:])
        encoded = np.frombuffer(encode_jpeg(tile, self.quality), dtype=np.uint8)
        return chunk_spec.prototype.buffer.from_array_like(encoded)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("JPEG chunks have no fixed encoded size")


_COMPRESSORS: Final = {"blosc": BloscCodec, "zstd": ZstdCodec}  # by zarr v3 codec name


def _compressors(spec: CodecSpec) -> list[Any]:
    """The entry's compressor, if any, then crc32c: every chunk ends with its checksum."""
    compressor = [] if spec.compressor is None else [_COMPRESSORS[spec.compressor](**spec.settings)]
    return [*compressor, Crc32cCodec()]


def images_codecs(codec: Codec | str, quality: int) -> dict[str, Any]:
    """The serializer and compressors zarr.create_array needs to declare ``images``'s inner codecs."""
    spec = CODEC_TABLE[Codec(codec)]
    serializer: Any = JpegCodec(quality=quality) if spec.serializer == JPEG_CODEC_ID else BytesCodec()
    return {"serializer": serializer, "compressors": _compressors(spec)}


def masks_codecs() -> dict[str, Any]:
    """The serializer and compressors of the masks array's inner codecs: raw bytes, zstd, crc32c."""
    return {"serializer": BytesCodec(), "compressors": _compressors(CODEC_TABLE[MASK_CODEC])}


def small_array_codecs() -> dict[str, Any]:
    """Compressors of the arrays beside the tiles: zstd, then crc32c, so every chunk is checked.

    ``write_empty_chunks``: zarr would skip a chunk equal to the fill value (all labels 0), and
    a missing chunk must always mean damage, never zeros.
    """
    return {"compressors": _compressors(CODEC_TABLE[SMALL_ARRAY_CODEC]), "config": {"write_empty_chunks": True}}
