"""Hostile stores for ``test_hostile_store``: how to craft them, and the child process that opens
them under a memory limit.

Crafting re-signs what it changes (crc32c, sha256, the attributes' digest), as anyone can: the
checks under test are the ones no checksum makes, not the checksums themselves.

``python -m tests.store.hostile_store_cases HONEST WORK SUITE BUDGET_MB SECONDS`` runs each case of
SUITE on a copy of the honest store under WORK and prints one JSON line per case: what ``verify --deep``,
``info``, the StoreReader (every tile and label; for the targets suites every object row,
frame and mask tile too; for the pairs suites every caption and field, by ``read_pairs`` and by
a Loader's epoch) and, for JPEG stores, zarr-python made of it,
how long that took, and any file outside the store that was opened. Memory beyond BUDGET_MB over
the warmed-up process is refused by the kernel (RLIMIT_AS), so an allocation sized by a hostile
number shows up as a MemoryError rather than a slow machine.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.attrs import attrs_digest
from tilefeed.store.codec import COMPRESSORS, encode_jpeg
from tilefeed.store.shard import ShardFile, ShardIndex, sha256_files

Case = tuple[str, Callable[[Path], object]]


# -- crafting ---------------------------------------------------------------------------------------
def group(store: Path) -> dict[str, Any]:
    return json.loads((store / "zarr.json").read_bytes())  # type: ignore[no-any-return]


def attrs_of(store: Path) -> dict[str, Any]:
    return group(store)["attributes"][fmt.ATTRS_KEY]  # type: ignore[no-any-return]


def write_attrs(store: Path, attrs: dict[str, Any]) -> None:
    """The group's attributes replaced, their digest recomputed."""
    doc = group(store)
    attrs = dict(attrs)
    attrs["digest"] = attrs_digest(attrs)
    doc["attributes"][fmt.ATTRS_KEY] = attrs
    (store / "zarr.json").write_text(json.dumps(doc))


def edit_attrs(store: Path, change: Callable[[dict[str, Any]], object]) -> None:
    attrs = attrs_of(store)
    change(attrs)
    write_attrs(store, attrs)


def write_array_doc(store: Path, name: str, document: bytes) -> None:
    """An array's zarr.json replaced, the digest the attributes keep of it updated."""
    (store / name / "zarr.json").write_bytes(document)
    edit_attrs(store, lambda a: a["arrays"][name].update(
        metadata_sha256=hashlib.sha256(document).hexdigest()))


def edit_array_doc(store: Path, name: str, change: Callable[[dict[str, Any]], object]) -> None:
    doc = json.loads((store / name / "zarr.json").read_bytes())
    change(doc)
    write_array_doc(store, name, json.dumps(doc).encode())


def write_small_chunk(store: Path, name: str, index: int, payload: bytes) -> None:
    """Chunk ``index`` of a small array replaced (crc32c appended), the array's sha256 updated."""
    rec = attrs_of(store)["arrays"][name]
    paths = fmt.small_chunk_paths(store, name, rec["length"], rec["chunk"], rec["ndim"])
    paths[index].write_bytes(payload + fmt.crc_bytes(payload))
    edit_attrs(store, lambda a: a["arrays"][name].update(sha256=sha256_files(paths)))


def write_tile_chunk(store: Path, sample: int, payload: bytes) -> None:
    """The chunk of ``sample`` replaced (crc32c appended) in a rebuilt shard, its size recorded."""
    attrs = attrs_of(store)
    per, shard = attrs["shard_size"], sample // attrs["shard_size"]
    f = ShardFile(store, shard, per)
    chunks = [bytes(f.chunk(i)) for i in range(len(f))]
    f.close()
    chunks[sample % per] = payload
    parts = [c + fmt.crc_bytes(c) for c in chunks]
    data = b"".join(parts) + ShardIndex.packed(per, [len(p) for p in parts]).encode()
    fmt.shard_path(store, shard).write_bytes(data)
    attrs["arrays"][fmt.IMAGES]["shard_bytes"][shard] = len(data)
    write_attrs(store, attrs)


def zstd_rle(size: int, declared: int | None = None) -> bytes:
    """A zstd frame of ``size`` zero bytes as RLE blocks (4 bytes per 128 KiB): a 2 GiB one is
    64 KiB. ``declared``: the content size its header states (default ``size``)."""
    block = 128 << 10
    # magic; single segment, a 4-byte content size; the size
    head = b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", size if declared is None else declared)
    blocks = []
    while size > 0:
        n = min(block, size)
        size -= n
        blocks.append(((n << 3) | (1 << 1) | (size == 0)).to_bytes(3, "little") + b"\0")
    return head + b"".join(blocks)


def zstd_raw(data: bytes) -> bytes:
    """A zstd frame holding ``data`` uncompressed, in raw blocks of up to 128 KiB: a valid
    encoding other than the compressor's, so a chunk rewritten with it has another sha256."""
    block = 128 << 10
    head = b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", len(data))
    parts = [data[at : at + block] for at in range(0, len(data), block)] or [b""]
    return head + b"".join(((len(part) << 3) | (k == len(parts) - 1)).to_bytes(3, "little") + part
                           for k, part in enumerate(parts))


def jpeg_with_size(jpeg: bytes, height: int, width: int) -> bytes:
    """A JPEG whose SOF header declares another picture size (its data unchanged)."""
    data = bytearray(jpeg)
    at = next(i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2))
    struct.pack_into(">HH", data, at + 5, height, width)
    return bytes(data)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# -- the cases of the table ------------------------------------------------------------------
def _shards_huge(s: Path) -> None:
    edit_attrs(s, lambda a: a.update(shards=10**12))


def _labels_huge(s: Path) -> None:
    edit_array_doc(s, fmt.LABELS, lambda d: (d.update(shape=[10**12]),
                                             d["chunk_grid"]["configuration"].update(chunk_shape=[1])))
    edit_attrs(s, lambda a: a["arrays"][fmt.LABELS].update(length=10**12, chunk=1, chunks=10**12))


def _small_chunk_zero(s: Path) -> None:
    edit_attrs(s, lambda a: a["arrays"][fmt.LABELS].update(chunk=0))


def _deep_group(s: Path) -> None:
    (s / "zarr.json").write_bytes(b'{"attributes": {"tilefeed": ' + nested(200_000) + b"}}")


def _deep_array_doc(s: Path) -> None:
    write_array_doc(s, fmt.LABELS, b'{"shape": ' + nested(200_000) + b"}")


def _tile_side(side: int) -> Callable[[Path], None]:
    def craft(s: Path) -> None:
        edit_array_doc(s, fmt.IMAGES, lambda d: _retile(d, side))
        edit_attrs(s, lambda a: a.update(tile=[side, side, 3]))
    return craft


def _retile(doc: dict[str, Any], side: int) -> None:
    doc["shape"][1:3] = [side, side]
    doc["chunk_grid"]["configuration"]["chunk_shape"][1:3] = [side, side]
    doc["codecs"][0]["configuration"]["chunk_shape"][1:3] = [side, side]


def _short_tile(codec: str) -> Callable[[Path], None]:
    """Sample 3's chunk holds a frame of 16 bytes (a 16-pixel JPEG): valid, crc32c and all."""
    def craft(s: Path) -> None:
        small = np.arange(48, dtype=np.uint8)
        payload = {"lz4": lambda: bytes(COMPRESSORS["lz4"].encode(small[:16])),
                   "zstd": lambda: bytes(COMPRESSORS["zstd"].encode(small[:16])),
                   "none": lambda: small[:16].tobytes(),
                   "jpeg": lambda: encode_jpeg(np.zeros((4, 4, 3), np.uint8), 90)}[codec]()
        write_tile_chunk(s, 3, payload)
    return craft


def _tile_bomb(codec: str) -> Callable[[Path], None]:
    """Sample 3's chunk declares a huge picture: 2 GiB of lz4 or zstd, or a 65500x65500 JPEG."""
    def craft(s: Path) -> None:
        f = ShardFile(s, 0, attrs_of(s)["shard_size"])
        honest = bytes(f.chunk(3))
        f.close()
        if codec == "jpeg":
            payload = jpeg_with_size(honest, 65500, 65500)
        elif codec == "lz4":  # the header of a blosc frame says 2 GiB
            payload = honest[:4] + struct.pack("<I", 2 << 30) + honest[8:]
        else:
            payload = zstd_rle(2 << 30)
        write_tile_chunk(s, 3, payload)
    return craft


def _labels_bomb(s: Path) -> None:
    write_small_chunk(s, fmt.LABELS, 0, zstd_rle(2 << 30))


def _labels_overfull(s: Path) -> None:
    """A frame that says the chunk's size but holds 64 KiB more."""
    expected = attrs_of(s)["arrays"][fmt.LABELS]["length"] * 8
    write_small_chunk(s, fmt.LABELS, 0, zstd_rle(expected + (64 << 10), declared=expected))


def _escape(name: str) -> Callable[[Path], None]:
    """An array named by a path that leads out of the store, to a copy of ``sources`` there."""
    def craft(s: Path) -> None:
        target = s / name
        if not target.exists():
            shutil.copytree(s / fmt.SOURCES, target)
        edit_attrs(s, lambda a: a["arrays"].update({name: a["arrays"][fmt.SOURCES]}))
    return craft


def _linked_chunk(s: Path) -> None:
    """labels/c/0 a link to a copy of itself outside the store: right bytes, wrong place."""
    chunk = s / fmt.LABELS / "c" / "0"
    outside = s.parent / "outside" / "labels-chunk"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(outside)


def _linked_group(s: Path) -> None:
    """zarr.json a link to a copy of itself outside the store."""
    outside = s.parent / "outside" / "zarr.json"
    outside.write_bytes((s / "zarr.json").read_bytes())
    (s / "zarr.json").unlink()
    (s / "zarr.json").symlink_to(outside)


def _piped_group(s: Path) -> None:
    """zarr.json a named pipe no one writes to: opening it to read would wait forever."""
    (s / "zarr.json").unlink()
    os.mkfifo(s / "zarr.json")


def row_cases(codec: str) -> list[Case]:
    outside = "../outside/elsewhere"
    cases: list[Case] = [
        ("shards 10**12", _shards_huge),
        ("labels length 10**12, chunk 1", _labels_huge),
        ("labels chunk 0", _small_chunk_zero),
        ("shard_size 0", lambda s: edit_attrs(s, lambda a: a.update(shard_size=0))),
        ('shards "3"', lambda s: edit_attrs(s, lambda a: a.update(shards=str(a["shards"])))),
        ("group zarr.json 200,000 deep", _deep_group),
        ("labels zarr.json 200,000 deep", _deep_array_doc),
        ("tile 100000", _tile_side(100_000)),
        ("tile 8192", _tile_side(8192)),
        ("short tile chunk", _short_tile(codec)),
        ("tile chunk bomb", _tile_bomb(codec)),
        ("labels zstd bomb", _labels_bomb),
        ("labels frame overfull", _labels_overfull),
        ("array name ../", _escape(outside)),
        ("array name absolute", lambda s: _escape(str(s.parent / "outside" / "elsewhere"))(s)),
        ("labels chunk links outside", _linked_chunk),
        ("group zarr.json links outside", _linked_group),
        ("group zarr.json a pipe", _piped_group),
    ]
    return cases


# -- stores with targets: their arrays' values, their masks' shards, their attributes ---------------------
def small_values(store: Path, name: str) -> np.ndarray:
    """A targets array's values as written (its one chunk, the crc32c cut off), one row a line."""
    from tilefeed.store.arrays import read_small_array
    from tilefeed.store.attrs import store_attrs

    return np.array(read_small_array(store, store_attrs(attrs_of(store), store), name))


def write_small_values(store: Path, name: str, values: np.ndarray) -> None:
    """A targets array's one chunk rewritten with ``values`` (zstd, as preprocess writes it), re-signed."""
    dtype = np.dtype("<i8") if name == fmt.OBJECT_OFFSETS else np.dtype("<f8")
    write_small_chunk(store, name, 0, bytes(COMPRESSORS["zstd"].encode(values.astype(dtype).tobytes())))


def _edit_values(name: str, change: Callable[[np.ndarray], object]) -> Callable[[Path], None]:
    def craft(s: Path) -> None:
        values = small_values(s, name)
        change(values)
        write_small_values(s, name, values)
    return craft


def _cell(row: int, column: int, value: float) -> Callable[[np.ndarray], None]:
    def change(values: np.ndarray) -> None:
        values[row, column] = value
    return change


def _decrease(offsets: np.ndarray) -> None:
    offsets[2] = offsets[3] + 1  # sample 2 ends after sample 3 starts


def _long_array(name: str, rows: int, chunk: int = 1) -> Callable[[Path], None]:
    """``name`` declares ``rows`` rows in chunks of ``chunk`` (its zarr.json and the attributes
    agree), and, for the objects, the targets' object count says the same."""
    def craft(s: Path) -> None:
        edit_array_doc(s, name, lambda d: (d["shape"].__setitem__(0, rows),
                                           d["chunk_grid"]["configuration"].update(
                                               chunk_shape=[chunk, *d["shape"][1:]])))
        edit_attrs(s, lambda a: a["arrays"][name].update(length=rows, chunk=chunk,
                                                         chunks=-(-rows // chunk)))
        if name == fmt.OBJECTS:
            edit_attrs(s, lambda a: a["targets"].update(objects=rows))
    return craft


def write_mask_chunk(store: Path, sample: int, payload: bytes) -> None:
    """The mask chunk of ``sample`` replaced (crc32c appended) in a rebuilt shard, its size and
    sha256 re-signed in the attributes."""
    attrs = attrs_of(store)
    per, shard = attrs["shard_size"], sample // attrs["shard_size"]
    f = ShardFile(store, shard, per, fmt.MASKS)
    chunks = [bytes(f.chunk(i)) for i in range(len(f))]
    f.close()
    chunks[sample % per] = payload
    parts = [c + fmt.crc_bytes(c) for c in chunks]
    data = b"".join(parts) + ShardIndex.packed(per, [len(p) for p in parts]).encode()
    _resign_mask_shard(store, shard, data)


def _resign_mask_shard(store: Path, shard: int, data: bytes) -> None:
    fmt.shard_path(store, shard, fmt.MASKS).write_bytes(data)
    edit_attrs(store, lambda a: (a["arrays"][fmt.MASKS]["shard_bytes"].__setitem__(shard, len(data)),
                                 a["arrays"][fmt.MASKS]["shard_sha256"].__setitem__(
                                     shard, hashlib.sha256(data).hexdigest())))


def _mask_shard_cut(s: Path) -> None:
    """Masks shard 0 without the last 100 bytes of its chunks (the index kept), re-signed."""
    data = fmt.shard_path(s, 0, fmt.MASKS).read_bytes()
    index = ShardIndex.packed(attrs_of(s)["shard_size"], [1]).encode()
    cut = len(data) - len(index)
    _resign_mask_shard(s, 0, data[: cut - 100] + data[cut:])


def _mask_bomb(s: Path) -> None:
    write_mask_chunk(s, 1, zstd_rle(2 << 30))


def _mask_overfull(s: Path) -> None:
    """A frame that declares a tile's bytes but holds 64 KiB more."""
    tile = attrs_of(s)["tile"][0]
    write_mask_chunk(s, 1, zstd_rle(tile * tile + (64 << 10), declared=tile * tile))


def _mask_unsized(s: Path) -> None:
    """A zstd frame of a tile's zeros that declares no content size (as a stream writes it)."""
    tile = attrs_of(s)["tile"][0]
    # magic; no size, not single-segment; a window of 1 KiB << 3; one RLE block, the last
    frame = b"\x28\xb5\x2f\xfd\x00\x18" + ((tile * tile << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\0"
    write_mask_chunk(s, 1, frame)


def _mask_two_frames(s: Path) -> None:
    """A tile's frame, then a 2 GiB one after it (only the first frame's header is read)."""
    tile = attrs_of(s)["tile"][0]
    write_mask_chunk(s, 1, zstd_rle(tile * tile) + zstd_rle(2 << 30))


def _crowded_tile(s: Path) -> None:
    """Sample 0 holds 300 objects (a pixel box each), past the 254 instance ids a mask has."""
    many, samples = 300, attrs_of(s)["samples"]
    rows = np.tile(np.array([[0.0, 0.0, 1.0, 1.0, 1.0, 0.0]]), (many, 1))
    offsets = np.full(samples + 1, many, np.int64)
    offsets[0] = 0
    edit_array_doc(s, fmt.OBJECTS, lambda d: (d.update(shape=[many, 6]),
                                              d["chunk_grid"]["configuration"].update(chunk_shape=[many, 6])))
    edit_attrs(s, lambda a: (a["arrays"][fmt.OBJECTS].update(length=many, chunk=many, chunks=1),
                             a["targets"].update(objects=many)))
    write_small_values(s, fmt.OBJECTS, rows)
    write_small_values(s, fmt.OBJECT_OFFSETS, offsets)


def _instance_past_count(s: Path) -> None:
    """Sample 0's mask full of an instance id one past its object count."""
    offsets, tile = small_values(s, fmt.OBJECT_OFFSETS), attrs_of(s)["tile"][0]
    count = int(offsets[1] - offsets[0])
    write_mask_chunk(s, 0, bytes(COMPRESSORS["zstd"].encode(np.full(tile * tile, count + 1, np.uint8))))


def _masks_huge(s: Path) -> None:
    edit_array_doc(s, fmt.MASKS, lambda d: d.update(shape=[d["shape"][0], 10**9, 10**9]))


def _masks_rechunked(s: Path) -> None:
    """The masks' inner chunks a quarter of a tile: another layout than the images'."""
    def change(d: dict[str, Any]) -> None:
        half = d["shape"][1] // 2
        d["codecs"][0]["configuration"]["chunk_shape"][1:3] = [half, half]
    edit_array_doc(s, fmt.MASKS, change)


def _untargeted_with_arrays(s: Path) -> None:
    """The targets null; their arrays still listed and on disk."""
    edit_attrs(s, lambda a: a.update(targets=None))


def _targets_without_arrays(s: Path) -> None:
    """The attributes say boxes and instance masks; the objects array is gone, files and record."""
    shutil.rmtree(s / fmt.OBJECTS)
    edit_attrs(s, lambda a: a["arrays"].pop(fmt.OBJECTS))


def _objects_files_gone(s: Path) -> None:
    """The objects array listed, its chunk file removed."""
    shutil.rmtree(s / fmt.OBJECTS / "c")


def targets_cases() -> list[Case]:
    """Crafted stores with targets (format version 3), each re-signed."""
    o, f = fmt.OBJECTS, fmt.FRAMES
    return [
        ("object_offsets decrease", _edit_values(fmt.OBJECT_OFFSETS, _decrease)),
        ("object_offsets end past the objects", _edit_values(
            fmt.OBJECT_OFFSETS, lambda v: v.__setitem__(-1, v[-1] + 5))),
        ("object_offsets start at 3", _edit_values(fmt.OBJECT_OFFSETS, lambda v: v.__setitem__(0, 3))),
        ("object_offsets length 10**12", _long_array(fmt.OBJECT_OFFSETS, 10**12)),
        ("objects 2**32 rows, chunks of 1", _long_array(fmt.OBJECTS, 1 << 32)),
        ("objects 2**40 rows, chunks of 2**18", _long_array(fmt.OBJECTS, 1 << 40, fmt.SMALL_CHUNK)),
        ("objects 2**32 rows, chunks of 2**18", _long_array(fmt.OBJECTS, 1 << 32, fmt.SMALL_CHUNK)),
        ("object x0 NaN", _edit_values(o, _cell(0, 0, np.nan))),
        ("object y1 inf", _edit_values(o, _cell(0, 3, np.inf))),
        ("object x1 < x0", _edit_values(o, lambda v: v.__setitem__((0, 2), v[0, 0] - 1))),
        ("object category 5 not in the table", _edit_values(o, _cell(0, 4, 5.0))),
        ("object category NaN", _edit_values(o, _cell(0, 4, np.nan))),
        ("object iscrowd 2", _edit_values(o, _cell(0, 5, 2.0))),
        ("object iscrowd 0.5", _edit_values(o, _cell(0, 5, 0.5))),
        ("frame sx 0", _edit_values(f, _cell(0, 0, 0.0))),
        ("frame sy -1", _edit_values(f, _cell(1, 1, -1.0))),
        ("frame tx NaN", _edit_values(f, _cell(2, 2, np.nan))),
        ("frame ty -inf", _edit_values(f, _cell(2, 3, -np.inf))),
        ("objects zarr.json float32", lambda s: edit_array_doc(s, fmt.OBJECTS, lambda d: d.update(
            data_type="float32"))),
        ("frames zarr.json rows of 3", lambda s: edit_array_doc(s, fmt.FRAMES, lambda d: d.update(
            shape=[d["shape"][0], 3]))),
        ("masks zarr.json shape 10**9", _masks_huge),
        ("masks zarr.json uint16", lambda s: edit_array_doc(s, fmt.MASKS, lambda d: d.update(
            data_type="uint16"))),
        ("masks zarr.json quarter-tile chunks", _masks_rechunked),
        ("masks shard cut short", _mask_shard_cut),
        ("mask chunk zstd bomb", _mask_bomb),
        ("mask frame overfull", _mask_overfull),
        ("instance id past the object count", _instance_past_count),
        ("mask frame without a size", _mask_unsized),
        ("mask chunk: a tile's frame, then a 2 GiB one", _mask_two_frames),
        ("a tile of 300 objects with instance masks", _crowded_tile),
        ("targets null, arrays present", _untargeted_with_arrays),
        ("targets absent, arrays present", lambda s: edit_attrs(s, lambda a: a.pop("targets"))),
        ("version 2, targets present", lambda s: edit_attrs(s, lambda a: a.update(version=2))),
        ("targets, objects absent", _targets_without_arrays),
        ("objects chunk file absent", _objects_files_gone),
    ]


def _class_id(value: int) -> Callable[[Path], None]:
    """Sample 0's semantic mask full of class id ``value``."""
    def craft(s: Path) -> None:
        tile = attrs_of(s)["tile"][0]
        write_mask_chunk(s, 0, bytes(COMPRESSORS["zstd"].encode(np.full(tile * tile, value, np.uint8))))
    return craft


def semantic_cases() -> list[Case]:
    """Crafted stores of semantic masks (no boxes), each re-signed."""
    return [
        ("class id 9 not in the table", _class_id(9)),
        ("class id 254 not in the table", _class_id(254)),
        ("semantic mask zstd bomb", _mask_bomb),
        ("masks called instance without boxes", lambda s: edit_attrs(
            s, lambda a: a["targets"].update(masks="instance"))),
        ("boxes claimed, no object arrays", lambda s: edit_attrs(s, lambda a: a["targets"].update(boxes=True))),
        ("objects claimed without boxes", lambda s: edit_attrs(s, lambda a: a["targets"].update(objects=5))),
        ("masks shard absent", lambda s: fmt.shard_path(s, 1, fmt.MASKS).unlink()),
    ]


def _wrap(offsets: np.ndarray) -> None:
    """Offsets 0, 2**63-1, -2**62, ...: their int64 differences wrap to positive counts."""
    offsets[1], offsets[2] = 2**63 - 1, -(2**62)


def boxes_cases() -> list[Case]:
    """Crafted stores of boxes without masks (no cap on a tile's objects), each re-signed."""
    return [
        ("object_offsets wrap around int64", _edit_values(fmt.OBJECT_OFFSETS, _wrap)),
        ("object_offsets negative inside", _edit_values(fmt.OBJECT_OFFSETS, lambda v: v.__setitem__(1, -1))),
        ("masks claimed, none written", lambda s: edit_attrs(
            s, lambda a: a["targets"].update(masks="instance"))),
    ]


def _resigned(s: Path) -> None:
    """Every targets array and a mask chunk written again with the same values, re-signed."""
    for name in (fmt.OBJECT_OFFSETS, fmt.OBJECTS, fmt.FRAMES):
        write_small_values(s, name, small_values(s, name))
    f = ShardFile(s, 0, attrs_of(s)["shard_size"], fmt.MASKS)
    first = bytes(f.chunk(0))
    f.close()
    write_mask_chunk(s, 0, first)


def targets_control_cases() -> list[Case]:
    """The harness's controls: the honest store, a copy re-signed with the same values (both read
    honestly), and one whose first box moved a pixel inside its tile (valid, so ``verify`` finds
    it sound, but not what the honest store holds: the reader's comparison must call it wrong)."""
    return [
        ("honest", lambda s: None),
        ("re-signed", _resigned),
        ("box moved a pixel", _edit_values(fmt.OBJECTS, lambda v: v.__setitem__((0, slice(0, 4, 2)),
                                                                                   v[0, 0:4:2] + 0.5))),
    ]


# -- stores of captions and fields (version 4): their string chunks, their attributes ------------------
CAPTION = fmt.text_array("caption")


def vlen_body(items: list[bytes], count: int | None = None) -> bytes:
    """A vlen-utf8 chunk as zarr writes it (before zstd): the item count (``count``: another
    than the items'), then each item's byte length and bytes, whatever those bytes are."""
    head = struct.pack("<I", len(items) if count is None else count)
    return head + b"".join(struct.pack("<I", len(b)) + b for b in items)


def strings_of(store: Path, name: str) -> list[bytes]:
    """A string array's values as written (one chunk), UTF-8."""
    from tilefeed.store.attrs import store_attrs
    from tilefeed.store.pairs import read_strings

    return [str(v).encode() for v in read_strings(store, store_attrs(attrs_of(store), store), name)]


def write_strings(store: Path, name: str, body: bytes) -> None:
    """A string array's one chunk rewritten from a vlen-utf8 ``body`` (zstd, as preprocess
    writes it), re-signed."""
    write_small_chunk(store, name, 0, bytes(COMPRESSORS["zstd"].encode(np.frombuffer(body, np.uint8))))


def _edit_strings(name: str, change: Callable[[list[bytes]], object],
                  count: Callable[[list[bytes]], int] | None = None) -> Callable[[Path], None]:
    def craft(s: Path) -> None:
        items = strings_of(s, name)
        change(items)
        write_strings(s, name, vlen_body(items, count(items) if count is not None else None))
    return craft


def _row0(value: bytes) -> Callable[[list[bytes]], None]:
    def change(items: list[bytes]) -> None:
        items[0] = value
    return change


def _strings_truncated(s: Path) -> None:
    """The item list cut 10 bytes short of the last string's end, the header count kept."""
    body = vlen_body(strings_of(s, CAPTION))
    write_strings(s, CAPTION, body[:-10])


def _captions_short(s: Path) -> None:
    """text.caption one row shorter than source_paths: its chunk, zarr.json and record agree."""
    items = strings_of(s, CAPTION)[:-1]
    rows = len(items)
    edit_array_doc(s, CAPTION, lambda d: (d.update(shape=[rows]),
                                          d["chunk_grid"]["configuration"].update(chunk_shape=[rows])))
    edit_attrs(s, lambda a: a["arrays"][CAPTION].update(length=rows, chunk=rows))
    write_strings(s, CAPTION, vlen_body(items))


def pairs_cases() -> list[Case]:
    """Crafted stores of captions and fields (format version 4), each re-signed."""
    return [
        ("caption not UTF-8", _edit_strings(CAPTION, _row0(b"caption \xff\xfe of a picture"))),
        ("caption holding a NUL", _edit_strings(CAPTION, _row0(b"caption\0of a picture"))),
        ("caption of 40 KiB", _edit_strings(CAPTION, _row0(b"x" * (40 << 10)))),
        ("vlen header declares 10**9 strings", _edit_strings(CAPTION, lambda v: None, lambda v: 10**9)),
        ("caption chunk zstd bomb", lambda s: write_small_chunk(s, CAPTION, 0, zstd_rle(2 << 30))),
        ("vlen item list truncated", _strings_truncated),
        ("texts naming ../x", lambda s: edit_attrs(s, lambda a: a["texts"].append("../x"))),
        ("texts naming a caption without its array", lambda s: edit_attrs(
            s, lambda a: a["texts"].append("alt"))),
        ("texts listing 10**6 names", lambda s: edit_attrs(s, lambda a: a.update(
            texts=[f"t{i}" for i in range(10**6)]))),
        ("fields dtype int8", lambda s: edit_attrs(s, lambda a: a["fields"][2].update(dtype="int8"))),
        ("field.width zarr.json float64", lambda s: edit_array_doc(
            s, fmt.field_array("width"), lambda d: d.update(data_type="float64", fill_value=0.0))),
        ("text.caption a row shorter than source_paths", _captions_short),
        ("version 3, texts present", lambda s: edit_attrs(s, lambda a: a.update(version=3))),
        ("string field of 10 KiB", _edit_strings(fmt.field_array("uid"), _row0(b"u" * (10 << 10)))),
        ("fields: score int64, its array float64", lambda s: edit_attrs(
            s, lambda a: a["fields"][1].update(dtype="int64"))),
        ("field.score frame declaring 2 GiB", lambda s: write_small_chunk(  # small enough to be fetched
            s, fmt.field_array("score"), 0, zstd_rle(1024, declared=2 << 30))),
        ("text.caption chunk links outside", _linked_pair_chunk),
    ]


def _linked_pair_chunk(s: Path) -> None:
    """text.caption/c/0 a link to a copy of itself outside the store: right bytes, wrong place."""
    chunk = fmt.small_chunk_path(s, CAPTION, 0)
    outside = s.parent / "outside" / "caption-chunk"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(outside)


def pairs_control_cases() -> list[Case]:
    """The pairs harness's controls: the honest store, a copy whose every caption and field chunk
    is written again with the same values in raw zstd blocks (other bytes) and re-signed (both
    read honestly), and one whose
    first caption says something else (valid: ``verify`` finds it sound, the reader's
    comparison must call it wrong)."""
    def resigned(s: Path) -> None:
        for name in (CAPTION, fmt.text_array("synthetic"), fmt.field_array("uid")):
            write_small_chunk(s, name, 0, zstd_raw(vlen_body(strings_of(s, name))))
        for name in (fmt.field_array("score"), fmt.field_array("width")):
            values = small_values(s, name)  # little-endian, as written
            write_small_chunk(s, name, 0, zstd_raw(values.tobytes()))

    return [
        ("honest", lambda s: None),
        ("re-signed", resigned),
        ("first caption changed", _edit_strings(CAPTION, lambda v: v.__setitem__(0, v[0] + b" and a cat"))),
    ]


# -- the property: every attribute field, every chunk --------------------------------------------------
def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every field in the attributes, containers included."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value[:3]):  # three entries of a list stand for the rest
            yield from leaves(child, (*path, i))


def mutations(value: Any) -> list[tuple[str, Any]]:
    """Another type, the other sign or zero, a huge size, deep nesting."""
    out: list[tuple[str, Any]] = [("null", None), ("nested", json.loads(nested(40)))]
    if isinstance(value, bool) or value is None or isinstance(value, float):
        out += [("number", 7), ("string", "x")]
    elif isinstance(value, int):
        out += [("string", str(value)), ("negative", -value - 1), ("zero", 0), ("huge", 10**12)]
    elif isinstance(value, str):
        out += [("number", 7), ("long", "x" * 100_000), ("path", "../" * 20 + "etc")]
    elif isinstance(value, list):
        out += [("object", {"x": 1}), ("empty", []), ("long", [value[0] if value else 0] * 100_000)]
    else:
        out += [("list", [1]), ("empty", {})]
    return out


def _set(attrs: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = attrs
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def field_cases(honest: Path) -> list[Case]:
    attrs = attrs_of(honest)
    cases: list[Case] = []
    for path in leaves({k: v for k, v in attrs.items() if k != "digest"}):
        current: Any = attrs
        for key in path:
            current = current[key]
        for kind, value in mutations(current):
            def craft(s: Path, path: tuple[Any, ...] = path, value: Any = value) -> None:
                edit_attrs(s, lambda a: _set(a, path, copy.deepcopy(value)))
            cases.append((f"{'.'.join(map(str, path))} {kind}", craft))
    return cases


def chunk_files(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")


def byte_cases(honest: Path) -> list[Case]:
    """Each chunk and shard file: a byte flipped at the start, middle and end of every tile's
    chunk and of the index, then cut short and grown, checksums left as written."""
    cases: list[Case] = []
    for path in chunk_files(honest):
        rel, size = path.relative_to(honest), path.stat().st_size
        positions = {0, size // 2, size - 1}
        if rel.parts[0] in fmt.SHARDED_ARRAYS:  # images and masks: each tile's chunk too
            f = ShardFile(honest, int(rel.parts[2]), attrs_of(honest)["shard_size"], rel.parts[0])
            positions |= {int(o) for o, n in f.index.table[: len(f)]}
            positions |= {int(o + n) - 1 for o, n in f.index.table[: len(f)]}
            f.close()
        cases += [(f"{rel} flip {at}", _damage(rel, "flip", at)) for at in sorted(positions)]
        cases += [(f"{rel} cut", _damage(rel, "cut", 5)), (f"{rel} grown", _damage(rel, "grow", 1))]
    return cases


def _damage(rel: Path, how: str, at: int) -> Callable[[Path], None]:
    """Byte ``at`` flipped, ``at`` bytes cut off the end, or ``at`` zero bytes added to it."""
    def craft(s: Path) -> None:
        data = bytearray((s / rel).read_bytes())
        if how == "flip":
            data[at] ^= 0x10
        elif how == "cut":
            del data[-at:]
        else:
            data += bytes(at)
        (s / rel).write_bytes(bytes(data))
    return craft


# -- the child process ---------------------------------------------------------------------------------
def _one_line(e: BaseException) -> tuple[str, str]:
    from tilefeed.store.errors import TilefeedError

    text = str(e)
    if isinstance(e, TilefeedError):
        return ("refused" if "\n" not in text else "multi-line"), text
    return "crash", f"{type(e).__name__}: {text[:300]}"


def _verify(store: Path) -> tuple[str, str]:
    from tilefeed.store.inspection import verify

    try:
        problems = verify(store, deep=True)
    except Exception as e:  # noqa: BLE001 - classified
        return _one_line(e)
    if any("\n" in p for p in problems):
        return "multi-line", problems[0]
    return ("refused", problems[0]) if problems else ("sound", "")


def _info(store: Path) -> tuple[str, str]:
    from tilefeed.store.inspection import info

    try:
        info(store)
    except Exception as e:  # noqa: BLE001
        return _one_line(e)
    return "ok", ""


Targets = tuple[np.ndarray, np.ndarray, np.ndarray]  # object rows, frames, masks


def _targets(reader: Any) -> Targets | None:
    """Every object row, frame and mask tile the reader serves (None: a store without targets)."""
    t = reader.targets
    if t is None:
        return None
    everyone = np.arange(len(reader))
    rows = np.concatenate([np.empty((0, 6)), *t.rows(everyone)])
    masks = np.empty((len(reader), t.tile, t.tile), np.uint8)
    if t.masks is not None:
        t.read_masks_into(everyone, masks)
    return rows, np.array(t.frames_of(everyone)), masks


def _read(store: Path, tiles: np.ndarray, labels: np.ndarray,
          targets: Targets | None = None) -> tuple[str, str]:
    from tilefeed.pipeline import StoreReader

    try:
        with StoreReader(store) as reader:
            if reader.labels.shape != labels.shape or (reader.labels != labels).any():
                return "wrong", "labels"
            for i in range(len(tiles)):
                if (reader.read(i) != tiles[i]).any():
                    return "wrong", f"sample {i}"
            if len(reader) != len(tiles):
                return "wrong", f"{len(reader)} samples"
            served = _targets(reader)
            if (served is None) != (targets is None):
                return "wrong", "targets " + ("absent" if served is None else "present")
            if served is not None and targets is not None:
                for what, a, b in zip(("objects", "frames", "masks"), served, targets, strict=True):
                    if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
                        return "wrong", what
    except Exception as e:  # noqa: BLE001
        return _one_line(e)
    return "honest", ""


PAIR_FIELDS = ("uid", "score", "width")  # every field make_pairs_store writes


def _pairs_read(store: Path) -> dict[str, list[Any]]:
    """Every caption and field array as ``read_pairs`` serves it, one row a source."""
    from tilefeed.store.documents import load_attrs
    from tilefeed.store.pairs import read_pairs

    pairs = read_pairs(store, load_attrs(store))
    served = {fmt.text_array(n): v.tolist() for n, v in pairs.texts.items()}
    return served | {fmt.field_array(n): v.tolist() for n, v in pairs.fields.items()}


def _pairs_loaded(store: Path) -> list[tuple[Any, ...]]:
    """One epoch of a Loader's captions and fields, one (caption, *fields) a sample, by id."""
    from tilefeed.pipeline import Loader

    by_id: dict[int, tuple[Any, ...]] = {}
    with Loader(store, 4, text="caption", fields=PAIR_FIELDS, with_index=True) as loader:
        for _, texts, fields, ids in loader:
            columns = [fields[n] if isinstance(fields[n], list) else fields[n].tolist() for n in PAIR_FIELDS]
            for k, i in enumerate(ids.tolist()):
                by_id[i] = (texts[k], *(c[k] for c in columns))
    return [by_id[i] for i in sorted(by_id)]


def _read_pairs(store: Path, tiles: np.ndarray, labels: np.ndarray,
                honest: dict[str, list[Any]]) -> tuple[str, str]:
    """The StoreReader's tiles and labels, then every caption and field ``read_pairs`` serves,
    each compared with the honest store's (the first array that differs named)."""
    outcome = _read(store, tiles, labels)
    if outcome[0] != "honest":
        return outcome
    try:
        served = _pairs_read(store)
    except Exception as e:  # noqa: BLE001
        return _one_line(e)
    for name in sorted(served.keys() | honest.keys()):
        if served.get(name) != honest.get(name):
            return "wrong", name
    return "honest", ""


def _load_pairs(store: Path, honest: list[tuple[Any, ...]]) -> tuple[str, str]:
    """A Loader's captions and fields over one epoch, compared with the honest store's."""
    try:
        served = _pairs_loaded(store)
    except Exception as e:  # noqa: BLE001
        return _one_line(e)
    if len(served) != len(honest):
        return "wrong", f"{len(served)} samples"
    for i, (a, b) in enumerate(zip(served, honest, strict=True)):
        if a != b:
            return "wrong", f"sample {i}"
    return "honest", ""


def _zarr(store: Path, tiles: np.ndarray) -> tuple[str, str]:
    """zarr-python's own read of the tiles (only JPEG tiles decode through tilefeed's codec)."""
    import zarr

    try:
        images = zarr.open_array(str(store / fmt.IMAGES), mode="r")
        for i in range(len(tiles)):
            if (np.asarray(images[i]) != tiles[i]).any():
                return "wrong", f"sample {i}"
    except MemoryError as e:
        return "crash", f"MemoryError: {e}"
    except Exception as e:  # noqa: BLE001 - any refusal but running out of memory is one
        return "refused", f"{type(e).__name__}: {str(e)[:200]}"
    return "honest", ""


class _Watch:
    """Files opened outside the store (links resolved), under the folder the cases live in."""

    def __init__(self, base: Path) -> None:
        self.base, self.store, self.seen = os.path.realpath(base) + os.sep, "", set[str]()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], str | Path):
            path = os.path.realpath(args[0]) + os.sep
            if path.startswith(self.base) and self.store and not path.startswith(self.store):
                self.seen.add(path)


class _Late(BaseException):
    """Out of time: not an Exception, so no handler under test takes it for a finding."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Late("out of time")


# -- ledgers -----------------------------------------------------------------------------------------
def _ledger(root: Path, population: list[int], ids: list[int], header: dict[str, Any] | None = None) -> None:
    from tilefeed.pipeline.audit.ledger import POPULATION, _pack

    (root / "epoch-000000").mkdir(parents=True)
    (root / POPULATION).write_bytes(_pack(np.array(population, dtype=np.int64)))
    meta = header or {"epoch": 0, "rank": 0, "run": "r", "world_size": 1, "batch_size": 2,
                      "drop_last": False, "complete": True, "delivered": len(ids)}
    head = json.dumps(meta).encode()
    packed = _pack(np.array(ids, dtype=np.int64))
    (root / "epoch-000000" / "r-rank00000.ledger").write_bytes(len(head).to_bytes(4, "little") + head + packed)


def _counted(root: Path, count: bytes, ids: list[int]) -> None:
    """A ledger of a whole store: its population is a sample count (``population.json``)."""
    from tilefeed.pipeline.audit.ledger import COUNT, POPULATION

    _ledger(root, [0], ids)
    (root / POPULATION).unlink()
    (root / COUNT).write_bytes(count)


def ledger_cases() -> list[Case]:
    import zlib

    from tilefeed.pipeline.audit.ledger import MAX_IDS

    deflate, zeros = zlib.compressobj(1), bytes(1 << 20)  # zero deltas past the cap, in a megabyte
    bomb = b"".join(deflate.compress(zeros) for _ in range((MAX_IDS * 4 >> 20) + 1)) + deflate.flush() + b"I"
    return [
        ("population holds id 10**12", lambda r: _ledger(r, [0, 10**12], [0])),
        ("record holds id 10**12", lambda r: _ledger(r, [0, 1], [0, 10**12])),
        ("record holds an id outside the population", lambda r: _ledger(r, [0, 1, 5], [0, 3])),
        ("world size 10**12", lambda r: _ledger(r, [0, 1], [0], {
            "epoch": 0, "rank": 0, "run": "r", "world_size": 10**12, "batch_size": 1,
            "drop_last": False, "complete": True, "delivered": 1})),
        ("population a zlib bomb", lambda r: _bombed(r, bomb)),
        ("population a count of 10**12", lambda r: _counted(r, b'{"samples": 1000000000000}', [0])),
        ("record past the population count", lambda r: _counted(r, b'{"samples": 2}', [0, 2])),
        ("population count not a count", lambda r: _counted(r, b'{"samples": -1}', [0])),
        ("population count a megabyte of JSON", lambda r: _counted(r, b"[" * (1 << 20), [0])),
    ]


def _bombed(root: Path, population: bytes) -> None:
    _ledger(root, [0], [0])
    (root / "population.npz").write_bytes(population)


def _audit(root: Path) -> tuple[str, str]:
    from tilefeed.pipeline.audit.ledger import audit

    try:
        epochs = audit(root)
    except Exception as e:  # noqa: BLE001
        return _one_line(e)
    return "ok", " ".join(f"once={e.once} twice={e.twice} never={e.never}" for e in epochs)


def run(honest: Path, work: Path, suite: str, budget_mb: int, seconds: float) -> None:
    from tilefeed.pipeline import StoreReader

    with StoreReader(honest) as reader:  # the honest pixels and labels, and every module warmed up
        tiles = np.stack([reader.read(i) for i in range(len(reader))])
        labels = reader.labels.copy()
        targets = _targets(reader)
        jpeg = reader.codec.name == "jpeg"
    pairs = suite.startswith("pairs")
    # the honest captions and fields (and the Loader's modules warmed up)
    honest_pairs = (_pairs_read(honest), _pairs_loaded(honest)) if pairs else None
    _verify(honest), _info(honest), _zarr(honest, tiles) if jpeg else None
    cases = {"rows": lambda: row_cases(attrs_of(honest)["codec"]), "fields": lambda: field_cases(honest),
             "bytes": lambda: byte_cases(honest), "ledger": ledger_cases,
             "targets": targets_cases, "targets-control": targets_control_cases,
             "semantic": semantic_cases, "boxes": boxes_cases,
             "pairs": pairs_cases, "pairs-control": pairs_control_cases,
             "pairs-fields": lambda: field_cases(honest), "pairs-bytes": lambda: byte_cases(honest)}[suite]()
    (work / "outside").mkdir(parents=True, exist_ok=True)
    watch = _Watch(work)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize")) * 1024
    limit = size + (budget_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    for n, (name, craft) in enumerate(cases):
        store = _fresh(honest, work, suite, n)
        craft(store)
        watch.store, watch.seen = os.path.realpath(store) + os.sep, set()
        started = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            if suite == "ledger":
                result: dict[str, Any] = {"case": name, "audit": _audit(store)}
            elif honest_pairs is not None:
                result = {"case": name, "verify": _verify(store), "info": _info(store),
                          "reader": _read_pairs(store, tiles, labels, honest_pairs[0]),
                          "loader": _load_pairs(store, honest_pairs[1])}
            else:
                result = {"case": name, "verify": _verify(store), "info": _info(store),
                          "reader": _read(store, tiles, labels, targets)}
            if jpeg and suite != "ledger":
                result["zarr"] = _zarr(store, tiles)
        except _Late:
            result = {"case": name, "late": True}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        watch.store = ""
        result.update(seconds=time.perf_counter() - started, outside=sorted(watch.seen))
        print(json.dumps(result), flush=True)


def _fresh(honest: Path, work: Path, suite: str, n: int) -> Path:
    """A copy of the honest store for case ``n``. The property's cases each change one file in
    place, so one copy serves them all, its files put back as they were (copying a tree per case
    costs more than the case)."""
    if suite in ("rows", "ledger", "targets", "targets-control", "semantic", "boxes", "pairs", "pairs-control"):
        store = work / f"case-{n}"
        store.mkdir() if suite == "ledger" else shutil.copytree(honest, store)
        return store
    store = work / "case"
    if not store.exists():
        shutil.copytree(honest, store)
    for path in honest.rglob("*"):
        if path.is_file():
            copy = store / path.relative_to(honest)
            data = path.read_bytes()
            if copy.read_bytes() != data:
                copy.write_bytes(data)
    return store


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
