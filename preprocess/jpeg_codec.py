"""The ``tilefeed.jpeg`` Zarr v3 codec: each chunk (1, T, T, 3) uint8 is one baseline JPEG.

Registered through zarr's ``zarr.codecs`` entry point, so any zarr-python with tilefeed installed
reads JPEG-coded stores as pixels; GPU readers hand the same bytes to nvJPEG instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.buffer import Buffer, NDBuffer

from preprocess.format import JPEG_CODEC_ID, decode_jpeg, encode_jpeg

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
        return cls(quality=int(config.get("quality", 90)))

    def to_dict(self) -> dict[str, Any]:
        return {"name": JPEG_CODEC_ID, "configuration": {"quality": self.quality}}

    def _tile_shape(self, spec: ArraySpec) -> tuple[int, ...]:
        if spec.dtype.to_native_dtype() != np.uint8 or len(spec.shape) != 4 or spec.shape[-1] != 3:
            raise ValueError(f"{JPEG_CODEC_ID} needs uint8 chunks of shape (1, T, T, 3)")
        return tuple(spec.shape)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        shape = self._tile_shape(chunk_spec)
        pixels = decode_jpeg(chunk_bytes.as_numpy_array().tobytes()).reshape(shape)
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(pixels)  # type: ignore[arg-type]

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        shape = self._tile_shape(chunk_spec)
        tile = np.asarray(chunk_array.as_ndarray_like()).reshape(shape[1:])
        encoded = np.frombuffer(encode_jpeg(tile, self.quality), dtype=np.uint8)
        return chunk_spec.prototype.buffer.from_array_like(encoded)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("JPEG chunks have no fixed encoded size")
