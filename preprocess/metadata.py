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

import numpy as np
from numcodecs import VLenUTF8

from tilefeed.store import format as fmt
from tilefeed.store.attrs import ArrayRecord, StoreAttrs
from tilefeed.store.codec import COMPRESSORS
from tilefeed.store.shard import sha256_files
from tilefeed.preprocess.settings import StoreSettings, TileSettings, describe
from tilefeed.preprocess.sources.source_list import decode_paths
from tilefeed.preprocess.sources.finding import Listing


_WIDTH = {fmt.BOXES: (4,)}  # the arrays whose rows are not one value: a box is four


@dataclass(frozen=True)
class PartTiles:
    """One part's tiles: its sources are [first, first + count); ``table`` is its
    ``tasks.TILE_RECORD`` rows, in tile order."""

    first: int
    count: int
    table: np.ndarray


def write_arrays(root: Path, listing: Listing, tiles: TileSettings, store: StoreSettings, samples: int,
                 parts: Iterable[PartTiles]) -> list[str]:
    """The images array's document and every small array, streamed from ``parts``; the names
    of the small arrays, in the order the attributes list them."""
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
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    names = [fmt.LABELS, fmt.SOURCES, *((fmt.ROWS, fmt.COLS) if tiles.mode == "grid" else ()), fmt.BOXES]
    arrays = {
        name: group.create_array(name, shape=(samples, *_WIDTH.get(name, ())), dtype=fmt.SMALL_DTYPES[name],
                                 chunks=(min(samples, fmt.SMALL_CHUNK), *_WIDTH.get(name, ())),
                                 overwrite=True, **zarr_codecs.small_array_codecs())
        for name in names
    }
    for start, columns in _chunks(_columns(listing, parts), fmt.SMALL_CHUNK):
        for name, array in arrays.items():
            array[start : start + len(columns[fmt.SOURCES])] = columns[name]
    chunk = min(len(listing), fmt.PATHS_CHUNK)
    group.create_array(fmt.SOURCE_PATHS, shape=(len(listing),), dtype=np.dtypes.StringDType(),
                       chunks=(chunk,), overwrite=True, **zarr_codecs.small_array_codecs())
    for index, first in enumerate(range(0, len(listing), chunk)):
        path = fmt.small_chunk_path(root, fmt.SOURCE_PATHS, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_paths_chunk(decode_paths(listing.files.read(first, chunk)), chunk))
    return [*names, fmt.SOURCE_PATHS]


_VLEN_UTF8 = VLenUTF8()


def _paths_chunk(paths: list[str], chunk: int) -> bytes:
    """One chunk of source_paths, encoded as zarr encodes it (the array's codecs: vlen-utf8,
    zstd, crc32c; a last chunk filled up with the fill value, ""), without the conversions
    zarr makes of a string array first, which cost more than the encoding itself."""
    values = np.full(chunk, "", dtype=object)
    values[: len(paths)] = paths
    body = COMPRESSORS[fmt.SMALL_ARRAY_CODEC].encode(_VLEN_UTF8.encode(values))
    return bytes(body) + fmt.crc_bytes(body)


def _columns(listing: Listing, parts: Iterable[PartTiles]) -> Iterator[dict[str, np.ndarray]]:
    """Each part's small-array values: a tile's label is its source's, read from the list."""
    for part in parts:
        owners = part.table["source"]
        labels = listing.files.labels(part.first, part.count)[owners - part.first]
        yield {fmt.LABELS: labels, fmt.SOURCES: owners, fmt.ROWS: part.table["row"],
               fmt.COLS: part.table["col"], fmt.BOXES: part.table["box"]}


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
    shard_bytes: list[int], shard_sha256: list[str],
) -> None:
    """The group's tilefeed attributes: written last, this write marks the store complete.
    ``shard_sha256``: the sha256 of each shard file, which a copy of a shard (a cache folder's,
    a download) must match before it is used."""
    import zarr

    attrs = StoreAttrs(
        samples=samples, sources=len(listing) + len(listing.skipped), accepted=accepted,
        rejected=len(rejects), tile=tiles.tile, codec=store.codec_name,
        quality=store.quality if store.codec_name is fmt.Codec.JPEG else None, shard_size=store.shard_size,
        shards=len(shard_bytes), shard_bytes=tuple(shard_bytes),
        images_metadata_sha256=sha256_files([root / fmt.IMAGES / "zarr.json"]),
        classes=tuple(listing.classes), made=describe(tiles, store), rejects=tuple(rejects),
        fingerprint=fingerprint, arrays={name: _array_record(root, name) for name in names},
        digest="",  # sealed() sets it
        shard_sha256=tuple(shard_sha256),
    ).sealed()
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    group.update_attributes({fmt.ATTRS_KEY: attrs.to_dict()})  # last: this write marks the store complete


def _array_record(root: Path, name: str) -> ArrayRecord:
    """What the attributes record of a small array as written, for readers and ``verify`` to
    check it against."""
    meta = json.loads((root / name / "zarr.json").read_text())
    length, chunk = meta["shape"][0], meta["chunk_grid"]["configuration"]["chunk_shape"][0]
    ndim = len(meta["shape"])
    chunks = fmt.small_chunk_paths(root, name, length, chunk, ndim)
    return ArrayRecord(name=name, length=length, chunk=chunk, ndim=ndim, chunks=len(chunks),
                       sha256=sha256_files(chunks), metadata_sha256=sha256_files([root / name / "zarr.json"]))
