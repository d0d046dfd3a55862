"""The store format: the one contract between the writer (preprocess) and the reader (pipeline).

A tilefeed store is a Zarr v3 group. ``images`` is a uint8 array of shape (N, T, T, 3) with one
tile per chunk, packed S tiles to a shard by the ``sharding_indexed`` codec. Each shard file is
the concatenation of its encoded chunks followed by the shard index: S pairs of little-endian
uint64 (offset, nbytes) and a crc32c of those bytes. Every encoded chunk ends with its own crc32c
(the ``crc32c`` codec is the last of the inner codecs), so a reader can check any tile alone.
The attributes also record each shard file's sha256: a crc32c tells a damaged chunk, not a
sound one moved to another place, so a copy of a shard made elsewhere (a bucket store's cache
folder, a download) is used only once its sha256 matches.

Both sides use the functions here; neither re-derives offsets, names or codec settings. One
module on purpose, longer than most: the whole contract (names, layout, checksums, digests,
version rules) is read in one place.

A store may come from anyone, and its digests can be recomputed by anyone, so nothing in it is
used before it is checked: every attribute for type, range and agreement with the others and
with the files (``StoreAttrs``), every metadata document for size and nesting, every array's
zarr.json against the attributes, every chunk's declared decoded size against the tile or row
it must fill, before anything is allocated or decompressed.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import re
import reprlib
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any, Final

from typing_extensions import Buffer

import crc32c as _crc32c
import numpy as np
from numcodecs import Blosc, Zstd, blosc

from tilefeed.store.errors import ConfigError, CorruptChunkError, StoreFormatError, TileDecodeError

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
_ENTRY: Final = struct.Struct("<QQ")  # a shard index entry: offset, nbytes

# The contract's limits. Every count in a store's metadata sizes a loop or an allocation
# somewhere, so each is checked against these and against the others before anything uses it.
TILE_SIDES: Final = (8, 8192)  # the tile sides a writer makes (--size)
MAX_SHARD_SIZE: Final = 1_000_000  # tiles per shard (--shard-size)
SMALL_CHUNK: Final = 1 << 18  # rows per chunk of the per-sample arrays
PATHS_CHUNK: Final = 1 << 16  # rows per chunk of source_paths
MAX_PATH_BYTES: Final = 4096  # one source path, as the OS allows it (PATH_MAX)
MAX_METADATA_BYTES: Final = 64 << 20  # one zarr.json (the group's lists every rejected source)
MAX_NESTING: Final = 16  # tilefeed's own documents nest 6 deep
SMALL_DTYPES: Final = {LABELS: "int64", SOURCES: "int64", ROWS: "int32", COLS: "int32",
                       BOXES: "int32", SOURCE_PATHS: "string"}
REQUIRED_ARRAYS: Final = (IMAGES, LABELS, SOURCES, BOXES, SOURCE_PATHS)  # ROWS and COLS: grid mode


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
    nbytes: int = field(init=False, repr=False, compare=False)  # of one decoded tile

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ConfigError(f"codec must be one of {', '.join(CODECS)}, got {self.name!r}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"quality must be in 1..100, got {self.quality}")
        if not TILE_SIDES[0] <= self.tile <= TILE_SIDES[1]:
            raise ConfigError(f"tile size must be in {TILE_SIDES[0]}..{TILE_SIDES[1]} pixels, got {self.tile}")
        object.__setattr__(self, "nbytes", self.tile * self.tile * 3)

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
        ``decode_jpeg``.

        Exactly the tile's bytes or TileDecodeError: a crc32c only says the chunk is the one
        written, not that it holds a whole tile. Sizes are read from the frame header before
        anything is decompressed, so a chunk never writes past the tile nor leaves part of
        ``out`` as it was (another sample's pixels)."""
        if out is None:
            out = np.empty(self.shape, dtype=np.uint8)
        expected, nbytes, name = self.nbytes, len(payload), self.name
        if out.nbytes != expected:
            raise ValueError(f"out must hold one {self.shape} tile, got {out.dtype} {out.shape}")
        try:  # the checks are inline: they run once per tile on the hot path
            if name == "lz4":
                if nbytes < 16 or _BLOSC_HEADER.unpack_from(payload) != (expected, nbytes):
                    raise _size_error(name, blosc_sizes(payload), expected, nbytes)
                blosc.decompress(payload, out)
            elif name == "zstd":
                declared = zstd_content_size(payload)
                if declared != expected:
                    raise _size_error(name, (declared, nbytes), expected, nbytes)
                _ZSTD.decode(payload, out=out)
            elif name == "none":
                if nbytes != expected:
                    raise _size_error(name, (nbytes, nbytes), expected, nbytes)
                np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(self.shape))
            else:
                decode_jpeg(payload, out, fast_idct)
        except TileDecodeError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a codec raises on a bad chunk is its reason
            raise TileDecodeError(f"{name} chunk", None, f"does not decode: {_one_line(e)}") from None
        return out


# Built once: the hot paths encode and decode a tile per call. Parallelism comes from worker
# processes and reader threads; blosc's own threads would only contend with them. numcodecs
# already keeps them out of any thread but a process's main one (the reader's threads); the
# writer's worker processes turn them off for themselves (``tasks.write_part``), and importing
# tilefeed changes no setting of the caller's process.
_LZ4 = Blosc(cname="lz4", clevel=LZ4_LEVEL, shuffle=Blosc.NOSHUFFLE, blocksize=0)
_ZSTD = Zstd(level=ZSTD_LEVEL)


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
        raise TileDecodeError("jpeg chunk", None, f"no readable JPEG header: {_one_line(e)}") from None
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


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


WORK_DIR: Final = ".tilefeed-partial"  # present while a store is being written
WRITTEN: Final = ("zarr.json", IMAGES, *SMALL_ARRAYS, WORK_DIR)  # every entry a writer makes


def sha256_fd(fd: int) -> str:
    """sha256 of the whole file open as ``fd``, read from its start (the file position is not
    used, so other readers of the descriptor are not disturbed)."""
    h, offset = hashlib.sha256(), 0
    while block := os.pread(fd, 1 << 20, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


def shard_digest_problem(path: Path, store: StoreAttrs, shard: int) -> str:
    """'' when the shard file ``path`` has the sha256 the store records (or records none): what
    no file of the right size with its chunks moved about, each crc32c intact, passes."""
    if store.shard_sha256 is None:
        return ""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        actual = sha256_fd(fd)
    finally:
        os.close(fd)
    if actual != store.shard_sha256[shard]:
        return "differs from what was written (shard sha256 mismatch)"
    return ""


def sha256_files(paths: Iterable[Path]) -> str:
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


def small_chunk_path(root: Path, name: str, index: int, ndim: int = 1) -> Path:
    """The file of chunk ``index`` of an array chunked along its first axis only (whole rows)."""
    return root.joinpath(name, "c", str(index), *["0"] * (ndim - 1))


def small_chunk_paths(root: Path, name: str, length: int, chunk: int, ndim: int = 1) -> list[Path]:
    return [small_chunk_path(root, name, i, ndim) for i in range(shard_count(length, chunk))]


def describe_arrays(root: Path, names: list[str], shard_bytes: list[int],
                    shard_sha256: list[str]) -> dict[str, Any]:
    """What the attributes record of each array, for readers and ``verify`` to check against.
    ``shard_sha256``: the sha256 of each shard file, which a copy of a shard (a cache folder's,
    a download) must match before it is used."""
    out: dict[str, Any] = {
        IMAGES: {"chunks": len(shard_bytes), "shard_bytes": shard_bytes, "shard_sha256": shard_sha256,
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


# -- metadata documents ------------------------------------------------------------------------
def parse_document(document: bytes) -> tuple[Any, str]:
    """(the parsed document, '') or (None, what is wrong): larger than MAX_METADATA_BYTES, not
    JSON, or nested deeper than MAX_NESTING (Python's parser recurses, and so do its users)."""
    if len(document) > MAX_METADATA_BYTES:
        return None, f"{len(document)} bytes, more than a metadata document may hold ({MAX_METADATA_BYTES})"
    try:
        doc = json.loads(document)
    except RecursionError:
        return None, f"nested deeper than {MAX_NESTING} levels"
    except ValueError as e:
        return None, f"not JSON: {_one_line(e)}"
    if _nesting(doc) > MAX_NESTING:
        return None, f"nested deeper than {MAX_NESTING} levels"
    return doc, ""


def _nesting(doc: Any) -> int:
    """How deep lists and objects nest in ``doc``, counted without recursion (and stopping as
    soon as the limit is passed)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def read_document(path: Path) -> bytes:
    """A metadata file's bytes, at most MAX_METADATA_BYTES + 1 of them (so parse_document refuses a
    larger one without reading it all); OSError when it is absent or not a plain file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe would block the open itself
    with open(fd, "rb") as f:
        if not S_ISREG(os.fstat(fd).st_mode):  # a device or a pipe never ends
            raise OSError(f"{path} is not a plain file")
        return f.read(MAX_METADATA_BYTES + 1)


def inside(root: Path, path: Path) -> bool:
    """True when ``path``, links resolved, lies under ``root``: a store never makes a reader
    touch a file elsewhere (a link in a downloaded store to ~/.ssh is not read)."""
    base = os.path.realpath(root)
    return os.path.realpath(path).startswith(base.rstrip(os.sep) + os.sep)


# -- the attributes, as a typed record -----------------------------------------------------------
def _show(value: Any) -> str:
    """A value for a one-line message: short, whatever a hostile document put there."""
    text = _REPR.repr(value)  # a few entries of a few levels, however large the value
    return text if len(text) <= 60 else text[:57] + "..."


_REPR: Final = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """One JSON object of the attributes, read field by field: a field absent or not of the type
    and range the format gives it is a StoreFormatError naming it (``arrays.labels.chunk``)."""

    def __init__(self, value: Any, where: str, path: str) -> None:
        if not isinstance(value, dict):
            raise StoreFormatError(f"{where}: attribute {path!r} must be an object, got {_show(value)}")
        self.d, self.where, self.path = value, where, path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, what: str) -> StoreFormatError:
        value = self.d.get(key)
        return StoreFormatError(f"{self.where}: attribute {self.name(key)!r} {what}, got {_show(value)}")

    def get(self, key: str) -> Any:
        if key not in self.d:
            raise StoreFormatError(f"{self.where}: attribute {self.name(key)!r} is missing")
        return self.d[key]

    def whole(self, key: str, low: int, high: int) -> int:
        value = self.get(key)
        if not _is_int(value) or not low <= value <= high:
            raise self.fail(key, f"must be a whole number in {low}..{high}")
        return int(value)

    def equal(self, key: str, expected: int, why: str) -> int:
        value = self.get(key)
        if not _is_int(value) or value != expected:
            raise self.fail(key, f"must be {expected} ({why})")
        return int(value)

    def digests(self, key: str, count: int) -> tuple[str, ...]:
        """A list of exactly ``count`` sha256 digests in hex."""
        value = self.get(key)
        if (not isinstance(value, list) or len(value) != count
                or not all(isinstance(v, str) and _is_sha256(v) for v in value)):
            raise self.fail(key, f"must list {count} sha256 digests in hex (one per shard)")
        return tuple(value)

    def text(self, key: str, hex64: bool = False) -> str:
        value = self.get(key)
        if not isinstance(value, str) or hex64 and not _is_sha256(value):
            raise self.fail(key, "must be a sha256 in hex" if hex64 else "must be a string")
        return value

    def values(self, key: str, item: type, low: int = 0) -> list[Any]:
        value = self.get(key)
        if (not isinstance(value, list) or len(value) < low
                or not all(isinstance(v, item) and not isinstance(v, bool) for v in value)):
            raise self.fail(key, f"must be a list of {low} or more {item.__name__} values")
        return value

    def child(self, key: str) -> _Fields:
        return _Fields(self.get(key), self.where, self.name(key))


_SHA256: Final = re.compile("[0-9a-f]{64}")


def _is_sha256(text: str) -> bool:
    return _SHA256.fullmatch(text) is not None


@dataclass(frozen=True)
class ArrayRecord:
    """What the attributes record of one array beside the tiles (chunked along rows only)."""

    name: str
    length: int
    chunk: int  # rows per chunk
    ndim: int
    chunks: int
    sha256: str  # of the chunk files, in order
    metadata_sha256: str

    @property
    def row(self) -> int:
        """Values per row: boxes hold four (top, left, height, width), the others one."""
        return 4 if self.ndim == 2 else 1

    @property
    def dtype(self) -> str:
        return SMALL_DTYPES[self.name]

    def chunk_path(self, root: Path, index: int) -> Path:
        return small_chunk_path(root, self.name, index, self.ndim)

    def chunk_paths(self, root: Path) -> Iterator[Path]:
        return (self.chunk_path(root, i) for i in range(self.chunks))

    @property
    def decoded_chunk_bytes(self) -> int:
        """The bytes of one decoded chunk (zarr writes edge chunks whole); 0 for strings."""
        return 0 if self.dtype == "string" else self.chunk * self.row * np.dtype(self.dtype).itemsize

    @property
    def max_chunk_file(self) -> int:
        """The largest a chunk file can be: zstd's worst case over the decoded chunk (strings:
        each a path and its length), and the crc32c."""
        decoded = self.decoded_chunk_bytes or 4 + self.chunk * (4 + MAX_PATH_BYTES)
        return decoded + (decoded >> 7) + 512 + CRC_NBYTES

    @classmethod
    def from_dict(cls, name: str, f: _Fields, samples: int, sources: int) -> ArrayRecord:
        if name == SOURCE_PATHS:  # one per source read, the skipped ones aside
            length, most = f.whole("length", 1, sources), PATHS_CHUNK
        else:
            length, most = f.equal("length", samples, "one per sample"), SMALL_CHUNK
        chunk = f.whole("chunk", 1, min(length, most))
        return cls(name=name, length=length, chunk=chunk,
                   ndim=f.equal("ndim", 2 if name == BOXES else 1, f"the dimensions of {name}"),
                   chunks=f.equal("chunks", ceil_div(length, chunk), "ceil(length / chunk)"),
                   sha256=f.text("sha256", hex64=True), metadata_sha256=f.text("metadata_sha256", hex64=True))


@dataclass(frozen=True)
class StoreAttrs:
    """The group attributes of a store, every field checked for type and range and against the
    others, so no count sizes a loop or an allocation before it has been: ``from_dict``.

    What ties the counts to the bytes on disk: ``shards`` is the length of ``shard_bytes``
    (bounded by the document), ``samples`` agrees with both and with each shard's size, which is
    compared with the file or the bucket listing before a shard is read; the arrays beside the
    tiles hold one row per sample, their chunks at most SMALL_CHUNK rows."""

    samples: int
    sources: int
    accepted: int
    rejected: int
    tile: int
    codec: str
    quality: int | None
    shard_size: int
    shards: int
    shard_bytes: tuple[int, ...]
    images_metadata_sha256: str
    classes: tuple[str, ...]
    made: dict[str, Any]
    rejects: tuple[tuple[str, str], ...]
    fingerprint: str
    arrays: dict[str, ArrayRecord]  # the arrays beside the tiles, by name
    digest: str
    # sha256 of each shard file; None in stores written before shards had digests, whose copies
    # (a bucket store's cache) cannot be checked against the original
    shard_sha256: tuple[str, ...] | None = None

    @property
    def tile_codec(self) -> TileCodec:
        return TileCodec(self.codec, self.tile, self.quality or 90)

    def held(self, shard: int) -> int:
        """The tiles shard ``shard`` holds: all but the last are full."""
        return min(self.shard_size, self.samples - shard * self.shard_size)

    @classmethod
    def from_dict(cls, attrs: Any, where: str) -> StoreAttrs:
        f = _Fields(attrs, where, "")
        if f.get("format") != FORMAT_NAME:
            raise f.fail("format", f"must be {FORMAT_NAME!r}")
        f.equal("version", FORMAT_VERSION, "the version this tilefeed reads")
        sources = f.whole("sources", 1, 2**48)
        rejects = _rejects(f)
        rejected = f.equal("rejected", len(rejects), "the entries of rejects")
        accepted = f.equal("accepted", sources - rejected, "sources less rejected")
        shard_size = f.whole("shard_size", 1, MAX_SHARD_SIZE)
        samples = f.whole("samples", 1, 2**48)
        shards = f.equal("shards", shard_count(samples, shard_size), "ceil(samples / shard_size)")
        tile = _tile(f)
        codec = f.get("codec")
        if codec not in CODECS:
            raise f.fail("codec", f"must be one of {', '.join(CODECS)}")
        quality = f.whole("quality", 1, 100) if codec == "jpeg" else None
        if codec != "jpeg" and f.get("quality") is not None:
            raise f.fail("quality", f"must be null for codec {codec}")
        arrays = f.child("arrays")
        _array_names(arrays)
        images = arrays.child(IMAGES)
        images.equal("chunks", shards, "the shard count")
        shard_bytes = tuple(images.values("shard_bytes", int))
        if len(shard_bytes) != shards:
            raise images.fail("shard_bytes", f"must list {shards} sizes (one per shard)")
        store = cls(
            samples=samples, sources=sources, accepted=accepted, rejected=rejected, tile=tile,
            codec=codec, quality=quality, shard_size=shard_size, shards=shards, shard_bytes=shard_bytes,
            images_metadata_sha256=images.text("metadata_sha256", hex64=True),
            classes=tuple(f.values("classes", str, low=1)), made=_made(f), rejects=rejects,
            fingerprint=f.text("fingerprint"), digest=f.text("digest", hex64=True),
            arrays={name: ArrayRecord.from_dict(name, arrays.child(name), samples, sources)
                    for name in arrays.d if name != IMAGES},
            shard_sha256=images.digests("shard_sha256", shards) if "shard_sha256" in images.d else None,
        )
        store._check_shard_bytes(images)
        return store

    def _check_shard_bytes(self, images: _Fields) -> None:
        """Each shard holds its index and a chunk per tile: an uncompressed one exactly the
        tile's bytes, any other at least one byte, each with its crc32c."""
        exact = self.codec == "none"
        per_tile = CRC_NBYTES + (self.tile_codec.nbytes if exact else 1)
        for shard, size in enumerate(self.shard_bytes):
            least = index_nbytes(self.shard_size) + self.held(shard) * per_tile
            if size < least or size > 2**62 or exact and size != least:
                raise images.fail("shard_bytes", f"entry {shard} must be {'' if exact else 'at least '}"
                                  f"{least} ({self.held(shard)} tiles and the index)")


def _tile(f: _Fields) -> int:
    tile = f.get("tile")
    low, high = TILE_SIDES
    if (not isinstance(tile, list) or len(tile) != 3 or not all(_is_int(v) for v in tile)
            or tile[0] != tile[1] or tile[2] != 3 or not low <= tile[0] <= high):
        raise f.fail("tile", f"must be [T, T, 3] with T in {low}..{high}")
    return int(tile[0])


def _rejects(f: _Fields) -> tuple[tuple[str, str], ...]:
    rejects = f.get("rejects")
    if not isinstance(rejects, list) or not all(
            isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("reason"), str)
            for r in rejects):
        raise f.fail("rejects", "must be a list of {path, reason} strings")
    return tuple((r["path"], r["reason"]) for r in rejects)


def _made(f: _Fields) -> dict[str, Any]:
    made = f.child("made").d
    scalar = (str, int, float, bool, type(None))
    for key, value in made.items():
        if not isinstance(value, scalar) and not (
                isinstance(value, list) and all(isinstance(v, scalar) for v in value)):
            raise StoreFormatError(f"{f.where}: attribute 'made.{key[:40]}' must be a value or a "
                                   f"list of values, got {_show(value)}")
    return dict(made)


def _array_names(arrays: _Fields) -> None:
    """Array names come from the fixed set: a name is a path under the store root, and
    ``../elsewhere`` or ``/etc`` would have a reader look outside it."""
    known = (IMAGES, *SMALL_ARRAYS)
    for name in arrays.d:
        if name not in known:
            raise StoreFormatError(f"{arrays.where}: attribute 'arrays' names {_show(name)}, not one of "
                                   f"{', '.join(known)}")
    for name in REQUIRED_ARRAYS:
        arrays.get(name)
    if (ROWS in arrays.d) != (COLS in arrays.d):
        raise StoreFormatError(f"{arrays.where}: attribute 'arrays' must hold both {ROWS} and {COLS} "
                               "(grid mode) or neither")


def store_attrs(attrs: Mapping[str, Any] | StoreAttrs, root: Path) -> StoreAttrs:
    return attrs if isinstance(attrs, StoreAttrs) else StoreAttrs.from_dict(attrs, f"store {str(root)!r}")


# -- the arrays' own documents, as zarr-python reads them ------------------------------------------
_DEFAULT_KEYS: Final = {"name": "default", "configuration": {"separator": "/"}}
_INDEX_CODECS: Final = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
# the codec names inside the sharding codec, and the settings decoding depends on
_INNER_CODECS: Final[dict[str, list[tuple[str, dict[str, Any]]]]] = {
    "lz4": [("bytes", {}), ("blosc", {"cname": "lz4", "shuffle": "noshuffle", "typesize": 1}), ("crc32c", {})],
    "zstd": [("bytes", {}), ("zstd", {}), ("crc32c", {})],
    "none": [("bytes", {}), ("crc32c", {})],
    "jpeg": [(JPEG_CODEC_ID, {}), ("crc32c", {})],
}


def _codec_name(codec: Any) -> Any:
    return codec.get("name") if isinstance(codec, dict) else codec


def _codecs_problem(codecs: Any, expected: list[tuple[str, dict[str, Any]]]) -> str:
    """'' when ``codecs`` is that chain (names, and the settings a decoder reads)."""
    names = [name for name, _ in expected]
    if not isinstance(codecs, list) or len(codecs) != len(expected):
        shown = [_codec_name(c) for c in codecs[:8]] if isinstance(codecs, list) else codecs
        return f"codecs are {_show(str(shown))}, expected {names}"
    for codec, (name, settings) in zip(codecs, expected, strict=True):
        config = codec.get("configuration") if isinstance(codec, dict) else None
        config = config if isinstance(config, dict) else {}
        if _codec_name(codec) != name or any(config.get(k) != v for k, v in settings.items()):
            return f"codec {_show(_codec_name(codec))} is not {name} {settings or ''}".rstrip()
        if name == "bytes" and config.get("endian", "little") != "little":
            return "a bytes codec is not little-endian"
    return ""


def _fields_problem(doc: dict[str, Any], expected: dict[str, Any]) -> str:
    for key, value in expected.items():
        if doc.get(key) != value:
            return f"{key} is {_show(doc.get(key))}, the store's attributes say {_show(value)}"
    if doc.get("storage_transformers", []) != []:
        return "storage_transformers are declared (tilefeed reads none)"
    return ""


def images_document_problem(doc: Any, store: StoreAttrs) -> str:
    """How the images array's zarr.json disagrees with the attributes ('' when it does not):
    zarr-python reads what it declares, tilefeed what the attributes say, and both must agree."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    t = store.tile
    problem = _fields_problem(doc, {
        "zarr_format": 3, "node_type": "array", "shape": [store.samples, t, t, 3], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [store.shard_size, t, t, 3]}},
        "chunk_key_encoding": _DEFAULT_KEYS})
    if problem:
        return problem
    codecs = doc.get("codecs")
    sharding = codecs[0] if isinstance(codecs, list) and len(codecs) == 1 else None
    if not isinstance(sharding, dict) or sharding.get("name") != "sharding_indexed":
        return f"codecs are {_show(codecs)}, expected one sharding_indexed"
    config = sharding.get("configuration")
    if not isinstance(config, dict):
        return "sharding_indexed has no configuration"
    problem = _fields_problem(config, {"chunk_shape": [1, t, t, 3], "index_codecs": _INDEX_CODECS,
                                       "index_location": "end"})
    return problem or _codecs_problem(config.get("codecs"), _INNER_CODECS[store.codec])


def small_document_problem(doc: Any, rec: ArrayRecord) -> str:
    """How an array's zarr.json disagrees with its record in the attributes ('' when it does not)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    rest = [4] if rec.ndim == 2 else []
    problem = _fields_problem(doc, {
        "zarr_format": 3, "node_type": "array", "shape": [rec.length, *rest], "data_type": rec.dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [rec.chunk, *rest]}},
        "chunk_key_encoding": _DEFAULT_KEYS})
    serializer = "vlen-utf8" if rec.dtype == "string" else "bytes"
    return problem or _codecs_problem(doc.get("codecs"), [(serializer, {}), ("zstd", {}), ("crc32c", {})])


# -- checking the arrays against the attributes ----------------------------------------------------
def _file_problem(root: Path, path: Path, most: int) -> str:
    """What keeps ``path`` from being read as a file of the store ('' when nothing does)."""
    if not inside(root, path):
        return "lies outside the store (a link)"
    try:
        st = path.stat()
    except OSError:
        return "missing"
    if not S_ISREG(st.st_mode):
        return "not a plain file"
    if st.st_size > most:
        return f"{st.st_size} bytes, more than it can hold ({most})"
    return ""


def _metadata_problems(root: Path, store: StoreAttrs, name: str) -> list[tuple[str, str]]:
    path = root / name / "zarr.json"
    problem = _file_problem(root, path, MAX_METADATA_BYTES)
    if problem:
        return [(str(path), problem)]
    data = path.read_bytes()
    recorded = store.images_metadata_sha256 if name == IMAGES else store.arrays[name].metadata_sha256
    if hashlib.sha256(data).hexdigest() != recorded:
        return [(str(path), "differs from what was written (sha256 mismatch)")]
    doc, problem = parse_document(data)
    if not problem:
        problem = (images_document_problem(doc, store) if name == IMAGES
                   else small_document_problem(doc, store.arrays[name]))
    return [(str(path), problem)] if problem else []


def _shard_problems(root: Path, store: StoreAttrs,
                    shard_sizes: Sequence[int | None] | None) -> list[tuple[str, str]]:
    problems = []
    for shard, expected in enumerate(store.shard_bytes):
        path = shard_path(root, shard)
        size: int | None
        if shard_sizes is not None:
            size = shard_sizes[shard] if shard < len(shard_sizes) else None
        elif not inside(root, path):
            problems.append((str(path), "lies outside the store (a link)"))
            continue
        else:
            size = path.stat().st_size if path.is_file() else None
        if size is None:
            problems.append((str(path), "missing shard"))
        elif size != expected:
            problems.append((str(path), f"{size} bytes, expected {expected} (truncated or altered)"))
    return problems


def _chunk_problems(root: Path, rec: ArrayRecord) -> list[tuple[str, str]]:
    """Every chunk present, of a possible size, crc32c-checked. The loop ends at the first
    missing chunk, so the files on disk bound it rather than the recorded count."""
    problems = []
    for path in rec.chunk_paths(root):
        problem = _file_problem(root, path, rec.max_chunk_file)
        if problem == "missing":
            problems.append((str(path), "missing chunk (zarr would read it as zeros)"))
            break
        if problem:
            problems.append((str(path), problem))
            continue
        data = path.read_bytes()
        if len(data) < CRC_NBYTES or crc_bytes(memoryview(data)[:-CRC_NBYTES]) != data[-CRC_NBYTES:]:
            problems.append((str(path), "chunk crc32c mismatch"))
    return problems


def array_problems(root: Path, attrs: Mapping[str, Any] | StoreAttrs, name: str,
                   shard_sizes: Sequence[int | None] | None = None) -> list[tuple[str, str]]:
    """Every way array ``name`` differs from what the attributes record: (file, what is wrong).

    ``shard_sizes``: the shards' sizes as a bucket listing gave them (None: absent), for a store
    whose shards are not under ``root``. Check IMAGES first: its shard sizes, compared with the
    files, are what bound the sample count the other arrays are read by.
    """
    store = store_attrs(attrs, root)
    if name != IMAGES and name not in store.arrays:
        return [(str(root / name), "not recorded in the store's attributes")]
    problems = _metadata_problems(root, store, name)
    if name == IMAGES:
        return problems + _shard_problems(root, store, shard_sizes)
    rec = store.arrays[name]
    problems += _chunk_problems(root, rec)
    if not problems and sha256_files(rec.chunk_paths(root)) != rec.sha256:
        problems.append((str(root / name), "chunks differ from what was written (sha256 mismatch)"))
    return problems


def check_array(root: Path, attrs: Mapping[str, Any] | StoreAttrs, name: str) -> None:
    """CorruptChunkError naming the file of the first problem ``array_problems`` finds."""
    problems = array_problems(root, attrs, name)
    if problems:
        path, detail = problems[0]
        raise CorruptChunkError(path, None, detail)


def read_small_array(root: Path, attrs: Mapping[str, Any] | StoreAttrs, name: str) -> np.ndarray:
    """A whole numeric array beside the tiles, after checking every chunk: CorruptChunkError on
    damage. Decoded here rather than through zarr-python, whose zstd codec allocates whatever
    a frame header declares: each frame must declare exactly its chunk's bytes."""
    store = store_attrs(attrs, root)
    check_array(root, store, name)
    rec = store.arrays[name]
    expected = rec.decoded_chunk_bytes
    if not expected:
        raise ValueError(f"{name} holds strings; read it with zarr")
    parts = []
    for path in rec.chunk_paths(root):
        data = path.read_bytes()
        payload = memoryview(data)[:-CRC_NBYTES]
        if len(data) < CRC_NBYTES or crc_bytes(payload) != data[-CRC_NBYTES:]:  # changed since the check
            raise CorruptChunkError(str(path), None, "chunk crc32c mismatch")
        size = zstd_content_size(payload)
        if size != expected:
            raise CorruptChunkError(str(path), None, f"declares {size} decoded bytes, a chunk of "
                                    f"{rec.chunk} rows holds {expected}")
        out = np.empty(expected, dtype=np.uint8)
        try:
            _ZSTD.decode(payload, out=out)
        except Exception as e:  # noqa: BLE001 - whatever the codec raises on a bad chunk is its reason
            raise CorruptChunkError(str(path), None, f"does not decode: {_one_line(e)}") from None
        parts.append(out.view(np.dtype(rec.dtype).newbyteorder("<")))
    values = np.concatenate(parts)[: rec.length * rec.row]
    return values.reshape(rec.length, rec.row) if rec.ndim == 2 else values


def labels_problem(labels: np.ndarray, classes: int) -> str:
    """'' when every label names one of ``classes`` classes."""
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        return f"labels fall outside 0..{classes - 1}"
    return ""


def boxes_problem(boxes: np.ndarray, tile: int) -> str:
    """'' when every box (top, left, height, width) is a picture of at least a pixel inside its tile."""
    top, left, height, width = boxes.T
    if boxes.size and ((top < 0) | (left < 0) | (height < 1) | (width < 1)
                       | (top + height > tile) | (left + width > tile)).any():
        return f"a box lies outside its {tile}x{tile} tile"
    return ""


# -- opening a store -------------------------------------------------------------------------------
def read_attrs(root: Path) -> dict[str, Any] | None:
    """The store's tilefeed attributes, or None when the group metadata is absent or not ours."""
    try:
        return parse_attrs(read_document(root / "zarr.json"))
    except OSError:
        return None


def parse_attrs(group_metadata: bytes) -> dict[str, Any] | None:
    """The tilefeed attributes in a group's ``zarr.json``, or None when they are not ours."""
    meta, problem = parse_document(group_metadata)
    return None if problem else _ours(meta)


def _ours(meta: Any) -> dict[str, Any] | None:
    """A group document's tilefeed attributes, whatever shape the document has; else None."""
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    attrs = attrs.get(ATTRS_KEY) if isinstance(attrs, dict) else None
    return attrs if isinstance(attrs, dict) and attrs.get("format") == FORMAT_NAME else None


def load_attrs(root: str | Path) -> dict[str, Any]:
    """The attributes of a complete tilefeed store this code can read, or a StoreFormatError.
    Every field is checked (``StoreAttrs.from_dict``); the arrays are checked by ``array_problems``."""
    return open_store(root)[0]


def open_store(root: str | Path) -> tuple[dict[str, Any], StoreAttrs]:
    """``load_attrs`` and the typed record it checked them into."""
    root = Path(root)
    if not root.is_dir():
        raise StoreFormatError(f"store {str(root)!r} does not exist or is not a folder")
    path = root / "zarr.json"
    if path.exists() and not inside(root, path):
        raise StoreFormatError(f"{path}: lies outside the store (a link)")
    try:
        meta, problem = parse_document(read_document(path))
    except OSError:
        meta, problem = None, ""
    if problem:
        raise StoreFormatError(f"{path}: {problem}")
    attrs = _ours(meta)
    if attrs is None:
        if (root / WORK_DIR).exists():
            raise StoreFormatError(
                f"store {str(root)!r} is incomplete: preprocessing did not finish; rerun the same "
                "`tilefeed preprocess` command to resume it"
            )
        raise StoreFormatError(f"{str(root)!r} is not a tilefeed store (no tilefeed group metadata)")
    version = attrs.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {_show(version)}; this tilefeed reads versions up "
            f"to {FORMAT_VERSION}: upgrade tilefeed"
        )
    if version < FORMAT_VERSION:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {version}, whose labels and other arrays carry "
            f"no checksums; rebuild it with the same `tilefeed preprocess` command plus --overwrite"
        )
    if attrs.get("digest") != attrs_digest(attrs):
        raise CorruptChunkError(str(path), None,
                                "the store's attributes differ from what was written (sha256 mismatch)")
    return attrs, StoreAttrs.from_dict(attrs, f"store {str(root)!r}")


class ShardFile:
    """One shard, memory-mapped, its index checked once; chunks come out as crc-checked views."""

    # a store of a thousand shards keeps a thousand of these: slots keep each one compact
    __slots__ = ("path", "first", "_map", "_view", "_tail", "_tiles", "_data_end")

    def __init__(self, root: Path, shard: int, tiles_per_shard: int) -> None:
        self.path = shard_path(root, shard)
        self.first = shard * tiles_per_shard
        if not inside(root, self.path):
            raise CorruptChunkError(str(self.path), None, "lies outside the store (a link)")
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise CorruptChunkError(str(self.path), None, f"cannot map shard: {e}") from None
        self._view = memoryview(self._map)
        self._tail = index_nbytes(tiles_per_shard)
        self._tiles = tiles_per_shard
        if len(self._view) < self._tail:
            raise CorruptChunkError(str(self.path), None, "file is shorter than its index")
        self.index  # noqa: B018 - its crc32c checked once, here
        self._data_end = len(self._view) - self._tail
        # Entries are read from the map as tiles are: the page cache holds one copy for every
        # process, where a parsed copy per shard would grow each process with the store.

    @property
    def index(self) -> ShardIndex:
        return ShardIndex.decode(self._view[-self._tail:], self._tiles, str(self.path))

    def __len__(self) -> int:
        return self.index.written()

    def nbytes(self, local: int) -> int:
        """Bytes the ``local``-th tile's chunk occupies in the shard, as its index says."""
        return int(_ENTRY.unpack_from(self._map, self._data_end + 16 * local)[1])

    def chunk(self, local: int) -> memoryview:
        """The payload (crc32c stripped) of this shard's ``local``-th tile, checked."""
        payload, end = self._payload(local)
        self._verify(local, payload, end)
        return payload

    def _payload(self, local: int) -> tuple[memoryview, int]:
        """The ``local``-th tile's payload, unchecked, and where its crc32c begins."""
        offset, nbytes = _ENTRY.unpack_from(self._map, self._data_end + 16 * local)
        end = offset + nbytes - CRC_NBYTES
        # one bounds check serves all: a chunk not written has offset and size 2**64 - 1
        if nbytes < CRC_NBYTES or end + CRC_NBYTES > self._data_end:
            raise CorruptChunkError(str(self.path), self.first + local,
                                    f"index entry ({offset}, {nbytes}) is invalid")
        return self._view[offset:end], end

    def read_into(self, local: int, codec: TileCodec, out: np.ndarray, fast_idct: bool = False) -> None:
        """This shard's ``local``-th tile decoded into ``out``, checked. An uncompressed tile is
        copied first and checked in ``out``: the check then reads bytes the copy left in the
        cache, where checking the map first would read them from memory twice."""
        if codec.name != "none":
            try:
                codec.decode(self.chunk(local), out, fast_idct)
            except TileDecodeError as e:
                raise CorruptChunkError(str(self.path), self.first + local, e.detail) from None
            return
        payload, end = self._payload(local)
        if len(payload) != out.nbytes:
            raise CorruptChunkError(str(self.path), self.first + local,
                                    f"chunk is {len(payload)} bytes, the tile {out.nbytes}")
        np.copyto(out, np.frombuffer(payload, dtype=np.uint8).reshape(out.shape))
        self._verify(local, out.data, end)

    def _verify(self, local: int, payload: Buffer, end: int) -> None:
        if _crc32c.crc32c(payload) != _CRC.unpack_from(self._map, end)[0]:
            raise CorruptChunkError(str(self.path), self.first + local, "chunk crc32c mismatch")

    def close(self) -> None:
        try:
            self._view.release()
            self._map.close()
        except BufferError:
            pass  # a caller still holds a chunk view; the map closes when the last one goes
