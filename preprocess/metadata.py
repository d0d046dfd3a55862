"""The store's metadata, written last: the small arrays, the array documents and the
group's tilefeed attributes, whose presence marks the store complete.

The small arrays are written chunk by chunk as the parts' tile tables and the source list are
read in order, so that no more than a chunk of each is held at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numcodecs import VLenUTF8

from tilefeed.store import format as fmt
from tilefeed.store.attrs import ArrayRecord, ShardedRecord, StoreAttrs, TargetsRecord
from tilefeed.store.codec import COMPRESSORS
from tilefeed.store.shard import sha256_files
from tilefeed.preprocess.settings import Mode, StoreSettings, TargetKind, TileSettings, describe
from tilefeed.preprocess.sources.source_list import decode_paths
from tilefeed.preprocess.sources.finding import Listing
from tilefeed.preprocess.sources.pairs import PairTable, stored


_WIDTH = {name: (width,) for name, width in fmt.ROW_WIDTH.items()}  # rows of several values


@dataclass(frozen=True)
class PartTiles:
    """One part's tiles: its sources are [first, first + count); ``table`` is its
    ``tasks.TILE_RECORD`` rows, in tile order; with targets, ``targets`` its
    ``tasks.TARGET_RECORD`` rows and ``objects`` its (k, 6) object rows."""

    first: int
    count: int
    table: np.ndarray
    targets: np.ndarray | None = None
    objects: np.ndarray | None = None


class _RowWriter:
    """Rows appended to a zarr array a chunk at a time: only a chunk of them is held."""

    def __init__(self, array: object, chunk: int) -> None:
        self.array, self.chunk = array, chunk
        self.held: list[np.ndarray] = []
        self.count = self.start = 0

    def add(self, values: np.ndarray) -> None:
        self.held.append(values)
        self.count += len(values)
        while self.count >= self.chunk:
            block = np.concatenate(self.held)
            self.array[self.start : self.start + self.chunk] = block[: self.chunk]  # type: ignore[index]
            self.start += self.chunk
            self.count -= self.chunk
            self.held = [block[self.chunk :]]

    def close(self) -> None:
        if self.count:
            block = np.concatenate(self.held)
            self.array[self.start : self.start + len(block)] = block  # type: ignore[index]


def write_arrays(root: Path, listing: Listing, tiles: TileSettings, store: StoreSettings, samples: int,
                 parts: Iterable[PartTiles], objects: int = 0) -> list[str]:
    """The images array's document and every small array, streamed from ``parts``; the names
    of the small arrays, in the order the attributes list them. With targets, their arrays
    too (``objects``: how many object rows the parts hold), and the masks' document."""
    import zarr

    from tilefeed.store import zarr_codecs

    t = tiles.tile
    # zarr.create_array would clear the shards already in place, so let it write the images
    # array's metadata in a scratch folder and move just that document into the store.
    scratch = root / fmt.WORK_DIR / "metadata"
    zarr.create_array(
        str(scratch), name=fmt.IMAGES, shape=(samples, t, t, 3), dtype="uint8",
        chunks=(1, t, t, 3), shards=(store.shard_size, t, t, 3), fill_value=0, overwrite=True,
        dimension_names=["sample", "y", "x", "channel"], zarr_format=3,
        **zarr_codecs.images_codecs(store.codec, store.quality),
    )
    (root / fmt.IMAGES).mkdir(exist_ok=True)
    os.replace(scratch / fmt.IMAGES / "zarr.json", root / fmt.IMAGES / "zarr.json")
    target = listing.targets
    if target is not None and target.job.masks is not None:
        zarr.create_array(
            str(scratch), name=fmt.MASKS, shape=(samples, t, t), dtype="uint8", chunks=(1, t, t),
            shards=(store.shard_size, t, t), fill_value=0, overwrite=True, dimension_names=["sample", "y", "x"],
            zarr_format=3, **zarr_codecs.masks_codecs())
        (root / fmt.MASKS).mkdir(exist_ok=True)
        os.replace(scratch / fmt.MASKS / "zarr.json", root / fmt.MASKS / "zarr.json")
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    names = [fmt.LABELS, fmt.SOURCES, *((fmt.ROWS, fmt.COLS) if tiles.mode is Mode.GRID else ()), fmt.BOXES,
             *((fmt.FRAMES,) if target is not None else ())]
    arrays: dict[str, Any] = {name: _small_array(group, name, samples) for name in names}
    rows: dict[str, _RowWriter] = {}
    if target is not None and target.job.kind is not TargetKind.SEMANTIC:  # the sources with boxes
        rows = {name: _RowWriter(_small_array(group, name, length), fmt.SMALL_CHUNK)
                for name, length in ((fmt.OBJECT_OFFSETS, samples + 1), (fmt.OBJECTS, objects))}
        rows[fmt.OBJECT_OFFSETS].add(np.zeros(1, dtype=np.int64))
    for start, columns in _chunks(_columns(listing, parts, rows), fmt.SMALL_CHUNK):
        for name, array in arrays.items():
            array[start : start + len(columns[fmt.SOURCES])] = columns[name]
    for writer in rows.values():
        writer.close()
    chunk = min(len(listing), fmt.PATHS_CHUNK)
    _string_array(group, fmt.SOURCE_PATHS, len(listing), chunk)
    for index, first in enumerate(range(0, len(listing), chunk)):
        paths = decode_paths(listing.files.read(first, chunk))
        _write_chunk(root, fmt.SOURCE_PATHS, index, _paths_chunk(paths, chunk))
    pairs = _write_pairs(root, group, listing.pairs) if listing.pairs is not None else []
    return [*names, *rows, fmt.SOURCE_PATHS, *pairs]


PASS_BYTES = 512 << 20  # the string chunks one pass over the pair table may hold at their largest


def _write_pairs(root: Path, group: object, pairs: PairTable) -> list[str]:
    """The captions' and fields' arrays, one row per listed source; their names, captions
    first. Each pass over the scan's table parses each line once and has every array it writes
    hold its current chunk, writing it when full; the string arrays are spread over as few
    passes as keep their chunks, at the most their rows may hold, within PASS_BYTES."""
    strings: list[tuple[str, bool, str, int]] = []  # (name, text, array, chunk)
    numbers: list[tuple[str, str, _RowWriter]] = []  # (name, dtype, writer)
    names = []
    for name, text, dtype in [*((n, True, "string") for n in pairs.texts),
                              *((n, False, d) for n, d in pairs.fields)]:
        array = fmt.text_array(name) if text else fmt.field_array(name)
        if dtype == "string":
            chunk = min(pairs.count, fmt.TEXT_CHUNK if text else fmt.PATHS_CHUNK)
            _string_array(group, array, pairs.count, chunk)
            strings.append((name, text, array, chunk))
        else:
            numbers.append((name, dtype, _RowWriter(_small_array(group, array, pairs.count, dtype),
                                                    fmt.SMALL_CHUNK)))
        names.append(array)
    passes: list[list[tuple[str, bool, str, int]]] = [[]]
    held = 0
    for column in strings:
        most = column[3] * (fmt.MAX_TEXT_BYTES if column[1] else fmt.MAX_PATH_BYTES)
        if passes[-1] and held + most > PASS_BYTES:
            passes.append([])
            held = 0
        passes[-1].append(column)
        held += most
    for k, group_strings in enumerate(passes):
        if group_strings or (k == 0 and numbers):
            _pairs_pass(root, pairs, group_strings, numbers if k == 0 else [])
    return names


def _pairs_pass(root: Path, pairs: PairTable, strings: list[tuple[str, bool, str, int]],
                numbers: list[tuple[str, str, _RowWriter]]) -> None:
    """One pass over the pair table writing ``strings`` and ``numbers`` whole."""
    held: dict[str, list[str]] = {array: [] for _, _, array, _ in strings}
    written = dict.fromkeys(held, 0)  # chunks written, by array
    values: dict[str, list[Any]] = {name: [] for name, _, _ in numbers}
    rows = fmt.SMALL_CHUNK  # numbers are handed to their writers this many rows at a time
    for record in pairs.rows():
        texts, fields = record["t"], record["f"]
        for name, text, array, chunk in strings:
            column = held[array]
            column.append(stored((texts if text else fields).get(name), "string"))
            if len(column) == chunk:
                _write_chunk(root, array, written[array], _paths_chunk(column, chunk))
                written[array] += 1
                column.clear()
        for name, dtype, writer in numbers:
            kept = values[name]
            kept.append(stored(fields.get(name), dtype))
            if len(kept) == rows:
                writer.add(np.array(kept, dtype=dtype))
                kept.clear()
    for _, _, array, chunk in strings:
        if held[array]:
            _write_chunk(root, array, written[array], _paths_chunk(held[array], chunk))
    for name, dtype, writer in numbers:
        if values[name]:
            writer.add(np.array(values[name], dtype=dtype))
        writer.close()


def _string_array(group: object, name: str, length: int, chunk: int) -> None:
    """The document of a string array beside the tiles (its chunks are written by ``_write_chunk``)."""
    from tilefeed.store import zarr_codecs

    group.create_array(name, shape=(length,), dtype=np.dtypes.StringDType(),  # type: ignore[attr-defined]
                       chunks=(chunk,), overwrite=True, **zarr_codecs.small_array_codecs())


def _write_chunk(root: Path, name: str, index: int, data: bytes) -> None:
    path = fmt.small_chunk_path(root, name, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _small_array(group: object, name: str, length: int, dtype: str | None = None) -> object:
    """An array beside the tiles, chunked along its rows (an array of no rows: chunks of one)."""
    from tilefeed.store import zarr_codecs

    width = _WIDTH.get(name, ())
    return group.create_array(  # type: ignore[attr-defined]
        name, shape=(length, *width), dtype=dtype or fmt.SMALL_DTYPES[name],
        chunks=(max(1, min(length, fmt.SMALL_CHUNK)), *width),
        overwrite=True, **zarr_codecs.small_array_codecs())


_VLEN_UTF8 = VLenUTF8()


def _paths_chunk(paths: list[str], chunk: int) -> bytes:
    """One chunk of a string array (source_paths, captions), encoded as zarr encodes it (the
    array's codecs: vlen-utf8, zstd, crc32c; a last chunk filled up with the fill value, ""),
    without the conversions zarr makes of a string array first, which cost more than the
    encoding itself."""
    values = np.full(chunk, "", dtype=object)
    values[: len(paths)] = paths
    body = COMPRESSORS[fmt.SMALL_ARRAY_CODEC].encode(_VLEN_UTF8.encode(values))
    return bytes(body) + fmt.crc_bytes(body)


def _columns(listing: Listing, parts: Iterable[PartTiles],
             rows: dict[str, _RowWriter]) -> Iterator[dict[str, np.ndarray]]:
    """Each part's small-array values: a tile's label is its source's, read from the list. The
    object rows and their offsets go to ``rows`` as the parts pass."""
    ends = 0
    for part in parts:
        owners = part.table["source"]
        labels = listing.files.labels(part.first, part.count)[owners - part.first]
        columns = {fmt.LABELS: labels, fmt.SOURCES: owners, fmt.ROWS: part.table["row"],
                   fmt.COLS: part.table["col"], fmt.BOXES: part.table["box"]}
        if part.targets is not None:
            columns[fmt.FRAMES] = part.targets["frame"]
        if rows and part.targets is not None and part.objects is not None:
            offsets = ends + np.cumsum(part.targets["objects"], dtype=np.int64)
            ends = int(offsets[-1]) if len(offsets) else ends
            rows[fmt.OBJECT_OFFSETS].add(offsets)
            rows[fmt.OBJECTS].add(part.objects)
        yield columns


def _chunks(columns: Iterator[dict[str, np.ndarray]], rows: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """The columns regrouped into blocks of ``rows`` rows (the last may be shorter), each with
    its first row: one array chunk at a time is held, whatever the number of tiles."""
    held: list[dict[str, np.ndarray]] = []
    count = start = 0
    for part in columns:
        held.append(part)
        count += len(part[fmt.SOURCES])
        while count >= rows:
            block = {name: np.concatenate([p[name] for p in held]) for name in held[0]}
            yield start, {name: values[:rows] for name, values in block.items()}
            start += rows
            count -= rows
            held = [{name: values[rows:] for name, values in block.items()}]
    if count:
        yield start, {name: np.concatenate([p[name] for p in held]) for name in held[0]}


def write_attrs(
    root: Path, listing: Listing, tiles: TileSettings, store: StoreSettings, fingerprint: str,
    samples: int, rejects: list[tuple[str, str]], accepted: int, names: list[str],
    shard_bytes: list[int], shard_sha256: list[str], objects: int = 0,
    mask_shards: tuple[list[int], list[str]] | None = None,
) -> None:
    """The group's tilefeed attributes: written last, this write marks the store complete.
    ``shard_sha256``: the sha256 of each shard file, which a copy of a shard (a cache folder's,
    a download) must match before it is used. With targets: ``objects`` stored, and each masks
    shard's size and sha256."""
    import zarr

    targets = masks = None
    if listing.targets is not None:
        job = listing.targets.job
        targets = TargetsRecord(boxes=fmt.OBJECTS in names, masks=job.masks,
                                categories=listing.targets.categories, objects=objects)
        if mask_shards is not None:
            masks = ShardedRecord(tuple(mask_shards[0]), tuple(mask_shards[1]),
                                  sha256_files([root / fmt.MASKS / "zarr.json"]))

    attrs = StoreAttrs(
        samples=samples, sources=len(listing) + len(listing.skipped), accepted=accepted,
        rejected=len(rejects), tile=tiles.tile, codec=store.codec,
        quality=store.quality if store.codec is fmt.Codec.JPEG else None, shard_size=store.shard_size,
        shards=len(shard_bytes), shard_bytes=tuple(shard_bytes),
        images_metadata_sha256=sha256_files([root / fmt.IMAGES / "zarr.json"]),
        classes=tuple(listing.classes), made=describe(tiles, store),
        rejects=tuple(rejects[: fmt.MAX_LISTED_REJECTS]),
        fingerprint=fingerprint, arrays={name: _array_record(root, name) for name in names},
        digest="",  # sealed() sets it
        shard_sha256=tuple(shard_sha256), targets=targets, masks=masks,
        **_pairs_attrs(listing.pairs, len(rejects) > fmt.MAX_LISTED_REJECTS),
    ).sealed()
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    group.update_attributes({fmt.ATTRS_KEY: attrs.to_dict()})  # last: this write marks the store complete


def write_reject_arrays(root: Path, rejects: list[tuple[str, str]]) -> list[str]:
    """Every reject's path and reason as string arrays (``REJECT_ARRAYS``), where there are more
    than the attributes list; their names (none where the attributes list them all)."""
    import zarr

    if len(rejects) <= fmt.MAX_LISTED_REJECTS:
        return []
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    chunk = min(len(rejects), fmt.PATHS_CHUNK)
    for column, name in enumerate(fmt.REJECT_ARRAYS):
        _string_array(group, name, len(rejects), chunk)
        for index, first in enumerate(range(0, len(rejects), chunk)):
            # a reason is a line of ours, kept short enough for a row; a path is as listed
            values = [row[column] if column == 0 else row[column][: fmt.MAX_PATH_BYTES // 4]
                      for row in rejects[first : first + chunk]]
            _write_chunk(root, name, index, _paths_chunk(values, chunk))
    return list(fmt.REJECT_ARRAYS)


def _pairs_attrs(pairs: PairTable | None, overflow: bool = False) -> dict[str, Any]:
    """The attributes of a store of captions and fields, or of more rejects than the attributes
    list (version 4); any other store is written as version 3, as it was before they existed."""
    if pairs is None:
        if overflow:
            return {"version": fmt.PAIRS_VERSION, "texts": (), "fields": (), "labelled": True}
        return {"version": fmt.TILES_VERSION}
    return {"version": fmt.PAIRS_VERSION, "texts": pairs.texts, "fields": pairs.fields,
            "labelled": pairs.labelled}


def _array_record(root: Path, name: str) -> ArrayRecord:
    """What the attributes record of a small array as written, for readers and ``verify`` to
    check it against."""
    meta = json.loads((root / name / "zarr.json").read_text())
    length, chunk = meta["shape"][0], meta["chunk_grid"]["configuration"]["chunk_shape"][0]
    ndim = len(meta["shape"])
    chunks = fmt.small_chunk_paths(root, name, length, chunk, ndim)
    return ArrayRecord(name=name, length=length, chunk=chunk, ndim=ndim, chunks=len(chunks),
                       sha256=sha256_files(chunks), metadata_sha256=sha256_files([root / name / "zarr.json"]),
                       data_type=meta["data_type"] if fmt.is_pair_array(name) else "")
