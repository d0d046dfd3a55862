"""The work that runs on worker processes (local, or Dask workers on other machines).

Each task is idempotent: every file appears whole or not at all (a temporary name then a
rename in a folder, one put in a bucket), so a task whose worker died simply runs again. A
part's chunk bytes stream to its file as they are encoded, then its tile table goes to a file
of its own; its record (a small JSON document) is written last and marks the part done. Tasks
are sent bytes and numbers, not a Python object per source, and send back counts and arrays,
so that the driver's work per source stays next to nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
from numcodecs import blosc

from tilefeed.store import format as fmt
from tilefeed.store.codec import TileCodec
from tilefeed.preprocess.images import Rejected, Tiles, load_tiles
from tilefeed.store.errors import one_line
from tilefeed.preprocess.settings import Mode, StoreSettings, TargetKind, TileSettings
from tilefeed.preprocess.sources.pairs import members as pair_members
from tilefeed.preprocess.sources.source_list import decode_paths, split_paths
from tilefeed.preprocess.sources.targets import TargetJob
from tilefeed.preprocess.targets import (TileTargets, place_grid, place_targets, read_targets, split_records,
                                         target_file)
from tilefeed.store.codec import COMPRESSORS
from tilefeed.store.shard import ShardIndex
from tilefeed.store.storage import Storage, is_url, redact

# One row per tile of a part, in tile order: the source it came from, its chunk's size in the
# part's .bin file, its grid row and column, and the picture's box within the tile.
TILE_RECORD: Final = np.dtype([("source", "<i8"), ("size", "<i8"), ("row", "<i4"), ("col", "<i4"),
                               ("box", "<i4", (4,))])
# A store with targets: one more row per tile, in a table of its own: its objects (rows of the
# part's .objects file, in tile order), its mask chunk's size in the part's .masks file (0
# without masks) and its frame.
TARGET_RECORD: Final = np.dtype([("objects", "<i8"), ("mask", "<i8"), ("frame", "<f8", (4,))])
OBJECT_ROW: Final = np.dtype(("<f8", (6,)))  # x0, y0, x1, y1, category id, iscrowd


def part_name(part: int, suffix: str) -> str:
    return f"part-{part:07d}{suffix}"


@dataclass(frozen=True)
class PartRecord:
    """A done part, as its JSON record in the work folder says: its sources are [first, first +
    count), it made ``tiles`` tiles, ``rejects`` are (source, path, reason), ``seconds`` its
    worker's time per phase."""

    first: int
    count: int
    tiles: int
    rejects: tuple[tuple[int, str, str], ...]
    seconds: Mapping[str, float]
    objects: int = 0  # a store with targets: the objects its tiles hold
    outside: int = 0  # and the objects not stored, no part of their box in any tile (crop fit, grid gaps)

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "count": self.count, "tiles": self.tiles,
                "rejects": [list(r) for r in self.rejects], "seconds": dict(self.seconds),
                "objects": self.objects, "outside": self.outside}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PartRecord:
        """KeyError, TypeError or ValueError for a record of another form (an older writer's)."""
        return cls(first=record["first"], count=record["count"], tiles=record["tiles"],
                   rejects=tuple((source, path, reason) for source, path, reason in record["rejects"]),
                   seconds=dict(record["seconds"]), objects=int(record["objects"]),
                   outside=int(record["outside"]))


@dataclass(frozen=True)
class PartWritten:
    """What a part's task tells the driver: its source and reject counts, and the sizes of its
    chunks in tile order (little-endian int64 bytes: one object, not one per tile)."""

    count: int
    rejected: int
    sizes: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "rejected": self.rejected, "sizes": self.sizes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PartWritten:
        return cls(count=data["count"], rejected=data["rejected"], sizes=data["sizes"])


@dataclass(frozen=True)
class ShardWritten:
    """A shard a task wrote: its size in bytes, its sha256 read back as stored, and the seconds
    the copy and the digest took."""

    shard: int
    size: int
    sha256: str
    seconds: float
    digest_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "bytes": self.size, "sha256": self.sha256, "seconds": self.seconds,
                "digest_seconds": self.digest_seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardWritten:
        return cls(shard=data["shard"], size=data["bytes"], sha256=data["sha256"], seconds=data["seconds"],
                   digest_seconds=data["digest_seconds"])


@dataclass(frozen=True)
class TaskDone:
    """What a worker task sends back, as builtins (``to_dict``): its part (none for a task of
    shards alone) and the shards it wrote."""

    part: PartWritten | None
    shards: tuple[ShardWritten, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"part": None if self.part is None else self.part.to_dict(),
                "shards": [shard.to_dict() for shard in self.shards]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskDone:
        part = data["part"]
        return cls(part=None if part is None else PartWritten.from_dict(part),
                   shards=tuple(ShardWritten.from_dict(shard) for shard in data["shards"]))


class ShardSpec(NamedTuple):
    """One shard to write, as ``write_shard`` takes it: ``pieces`` are (part, byte offset, byte
    count) runs of the parts' chunk files, in sample order; ``sizes`` the chunk sizes that make
    up those runs; ``sync`` asks the writer to fsync it (a worker on another machine)."""

    shard: int
    per_shard: int
    pieces: list[tuple[int, int, int]]
    sizes: np.ndarray
    sync: bool
    array: str = fmt.IMAGES  # or MASKS: the runs are then of the parts' .masks files


def write_part(
    out: Storage, work: str, part: int, first: int, paths: bytes, tiles: TileSettings,
    store: StoreSettings, isolate: bool = False, targets: TargetJob | None = None, records: bytes = b"",
    members: bytes = b"",
) -> PartWritten:
    """Decode one part's sources, write their chunk bytes, then the part's record.

    ``paths`` is the part's slice of the source list as it is on disk (NUL-ended UTF-8 paths):
    one bytes object, not a Python object per source. The part's table (``.tiles``) holds one
    ``TILE_RECORD`` row per tile, its record the counts and the rejects; the driver is sent the
    counts and the chunk sizes, as bytes. Chunks stream to the file as they are encoded, so no
    part is ever held in memory whole. ``isolate`` decodes each image in a child process of its
    own: the retry of a part whose worker died, so that the image that kills a decoder is the
    only one lost.

    ``targets``: the part's images have targets (``records``: their COCO records, one JSON
    line a source, as the scan wrote them). Each image's are read and placed in its tile
    (``preprocess.targets``), or the image is rejected with the reason; the part then writes
    its objects (``.objects``), its mask chunks (``.masks``) and a ``TARGET_RECORD`` table
    (``.targets``) beside its tiles.

    ``members``: the part's lines of the scan's pair table (image-text sources). A source held
    inside another file (a tar member, a parquet row) is read from it here (``member_bytes``)
    and decoded from those bytes; any failure to read it rejects that source alone.
    """
    blosc.use_threads = False  # a worker process of the writer's: its parallelism is the pool's
    codec = TileCodec(store.codec, tiles.tile, store.quality)
    names = decode_paths(paths)
    exact = targets is not None
    per_source = split_records(records, len(names)) if targets is not None else []
    held = pair_members(members) if members else [None] * len(names)
    if len(held) != len(names):
        raise ValueError(f"part {part}: {len(held)} members for {len(names)} sources")
    parquet = _ParquetRows()
    rows: list[tuple[int, int, int, int, list[int]]] = []
    placed: list[TileTargets] = []
    rejects: list[tuple[int, str, str]] = []
    clock = time.perf_counter
    spent = dict.fromkeys(("decode", "encode", "write"), 0.0)  # seconds, for `bench preprocess`
    with out.writer(f"{work}/{part_name(part, '.bin')}") as f:
        for k, path in enumerate(names):
            t0 = clock()
            try:
                member = held[k]
                data = None if member is None else member_bytes(member, parquet)
                if isinstance(data, str):  # a parquet row that names a file instead of holding bytes
                    path_read, data = data, None
                else:
                    path_read = path
                result = (load_isolated(path_read, tiles, exact, data) if isolate
                          else load_tiles(path_read, tiles, exact, data))
                if targets is not None:
                    placed.extend(_placed_targets(targets, path, per_source[k], result, tiles))
            except Rejected as e:
                rejects.append((first + k, path, str(e)))
                continue
            finally:
                spent["decode"] += clock() - t0
            for pixels, row, col, box in zip(result.pixels, result.rows.tolist(), result.cols.tolist(),
                                             result.boxes.tolist(), strict=True):
                t1 = clock()
                payload, crc = codec.encode_parts(pixels)
                t2 = clock()
                f.write(payload)
                f.write(crc)
                spent["encode"] += t2 - t1
                spent["write"] += clock() - t2
                rows.append((first + k, len(payload) + len(crc), row, col, box))
        t3 = clock()
    spent["write"] += clock() - t3  # the part file's rename (or upload)
    table = np.array(rows, dtype=TILE_RECORD)
    objects = outside = 0
    if targets is not None:
        objects, outside = _write_targets(out, work, part, placed, targets.masks is not None)
    out.write(f"{work}/{part_name(part, '.tiles')}", table.tobytes())
    record = PartRecord(first, len(names), len(table), tuple(rejects), spent, objects, outside)
    # written last: its presence marks the part done
    out.write(f"{work}/{part_name(part, '.json')}", json.dumps(record.to_dict()).encode())
    return PartWritten(len(names), len(rejects), table["size"].tobytes())


def _write_targets(out: Storage, work: str, part: int, placed: list[TileTargets],
                   masks: bool) -> tuple[int, int]:
    """A part's targets beside its tiles: mask chunks, object rows, then the table (tile order);
    (objects stored, objects outside their tiles)."""
    table = np.zeros(len(placed), dtype=TARGET_RECORD)
    if masks:
        with out.writer(f"{work}/{part_name(part, '.masks')}") as f:
            for k, tile in enumerate(placed):
                assert tile.mask is not None
                payload = bytes(COMPRESSORS[fmt.MASK_CODEC].encode(np.ascontiguousarray(tile.mask)))
                f.write(payload)
                f.write(fmt.crc_bytes(payload))
                table["mask"][k] = len(payload) + fmt.CRC_NBYTES
    rows = [tile.objects for tile in placed]
    objects = np.concatenate(rows) if rows else np.zeros((0, 6))
    out.write(f"{work}/{part_name(part, '.objects')}", np.ascontiguousarray(objects, dtype="<f8").tobytes())
    table["objects"] = [len(r) for r in rows]
    if placed:  # a part whose every image was rejected has no rows to fill
        table["frame"] = [tile.frame for tile in placed]
    out.write(f"{work}/{part_name(part, '.targets')}", table.tobytes())
    return len(objects), sum(tile.outside for tile in placed)


def read_targets_table(out: Storage, work: str, part: int, tiles: int) -> np.ndarray:
    """A done part's ``TARGET_RECORD`` table; ValueError when it is not of its ``tiles`` tiles."""
    data = out.read(f"{work}/{part_name(part, '.targets')}")
    if len(data) != tiles * TARGET_RECORD.itemsize:
        raise ValueError(f"part {part}: its targets table is not of its {tiles} tiles")
    return np.frombuffer(data, dtype=TARGET_RECORD)


def read_objects(out: Storage, work: str, part: int, count: int) -> np.ndarray:
    """A done part's object rows, (count, 6) float64; ValueError when there are not ``count``."""
    data = out.read(f"{work}/{part_name(part, '.objects')}")
    if len(data) != count * OBJECT_ROW.itemsize:
        raise ValueError(f"part {part}: its objects file does not hold its {count} objects")
    return np.frombuffer(data, dtype="<f8").reshape(count, 6)


def _placed_targets(targets: TargetJob, path: str, record: bytes, result: Tiles,
                    tiles: TileSettings) -> list[TileTargets]:
    """One image's targets read and placed in each of its tiles (tile order); any failure of
    its annotations (not only the ones the readers name) rejects this image alone, with the
    reason."""
    try:
        found = read_targets(targets, path, record, result.size, len(result.placements))
        if tiles.mode is Mode.GRID:
            return place_grid(found, result.placements, tiles.tile, targets.masks)
        (where,) = result.placements
        return [place_targets(found, where, result.size, tiles.tile, targets.masks)]
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - anything one image's annotations raise: this image only
        raise Rejected(f"bad annotation: {type(e).__name__}: {one_line(e)}") from None


class _ParquetRows:
    """A part's reader of parquet members, made on its first one (pyarrow loads then)."""

    def __init__(self) -> None:
        self.reader: Any = None

    def read(self, member: dict[str, Any]) -> bytes | str:
        if self.reader is None:
            from tilefeed.preprocess.sources.parquet import MemberReader

            self.reader = MemberReader()
        return self.reader.read(member)  # type: ignore[no-any-return]


def member_bytes(member: dict[str, Any], parquet: _ParquetRows) -> bytes | str:
    """The bytes of a source held inside another file: a tar member (one ``pread``, or one
    ranged GET for a tar in a bucket) or a parquet row (its row group's image column, kept for
    the part's next rows); a parquet row whose bytes are null gives the path of the file it
    names instead.

    Raises
    ------
    Rejected
        The member cannot be read, with the reason (no credential in it: an object store's
        errors can quote its configuration).
    """
    try:
        if "tar" in member:
            from tilefeed.preprocess.sources.webdataset import read_member

            return read_member(member)
        if "parquet" in member:
            return parquet.read(member)
        raise ValueError(f"a member of no known kind: {sorted(member)}")
    except FileNotFoundError:
        raise Rejected("missing: the file holding it is not found") from None
    except OSError as e:
        raise Rejected(redact(f"unreadable: {e.strerror or one_line(e)}")) from None
    except MemoryError:
        raise Rejected("too large: out of memory while reading it") from None
    except Exception as e:  # noqa: BLE001 - anything reading one member fails with: this source only
        raise Rejected(redact(f"unreadable: {type(e).__name__}: {one_line(e)}")) from None


def run_part(
    out: Storage, work: str, part: int, first: int, paths: bytes, tiles: TileSettings,
    store: StoreSettings, shards: list[ShardSpec], targets: TargetJob | None = None, records: bytes = b"",
    members: bytes = b"", isolate: bool = False,
) -> dict[str, Any]:
    """Worker task: the shards that were ready when it was sent, then one part
    (``write_part``): one task, not two, for the driver to send and take back; a ``TaskDone``.
    ``isolate`` comes last: the pool sets it when it sends a part again after a worker died."""
    written = tuple(write_shard(out, work, spec) for spec in shards)
    done = write_part(out, work, part, first, paths, tiles, store, isolate, targets, records, members)
    return TaskDone(done, written).to_dict()


def write_shards(out: Storage, work: str, shards: list[ShardSpec]) -> dict[str, Any]:
    """Worker task: shards (``write_shard``); a ``TaskDone`` of no part."""
    return TaskDone(None, tuple(write_shard(out, work, spec) for spec in shards)).to_dict()


def source_sizes(paths: bytes, targets: TargetJob | None = None) -> bytes:
    """Worker task: the size of each file in ``paths`` (NUL-ended, as in the source list), -1
    for a URL or a file that cannot be read, as little-endian int64 bytes: the stats of the
    run's fingerprint, taken where the cores are. ``targets`` read from a file per image (YOLO's
    labels, semantic masks, with a COCO file too): those files' sizes follow, one per source, -1
    where absent."""
    sizes = []
    for path in split_paths(paths):
        if b":" in path and is_url(path.decode("utf-8", "surrogateescape")):
            sizes.append(-1)
            continue
        try:
            sizes.append(os.stat(path).st_size)
        except (OSError, ValueError):
            sizes.append(-1)
    if targets is not None and (targets.kind is not TargetKind.COCO or targets.mask_dir):
        for name in decode_paths(paths):
            try:
                sizes.append(os.stat(target_file(targets, name)[0]).st_size)
            except (OSError, ValueError):
                sizes.append(-1)
    return np.array(sizes, dtype="<i8").tobytes()


def read_part(out: Storage, work: str, part: int) -> tuple[PartRecord, np.ndarray]:
    """A done part's record and its ``TILE_RECORD`` table; ValueError when they do not agree,
    and ``PartRecord.from_dict``'s errors for a record of another form."""
    record = PartRecord.from_dict(json.loads(out.read(f"{work}/{part_name(part, '.json')}")))
    data = out.read(f"{work}/{part_name(part, '.tiles')}")
    if len(data) != record.tiles * TILE_RECORD.itemsize:
        raise ValueError(f"part {part}: its tile table is not of its {record.tiles} tiles")
    return record, np.frombuffer(data, dtype=TILE_RECORD)


def load_isolated(path: str, tiles: TileSettings, exact: bool = False, data: bytes | None = None) -> Tiles:
    """``load_tiles`` in a forked child: a segfault or the OOM killer there becomes a reject."""
    if not hasattr(os, "fork"):
        return load_tiles(path, tiles, exact, data)
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads: the child only decodes
        pid = os.fork()
    if pid == 0:  # the child: decode, send the outcome, leave without running any cleanup
        os.close(read_end)
        try:
            try:
                outcome: tuple[str, Any] = ("tiles", load_tiles(path, tiles, exact, data))
            except Rejected as e:
                outcome = ("rejected", str(e))
            with os.fdopen(write_end, "wb") as f:
                pickle.dump(outcome, f, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise Rejected(f"crashed the decoder (signal {os.WTERMSIG(status)})")
    if os.WEXITSTATUS(status) != 0 or not data:
        raise Rejected(f"crashed the decoder (exit status {os.WEXITSTATUS(status)})")
    kind, value = pickle.loads(data)
    if kind == "rejected":
        raise Rejected(value)
    return value  # type: ignore[no-any-return]


def write_shard(out: Storage, work: str, spec: ShardSpec) -> ShardWritten:
    """Copy chunk byte runs from part files into one shard, then read it back for its sha256.

    Locally each run is one in-kernel copy (copy_file_range) and ``spec.sync`` fsyncs here, for
    workers on other machines (the driver fsyncs those of its own machine, on a thread); in a
    bucket the shard is one put.
    """
    start = time.perf_counter()
    index = ShardIndex.packed(spec.per_shard, spec.sizes.tolist())
    suffix = ".bin" if spec.array == fmt.IMAGES else ".masks"
    runs = [(f"{work}/{part_name(part, suffix)}", offset, count) for part, offset, count in spec.pieces]
    key = fmt.shard_relpath(spec.shard, spec.array)
    size = out.concat(key, runs, index.encode(), sync=spec.sync)
    copied = time.perf_counter()
    digest = out.sha256(key)
    return ShardWritten(spec.shard, size, digest, copied - start, time.perf_counter() - copied)


def fsync(path: Path) -> float:
    """fsync ``path``; the seconds it took."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start
