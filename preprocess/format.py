"""The store format: the one contract between the writer (preprocess) and the reader (pipeline).

A tilefeed store is a Zarr v3 group. ``images`` is a uint8 array of shape (N, T, T, 3) with one
tile per chunk, packed S tiles to a shard by the ``sharding_indexed`` codec. Each shard file is
the concatenation of its encoded chunks followed by the shard index: S pairs of little-endian
uint64 (offset, nbytes) and a crc32c of those bytes. Every encoded chunk ends with its own crc32c
(the ``crc32c`` codec is the last of the inner codecs), so a reader can check any tile alone.

Both sides use the functions here; neither re-derives offsets, names or codec settings. One
module on purpose, longer than most: the whole contract (names, layout, checksums, digests,
version rules) is read in one place.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Final

from typing_extensions import Buffer

import crc32c as _crc32c
import numpy as np
from numcodecs import Blosc, Zstd, blosc

from tilefeed.preprocess.errors import ConfigError, CorruptChunkError, StoreFormatError

FORMAT_NAME: Final = "tilefeed"
FORMAT_VERSION: Final = 2  # 2: every array checksummed and digested; 1 is refused (rebuild it)
ATTRS_KEY: Final = "tilefeed"  # group attribute holding the store description; written last

IMAGES: Final = "images"
LABELS: Final = "labels"
SOURCES: Final = "sources"  # index of the source image of each tile, into the sorted source list
ROWS: Final = "rows"  # grid mode: tile row within its source image
COLS: Final = "cols"  # grid mode: tile column within its source image
SOURCE_PATHS: Final = "source_paths"  # the sorted source list, as UTF-8 strings
BOXES: Final = "boxes"  # (N, 4) int32: top, left, height, width of the picture within its tile
SMALL_ARRAYS: Final = (LABELS, SOURCES, ROWS, COLS, BOXES, SOURCE_PATHS)  # all but images: read whole

CODECS: Final = ("lz4", "zstd", "none", "jpeg")
JPEG_CODEC_ID: Final = "tilefeed.jpeg"
JPEG_SUBSAMPLING: Final = "4:4:4"  # full chroma: tiles are training data, not thumbnails
LZ4_LEVEL: Final = 5
ZSTD_LEVEL: Final = 3

CRC_NBYTES: Final = 4
EMPTY_CHUNK: Final = 2**64 - 1  # offset and nbytes of a chunk that is not written
_CRC: Final = struct.Struct("<I")


def crc32c(data: Buffer) -> int:
    return int(_crc32c.crc32c(data))


def crc_bytes(data: Buffer) -> bytes:
    return crc32c(data).to_bytes(4, "little")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shard_count(samples: int, tiles_per_shard: int) -> int:
    return ceil_div(samples, tiles_per_shard)


def shard_relpath(shard: int) -> str:
    """The shard file's key under the store root (zarr's default '/'-separated chunk keys)."""
    return f"{IMAGES}/c/{shard}/0/0/0"


def shard_path(root: Path, shard: int) -> Path:
    return root / shard_relpath(shard)


def index_nbytes(tiles_per_shard: int) -> int:
    return 16 * tiles_per_shard + CRC_NBYTES


class ShardIndex:
    """The (offset, nbytes) table at the end of a shard, with named operations (as zarr's
    ``_ShardIndex``): an entry of all ones marks a chunk that is not written."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table  # (S, 2) uint64

    @classmethod
    def packed(cls, tiles_per_shard: int, sizes: list[int]) -> ShardIndex:
        """The first ``len(sizes)`` chunks back to back from offset 0; the rest not written."""
        table = np.full((tiles_per_shard, 2), EMPTY_CHUNK, dtype=np.uint64)
        n = len(sizes)
        table[:n, 1] = sizes
        table[:n, 0] = np.cumsum(sizes, dtype=np.uint64) - table[:n, 1]
        return cls(table)

    @classmethod
    def decode(cls, buf: bytes | memoryview, tiles_per_shard: int, shard_name: str) -> ShardIndex:
        """Shard index bytes -> the table, after checking the crc32c."""
        expected = index_nbytes(tiles_per_shard)
        if len(buf) != expected:
            raise CorruptChunkError(shard_name, None, f"index is {len(buf)} bytes, expected {expected}")
        raw = memoryview(buf)[:-CRC_NBYTES]
        if crc_bytes(raw) != bytes(buf[-CRC_NBYTES:]):
            raise CorruptChunkError(shard_name, None, "index crc32c mismatch")
        return cls(np.frombuffer(raw, dtype="<u8").reshape(tiles_per_shard, 2).copy())

    def encode(self) -> bytes:
        raw = np.ascontiguousarray(self.table, dtype="<u8").tobytes()
        return raw + crc_bytes(raw)

    def is_empty(self, local: int) -> bool:
        return bool((self.table[local] == EMPTY_CHUNK).all())

    def written(self) -> int:
        """How many chunks the index lists as written."""
        return int(np.count_nonzero(~(self.table == EMPTY_CHUNK).all(axis=1)))


@dataclass(frozen=True)
class TileCodec:
    """Encodes one (T, T, 3) uint8 tile into chunk bytes (crc32c appended) and back.

    This is the fast path both sides share: plain numcodecs/PIL calls, no zarr machinery, and
    byte-for-byte what zarr-python writes and reads for the codecs ``zarr_codecs.images_codecs``
    declares.
    """

    name: str
    tile: int
    quality: int = 90

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ConfigError(f"codec must be one of {', '.join(CODECS)}, got {self.name!r}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality must be in 1..100, got {self.quality}")
        if self.tile < 8:
            raise ConfigError(f"tile size must be at least 8 pixels, got {self.tile}")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.tile, self.tile, 3)

    @property
    def is_image_coded(self) -> bool:
        """True when chunk payloads are images a decoder (nvJPEG) reads, not raw pixels."""
        return self.name == "jpeg"

    def encode(self, tile: np.ndarray) -> bytes:
        return b"".join(self.encode_parts(tile))

    def encode_parts(self, tile: np.ndarray) -> tuple[bytes, bytes]:
        """(payload, crc32c): the chunk is their concatenation; writers skip the copy."""
        if tile.shape != self.shape or tile.dtype != np.uint8:
            raise ValueError(f"tile must be uint8 {self.shape}, got {tile.dtype} {tile.shape}")
        payload = self._compress(np.ascontiguousarray(tile))
        return payload, crc_bytes(payload)

    def _compress(self, tile: np.ndarray) -> bytes:
        if self.name == "lz4":
            return bytes(_LZ4.encode(tile))
        if self.name == "zstd":
            return bytes(_ZSTD.encode(tile))
        if self.name == "none":
            return tile.tobytes()
        return encode_jpeg(tile, self.quality)

    def decode(self, payload: bytes | memoryview, out: np.ndarray | None = None,
               fast_idct: bool = False) -> np.ndarray:
        """Chunk payload (crc32c already stripped) -> (T, T, 3) uint8. ``fast_idct``: see
        ``decode_jpeg``."""
        if out is None:
            out = np.empty(self.shape, dtype=np.uint8)
        if self.name == "lz4":
            blosc.decompress(payload, out)
        elif self.name == "zstd":
            _ZSTD.decode(payload, out=out)
        elif self.name == "none":
            np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(self.shape))
        else:
            decode_jpeg(payload, out, fast_idct)
        return out


# Built once: the hot paths encode and decode a tile per call. Parallelism comes from worker
# processes and DALI threads; blosc's own threads would only contend with them.
_LZ4 = Blosc(cname="lz4", clevel=LZ4_LEVEL, shuffle=Blosc.NOSHUFFLE, blocksize=0)
_ZSTD = Zstd(level=ZSTD_LEVEL)
blosc.use_threads = False


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

    decoded = simplejpeg.decode_jpeg(payload, pixels, fastdct=fast_idct, buffer=out)
    if out is not None and decoded.shape != out.shape:  # a smaller picture fills only the front
        raise ValueError(f"the JPEG holds a {decoded.shape} picture, the tile is {out.shape}")
    return decoded  # type: ignore[no-any-return]


WORK_DIR: Final = ".tilefeed-partial"  # present while a store is being written
WRITTEN: Final = ("zarr.json", IMAGES, *SMALL_ARRAYS, WORK_DIR)  # every entry a writer makes


def sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def attrs_digest(attrs: dict[str, Any]) -> str:
    """sha256 of the attributes themselves (less this digest): a flipped byte there is caught."""
    body = {k: v for k, v in attrs.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def small_chunk_paths(root: Path, name: str, length: int, chunk: int, ndim: int = 1) -> list[Path]:
    """The chunk files of an array chunked along its first axis only (whole rows)."""
    rest = ["0"] * (ndim - 1)
    return [root.joinpath(name, "c", str(i), *rest) for i in range(shard_count(length, chunk))]


def describe_arrays(root: Path, names: list[str], shard_bytes: list[int]) -> dict[str, Any]:
    """What the attributes record of each array, for readers and ``verify`` to check against."""
    out: dict[str, Any] = {
        IMAGES: {"chunks": len(shard_bytes), "shard_bytes": shard_bytes,
                 "metadata_sha256": sha256_files([root / IMAGES / "zarr.json"])},
    }
    for name in names:
        meta = json.loads((root / name / "zarr.json").read_text())
        length, chunk = meta["shape"][0], meta["chunk_grid"]["configuration"]["chunk_shape"][0]
        ndim = len(meta["shape"])
        chunks = small_chunk_paths(root, name, length, chunk, ndim)
        out[name] = {"length": length, "chunk": chunk, "ndim": ndim, "chunks": len(chunks),
                     "sha256": sha256_files(chunks),
                     "metadata_sha256": sha256_files([root / name / "zarr.json"])}
    return out


def array_problems(root: Path, attrs: dict[str, Any], name: str,
                   shard_sizes: Sequence[int | None] | None = None) -> list[tuple[str, str]]:
    """Every way array ``name`` differs from what the attributes record: (file, what is wrong).

    ``shard_sizes``: the shards' sizes as a bucket listing gave them (None: absent), for a store
    whose shards are not under ``root``.
    """
    rec = attrs["arrays"].get(name)
    if rec is None:
        return [(str(root / name), "not recorded in the store's attributes")]
    problems: list[tuple[str, str]] = []
    meta = root / name / "zarr.json"
    if not meta.is_file():
        problems.append((str(meta), "missing"))
    elif sha256_files([meta]) != rec["metadata_sha256"]:
        problems.append((str(meta), "differs from what was written (sha256 mismatch)"))
    if name == IMAGES:
        for shard, expected in enumerate(rec["shard_bytes"]):
            path = shard_path(root, shard)
            if shard_sizes is not None:
                size = shard_sizes[shard] if shard < len(shard_sizes) else None
            else:
                size = path.stat().st_size if path.is_file() else None
            if size is None:
                problems.append((str(path), "missing shard"))
            elif size != expected:
                problems.append((str(path), f"{size} bytes, expected {expected} (truncated or altered)"))
        return problems
    chunks = small_chunk_paths(root, name, rec["length"], rec["chunk"], rec.get("ndim", 1))
    for path in chunks:
        if not path.is_file():
            problems.append((str(path), "missing chunk (zarr would read it as zeros)"))
            continue
        data = path.read_bytes()
        if len(data) < CRC_NBYTES or crc_bytes(data[:-CRC_NBYTES]) != data[-CRC_NBYTES:]:
            problems.append((str(path), "chunk crc32c mismatch"))
    if not problems and sha256_files(chunks) != rec["sha256"]:
        problems.append((str(root / name), "chunks differ from what was written (sha256 mismatch)"))
    return problems


def check_array(root: Path, attrs: dict[str, Any], name: str) -> None:
    """CorruptChunkError naming the file of the first problem ``array_problems`` finds."""
    problems = array_problems(root, attrs, name)
    if problems:
        path, detail = problems[0]
        raise CorruptChunkError(path, None, detail)


def read_attrs(root: Path) -> dict[str, Any] | None:
    """The store's tilefeed attributes, or None when the group metadata is absent or not ours."""
    try:
        return parse_attrs((root / "zarr.json").read_bytes())
    except OSError:
        return None


def parse_attrs(group_metadata: bytes) -> dict[str, Any] | None:
    """The tilefeed attributes in a group's ``zarr.json``, or None when they are not ours."""
    try:
        meta = json.loads(group_metadata)
    except ValueError:
        return None
    attrs = meta.get("attributes", {}).get(ATTRS_KEY) if isinstance(meta, dict) else None
    return attrs if isinstance(attrs, dict) and attrs.get("format") == FORMAT_NAME else None


def load_attrs(root: str | Path) -> dict[str, Any]:
    """The attributes of a complete tilefeed store this code can read, or a StoreFormatError."""
    root = Path(root)
    if not root.is_dir():
        raise StoreFormatError(f"store {str(root)!r} does not exist or is not a folder")
    attrs = read_attrs(root)
    if attrs is None:
        if (root / WORK_DIR).exists():
            raise StoreFormatError(
                f"store {str(root)!r} is incomplete: preprocessing did not finish; rerun the same "
                "`tilefeed preprocess` command to resume it"
            )
        raise StoreFormatError(f"{str(root)!r} is not a tilefeed store (no tilefeed group metadata)")
    version = attrs.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {version}; this tilefeed reads versions up to "
            f"{FORMAT_VERSION}: upgrade tilefeed"
        )
    if version < FORMAT_VERSION:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {version}, whose labels and other arrays carry "
            f"no checksums; rebuild it with the same `tilefeed preprocess` command plus --overwrite"
        )
    if attrs.get("digest") != attrs_digest(attrs):
        raise CorruptChunkError(str(root / "zarr.json"), None,
                                "the store's attributes differ from what was written (sha256 mismatch)")
    return attrs


class ShardFile:
    """One shard, memory-mapped, its index parsed once; chunks come out as crc-checked views."""

    def __init__(self, root: Path, shard: int, tiles_per_shard: int) -> None:
        self.path = shard_path(root, shard)
        self.first = shard * tiles_per_shard
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise CorruptChunkError(str(self.path), None, f"cannot map shard: {e}") from None
        self._view = memoryview(self._map)
        tail = index_nbytes(tiles_per_shard)
        if len(self._view) < tail:
            raise CorruptChunkError(str(self.path), None, "file is shorter than its index")
        self.index = ShardIndex.decode(self._view[-tail:], tiles_per_shard, str(self.path))
        self._data_end = len(self._view) - tail
        # Plain int lists: the hot path indexes them per tile, and numpy scalars are slow there.
        self._offsets = self.index.table[:, 0].tolist()
        self._nbytes = self.index.table[:, 1].tolist()

    def __len__(self) -> int:
        return self.index.written()

    def chunk(self, local: int, check: bool = True) -> memoryview:
        """The payload (crc32c stripped) of this shard's ``local``-th tile."""
        offset, nbytes = self._offsets[local], self._nbytes[local]
        end = offset + nbytes - CRC_NBYTES
        # one bounds check serves all: a chunk not written has offset and size 2**64 - 1
        if nbytes < CRC_NBYTES or end + CRC_NBYTES > self._data_end:
            raise CorruptChunkError(str(self.path), self.first + local,
                                    f"index entry ({offset}, {nbytes}) is invalid")
        payload = self._view[offset:end]
        if check:
            self._verify(local, payload, end)
        return payload

    def read_into(self, local: int, codec: TileCodec, out: np.ndarray, fast_idct: bool = False) -> None:
        """This shard's ``local``-th tile decoded into ``out``, checked. An uncompressed tile is
        copied first and checked in ``out``: the check then reads bytes the copy left in the
        cache, where checking the map first reads them from memory twice (measured faster
        through the Loader, side by side)."""
        if codec.name != "none":
            codec.decode(self.chunk(local), out, fast_idct)
            return
        payload = self.chunk(local, check=False)
        if len(payload) != out.nbytes:
            raise CorruptChunkError(str(self.path), self.first + local,
                                    f"chunk is {len(payload)} bytes, the tile {out.nbytes}")
        np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(out.shape))
        self._verify(local, out.data, self._offsets[local] + len(payload))

    def _verify(self, local: int, payload: Buffer, end: int) -> None:
        if _crc32c.crc32c(payload) != _CRC.unpack_from(self._map, end)[0]:
            raise CorruptChunkError(str(self.path), self.first + local, "chunk crc32c mismatch")

    def close(self) -> None:
        try:
            self._view.release()
            self._map.close()
        except BufferError:
            pass  # a caller still holds a chunk view; the map closes when the last one goes
