"""The store format: the one contract between the writer (preprocess) and the reader (pipeline).

A tilefeed store is a Zarr v3 group. ``images`` is a uint8 array of shape (N, T, T, 3) with one
tile per chunk, packed S tiles to a shard by the ``sharding_indexed`` codec. Each shard file is
the concatenation of its encoded chunks followed by the shard index: S pairs of little-endian
uint64 (offset, nbytes) and a crc32c of those bytes. Every encoded chunk ends with its own crc32c
(the ``crc32c`` codec is the last of the inner codecs), so a reader can check any tile alone.
The attributes also record each shard file's sha256: a crc32c tells a damaged chunk, not a
sound one moved to another place, so a copy of a shard made elsewhere (a bucket store's cache
folder, a download) is used only once its sha256 matches.

This module holds the contract's names, limits, codec table and layout; the store modules
beside it act on them, and neither side re-derives offsets, names or codec settings:
``codec`` (tiles to chunk bytes and back), ``shard`` (shard files, their index and digests),
``attrs`` (the group attributes as a checked, typed record), ``documents`` (the zarr.json
files and opening a store), ``arrays`` (every array checked against the attributes).

It imports no numpy, zarr or image library, so the command line reads ``CODECS`` and
``TILE_SIDES`` from it without loading them. A tile codec's name is a ``Codec``: a ``StrEnum``,
equal to its string, whose ``.value`` (a plain str) is what the attributes record.

A store may come from anyone, and its digests can be recomputed by anyone, so nothing in it is
used before it is checked: every attribute for type, range and agreement with the others and
with the files, every metadata document for size and nesting, every array's zarr.json against
the attributes, every chunk's declared decoded size against the tile or row it must fill,
before anything is allocated or decompressed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from typing_extensions import Buffer

import crc32c as _crc32c

FORMAT_NAME: Final = "tilefeed"
# 4: optional captions and metadata fields per source, and stores without class labels (a store
# with neither is still written as version 3); 3: optional targets (boxes, masks and frames);
# 2: every array checksummed and digested, still read (it holds no targets); 1 is refused
FORMAT_VERSION: Final = 4
PAIRS_VERSION: Final = 4  # the first version with captions, fields and unlabelled stores
TILES_VERSION: Final = 3  # what a store of tiles, labels and targets alone is written as
READ_VERSIONS: Final = (2, 3, 4)
ATTRS_KEY: Final = "tilefeed"  # group attribute holding the store description; written last

IMAGES: Final = "images"
LABELS: Final = "labels"
SOURCES: Final = "sources"  # index of the source image of each tile, into the sorted source list
ROWS: Final = "rows"  # grid mode: tile row within its source image
COLS: Final = "cols"  # grid mode: tile column within its source image
SOURCE_PATHS: Final = "source_paths"  # the sorted source list, as UTF-8 strings
BOXES: Final = "boxes"  # (N, 4) int32: top, left, height, width of the picture within its tile
# Targets (detection and segmentation): present exactly when the attributes' ``targets`` say so.
OBJECT_OFFSETS: Final = "object_offsets"  # (N+1,) int64: tile i's objects are rows off[i]..off[i+1]
OBJECTS: Final = "objects"  # (M, 6) float64: x0, y0, x1, y1 (tile pixels, XYXY), category id, iscrowd
FRAMES: Final = "frames"  # (N, 4) float64: sx, sy, tx, ty: tile = source * s + t, per axis
MASKS: Final = "masks"  # (N, T, T) uint8, one tile per chunk, sharded exactly as the images
TARGET_ARRAYS: Final = (OBJECT_OFFSETS, OBJECTS, FRAMES)  # the targets' arrays read whole
# Every rejected source, one row each (version 4), where more were rejected than the attributes
# list (MAX_LISTED_REJECTS): the group's zarr.json stays a small document however many failed
REJECT_PATHS: Final = "reject_paths"
REJECT_REASONS: Final = "reject_reasons"
REJECT_ARRAYS: Final = (REJECT_PATHS, REJECT_REASONS)
# read whole
SMALL_ARRAYS: Final = (LABELS, SOURCES, ROWS, COLS, BOXES, SOURCE_PATHS, *TARGET_ARRAYS, *REJECT_ARRAYS)
SHARDED_ARRAYS: Final = (IMAGES, MASKS)  # one tile per chunk, in shard files
# Captions and metadata fields (version 4): one row per *source*, as source_paths, so sample i's
# is row ``sources[i]``. Their names are the user's (``caption``, ``width``, ``uid``), held in
# the attributes' ``texts`` and ``fields`` and checked against PAIR_NAME, so an array name
# (a path under the store root) is never ``..`` or ``/etc``.
TEXT_PREFIX: Final = "text."  # text.caption: UTF-8 strings
FIELD_PREFIX: Final = "field."  # field.width: int64, float64 or UTF-8 strings
PAIR_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

JPEG_CODEC_ID: Final = "tilefeed.jpeg"
JPEG_SUBSAMPLING: Final = "4:4:4"  # full chroma: tiles are training data, not thumbnails


class Codec(StrEnum):
    """The name of a tile codec (``--codec``, the attributes' ``codec``); a member equals its
    string, so ``Codec.JPEG == "jpeg"``. What each means on disk is its ``CODEC_TABLE`` entry."""

    LZ4 = "lz4"
    ZSTD = "zstd"
    NONE = "none"
    JPEG = "jpeg"


@dataclass(frozen=True)
class CodecSpec:
    """What one ``--codec`` name means on disk: the inner codecs of the images' sharding codec
    (a serializer, at most one compressor, then crc32c). The fast path (``codec.TileCodec``),
    zarr-python's declaration (``zarr_codecs``) and the check of a store's zarr.json
    (``documents``) are all built from this one entry, so they cannot disagree."""

    serializer: str  # "bytes" (raw pixels) or JPEG_CODEC_ID
    compressor: str | None = None  # the zarr v3 codec name: "blosc" or "zstd"
    # its configuration, exactly as zarr-python writes it in zarr.json
    settings: Mapping[str, Any] = field(default_factory=dict)
    decoded_by: tuple[str, ...] = ()  # the settings decoding depends on: a store's must match

    def declared(self, serializer: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The inner codecs a store's zarr.json must declare, each with the settings its
        decoding depends on (a level, say, only changes the encoding). ``serializer``: another
        than this entry's (the small arrays' strings are serialized by vlen-utf8)."""
        chain: list[tuple[str, dict[str, Any]]] = [(serializer or self.serializer, {})]
        if self.compressor is not None:
            chain.append((self.compressor, {k: self.settings[k] for k in self.decoded_by}))
        return [*chain, ("crc32c", {})]


CODEC_TABLE: Final[Mapping[Codec, CodecSpec]] = {
    Codec.LZ4: CodecSpec("bytes", "blosc", {"typesize": 1, "cname": "lz4", "clevel": 5, "shuffle": "noshuffle",
                                            "blocksize": 0}, decoded_by=("cname", "shuffle", "typesize")),
    Codec.ZSTD: CodecSpec("bytes", "zstd", {"level": 3, "checksum": False}),
    Codec.NONE: CodecSpec("bytes"),
    Codec.JPEG: CodecSpec(JPEG_CODEC_ID),
}
CODECS: Final = tuple(codec.value for codec in Codec)  # plain strings, for --codec's choices and messages
SMALL_ARRAY_CODEC: Final = Codec.ZSTD  # the compressor of every array beside the tiles

CRC_NBYTES: Final = 4
EMPTY_CHUNK: Final = 2**64 - 1  # offset and nbytes of a chunk that is not written

# The contract's limits. Every count in a store's metadata sizes a loop or an allocation
# somewhere, so each is checked against these and against the others before anything uses it.
TILE_SIDES: Final = (8, 8192)  # the tile sides a writer makes (--tile)
MAX_SHARD_SIZE: Final = 1_000_000  # tiles per shard (--shard-size)
SMALL_CHUNK: Final = 1 << 18  # rows per chunk of the per-sample arrays
PATHS_CHUNK: Final = 1 << 16  # rows per chunk of source_paths and of string fields
MAX_PATH_BYTES: Final = 4096  # one source path, as the OS allows it (PATH_MAX); one string field
TEXT_CHUNK: Final = 1 << 13  # rows per chunk of a caption array: at most 256 MiB decoded
MAX_TEXT_BYTES: Final = 1 << 15  # one caption, UTF-8 (a longer one is a reject at preprocess time)
MAX_LISTED_REJECTS: Final = 10_000  # rejects the attributes list; past them, REJECT_ARRAYS hold all
MAX_TEXTS: Final = 16  # caption names a store may hold
MAX_FIELDS: Final = 64  # metadata fields a store may hold
FIELD_DTYPES: Final = ("int64", "float64", "string")
MAX_METADATA_BYTES: Final = 64 << 20  # one zarr.json (the group's lists every rejected source)
MAX_NESTING: Final = 16  # tilefeed's own documents nest 6 deep
SMALL_DTYPES: Final = {LABELS: "int64", SOURCES: "int64", ROWS: "int32", COLS: "int32",
                       BOXES: "int32", SOURCE_PATHS: "string", OBJECT_OFFSETS: "int64",
                       OBJECTS: "float64", FRAMES: "float64", REJECT_PATHS: "string",
                       REJECT_REASONS: "string"}
ROW_WIDTH: Final = {BOXES: 4, OBJECTS: 6, FRAMES: 4}  # the arrays whose rows hold several values
MASK_CODEC: Final = Codec.ZSTD  # masks are class or instance ids: lossless, and they compress well
MASK_IGNORE: Final = 255  # a semantic mask's "no label" (also the pad areas')
MAX_MASK_OBJECTS: Final = 254  # objects of a tile with instance masks: ids 1..254 (0: background)
# objects in a store: read whole (48 bytes a row, 192 GiB at the cap), their chunk files listed
# and checked before the first is read (16,384 at the cap)
MAX_OBJECTS: Final = 1 << 32
MAX_CATEGORIES: Final = 1 << 16
MAX_CATEGORY_ID: Final = 2**31 - 1
MAX_NAME_BYTES: Final = 1024  # one category name


class MaskKind(StrEnum):
    """What a store's masks hold (the attributes' ``targets.masks``): ``SEMANTIC``, a class id
    per pixel (MASK_IGNORE: no label); ``INSTANCE``, 0 for background and k for the tile's
    object k-1 (each object's binary mask is ``mask == k``)."""

    SEMANTIC = "semantic"
    INSTANCE = "instance"
REQUIRED_ARRAYS: Final = (IMAGES, LABELS, SOURCES, BOXES, SOURCE_PATHS)  # ROWS and COLS: grid mode

WORK_DIR: Final = ".tilefeed-partial"  # present while a store is being written
WRITTEN: Final = ("zarr.json", IMAGES, MASKS, *SMALL_ARRAYS, WORK_DIR)  # every entry a writer makes


def crc32c(data: Buffer) -> int:
    return int(_crc32c.crc32c(data))


def crc_bytes(data: Buffer) -> bytes:
    return crc32c(data).to_bytes(4, "little")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shard_count(samples: int, tiles_per_shard: int) -> int:
    return ceil_div(samples, tiles_per_shard)


def shard_relpath(shard: int, array: str = IMAGES) -> str:
    """The shard file's key under the store root (zarr's default '/'-separated chunk keys):
    ``images`` has four dimensions, ``masks`` three."""
    return f"{array}/c/{shard}/0/0/0" if array == IMAGES else f"{array}/c/{shard}/0/0"


def shard_path(root: Path, shard: int, array: str = IMAGES) -> Path:
    return root / shard_relpath(shard, array)


def index_nbytes(tiles_per_shard: int) -> int:
    return 16 * tiles_per_shard + CRC_NBYTES


def text_array(name: str) -> str:
    """The array that holds the captions named ``name``."""
    return TEXT_PREFIX + name


def field_array(name: str) -> str:
    """The array that holds the metadata field ``name``."""
    return FIELD_PREFIX + name


def is_pair_array(name: str) -> bool:
    """True for a caption or field array's name of the form the format allows."""
    for prefix in (TEXT_PREFIX, FIELD_PREFIX):
        if name.startswith(prefix) and PAIR_NAME.fullmatch(name[len(prefix):]):
            return True
    return False


def written(name: str) -> bool:
    """True for a top-level entry a tilefeed writer makes (``remove_store`` clears these only)."""
    return name in WRITTEN or is_pair_array(name)


def small_chunk_path(root: Path, name: str, index: int, ndim: int = 1) -> Path:
    """The file of chunk ``index`` of an array chunked along its first axis only (whole rows)."""
    return root.joinpath(name, "c", str(index), *["0"] * (ndim - 1))


def small_chunk_paths(root: Path, name: str, length: int, chunk: int, ndim: int = 1) -> list[Path]:
    return [small_chunk_path(root, name, i, ndim) for i in range(shard_count(length, chunk))]


def inside(root: Path, path: Path) -> bool:
    """True when ``path``, links resolved, lies under ``root``: a store never makes a reader
    touch a file elsewhere (a link in a downloaded store to ~/.ssh is not read)."""
    base = os.path.realpath(root)
    return os.path.realpath(path).startswith(base.rstrip(os.sep) + os.sep)
