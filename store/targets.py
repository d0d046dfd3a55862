"""A store's targets, checked and read: each tile's objects (boxes, category ids, crowd flags),
its frame (the affine from source-image pixels to tile pixels) and its mask tile.

``open_targets`` reads the small arrays whole once every chunk of them is checked against its
crc32c and digest, then checks their values (offsets from 0 and non-decreasing to the object
count, every box inside its tile with positive width and height, every category in the
table, crowd flags 0 or 1, frames finite with positive scales, at most MAX_MASK_OBJECTS a
tile with instance masks) before anything indexes with them. Mask tiles are read like image
tiles: the shard's index checked once, each chunk's crc32c as it is read, its zstd frame's
declared size against the tile before it is decompressed, and its values against the kind. A
store in a bucket has its mask shards fetched into its mirror (size, index and sha256 checked
on the way) or its mask tiles read by ranged requests, as its images are (``remote``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.arrays import check_array, read_small_array
from tilefeed.store.attrs import StoreAttrs, TargetsRecord
from tilefeed.store.codec import COMPRESSORS, zstd_content_size
from tilefeed.store.errors import CorruptChunkError, StoreFormatError, one_line
from tilefeed.store.format import MaskKind
from tilefeed.store.shard import ShardFile, shard_digest_problem

if TYPE_CHECKING:
    from tilefeed.store.remote import RemoteStore


def objects_problem(offsets: np.ndarray, objects: np.ndarray, store: StoreAttrs) -> str:
    """'' when the object rows are what the format allows (see the module docstring)."""
    assert store.targets is not None
    if offsets.shape != (store.samples + 1,) or objects.shape != (store.targets.objects, 6):
        return "object_offsets or objects is not of the shape the attributes give"
    if offsets[0] != 0 or offsets[-1] != len(objects):
        return f"object_offsets must run from 0 to the object count {len(objects)}"
    # compared, not differenced: int64 differences wrap, and offsets running 0, 2**63-1, -2**62, ...
    # would difference to positive counts while leaving 0..M
    decrease = offsets[1:] < offsets[:-1]
    if decrease.any():
        return f"object_offsets decrease at sample {int(np.argmax(decrease))}"
    counts = np.diff(offsets)  # from 0 to M without decreasing: every count in 0..M
    most = store.max_tile_objects
    if most >= 0 and counts.size and counts.max() > most:
        return f"sample {int(np.argmax(counts > most))} holds more than {most} objects with instance masks"
    if not objects.size:
        return ""
    x0, y0, x1, y1, category, crowd = objects.T
    t = store.tile
    if not np.isfinite(objects).all():
        return "an object row is not finite"
    bad = (x0 < 0) | (y0 < 0) | (x1 > t) | (y1 > t) | (x1 <= x0) | (y1 <= y0)
    if bad.any():
        return (f"object {int(np.argmax(bad))}'s box {objects[np.argmax(bad), :4].tolist()} is not inside "
                f"its {t}x{t} tile with positive width and height")
    ids = np.array([i for i, _ in store.targets.categories], dtype=np.float64)
    bad = ~np.isin(category, ids)
    if bad.any():
        k = int(np.argmax(bad))
        return f"object {k}'s category {category[k]!r} is not in the category table"
    bad = (crowd != 0) & (crowd != 1)
    if bad.any():
        return f"object {int(np.argmax(bad))}'s iscrowd is {crowd[np.argmax(bad)]!r}, not 0 or 1"
    return ""


def frames_problem(frames: np.ndarray, samples: int) -> str:
    """'' when every frame is finite with positive scales."""
    if frames.shape != (samples, 4):
        return "frames is not of the shape the attributes give"
    bad = ~np.isfinite(frames).all(axis=1) | (frames[:, 0] <= 0) | (frames[:, 1] <= 0)
    if bad.any():
        k = int(np.argmax(bad))
        return f"sample {k}'s frame {frames[k].tolist()} is not finite with positive scales"
    return ""


def object_rows(offsets: np.ndarray | None, objects: np.ndarray | None,
                indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """Samples ``indices``' rows of a ragged object table (``offsets``, ``objects``): (k, 6)
    views, each sample's; empty rows for a table without boxes (None).

    Parameters
    ----------
    offsets, objects : numpy.ndarray or None
        The table: ``object_offsets`` (samples + 1) and its (M, 6) rows.
    indices : sequence of int or numpy.ndarray
        Samples of the table.

    Returns
    -------
    list of numpy.ndarray
        One (k, 6) float64 array a sample.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if offsets is None or objects is None:
        return [np.empty((0, 6)) for _ in idx]
    return [objects[offsets[i]:offsets[i + 1]] for i in idx.tolist()]


def object_counts(offsets: np.ndarray | None, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Samples ``indices``' object counts (int64) in a ragged table's ``offsets``; 0 without boxes.

    Parameters
    ----------
    offsets : numpy.ndarray or None
        The table's ``object_offsets``.
    indices : sequence of int or numpy.ndarray
        Samples of the table.

    Returns
    -------
    numpy.ndarray
        One count a sample.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if offsets is None:
        return np.zeros(len(idx), dtype=np.int64)
    return offsets[idx + 1] - offsets[idx]


class StoreTargets:
    """The targets of a store, checked: what the Loader reads beside the tiles.

    Attributes
    ----------
    record : TargetsRecord
        What the store holds: boxes, the mask kind, the category table.
    offsets : numpy.ndarray or None
        (N+1,) int64: tile i's objects are rows ``offsets[i]:offsets[i+1]`` of ``objects``
        (None without boxes).
    objects : numpy.ndarray or None
        (M, 6) float64 rows x0, y0, x1, y1 (tile pixels, XYXY), category id, iscrowd.
    frames : numpy.ndarray
        (N, 4) float64 sx, sy, tx, ty: tile_x = source_x * sx + tx, tile_y = source_y * sy + ty.
    """

    def __init__(self, root: Path, store: StoreAttrs, offsets: np.ndarray | None, objects: np.ndarray | None,
                 frames: np.ndarray, *, location: str = "", remote: RemoteStore | None = None) -> None:
        assert store.targets is not None
        self.record: TargetsRecord = store.targets
        self.location = location or str(root)
        # a store in object storage: ``root`` is its mirror, where mask shards are fetched to
        self.remote = remote
        # set by StoreReader.stream: a bucket store's mask tiles read by ranged requests, and
        # how many fetched mask shards stay mapped (a map holds an evicted file's disk space)
        self.ranged = False
        self.keep = store.shards
        self.offsets, self.objects, self.frames = offsets, objects, frames
        self.root, self.tile, self.shard_size = root, store.tile, store.shard_size
        self._store = store
        self._shards: list[ShardFile | None] = [None] * store.shards if store.masks is not None else []
        self._mapped: OrderedDict[int, None] = OrderedDict()  # remote: maps kept, oldest first
        self._lock = threading.Lock()
        # the values a mask may hold, by kind: semantic, the category ids and "ignore"; instance,
        # at most the tile's object count (checked per tile)
        self._allowed = np.zeros(256, dtype=bool)
        if self.record.masks is MaskKind.SEMANTIC:
            ids = [i for i, _ in self.record.categories if i < fmt.MASK_IGNORE]
            self._allowed[ids or slice(None)] = True  # no table: any id
            self._allowed[fmt.MASK_IGNORE] = True

    @property
    def masks(self) -> MaskKind | None:
        """The mask kind, or None when the store holds no masks."""
        return self.record.masks

    def rows(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Each sample's object rows, (k, 6) float64 (read-only views); empty rows without boxes."""
        return object_rows(self.offsets, self.objects, indices)

    def counts(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Each sample's object count, int64."""
        return object_counts(self.offsets, indices)

    def frames_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """(n, 4) float64: each sample's sx, sy, tx, ty."""
        return self.frames[np.asarray(indices, dtype=np.int64)]

    def to_source(self, boxes: np.ndarray, sample: int) -> np.ndarray:
        """Boxes (k, 4) XYXY in tile pixels of ``sample`` mapped back to its source image's pixels."""
        sx, sy, tx, ty = self.frames[sample].tolist()
        out = np.array(boxes, dtype=np.float64, copy=True)
        out[:, 0::2] = (out[:, 0::2] - tx) / sx
        out[:, 1::2] = (out[:, 1::2] - ty) / sy
        return out

    def _shard(self, shard: int) -> ShardFile:
        f = self._shards[shard]
        if f is None:
            if self.remote is not None:
                self.remote.mask_shard(shard)  # outside the lock: other threads keep reading
            with self._lock:
                f = self._shards[shard]
                if f is None:
                    f = ShardFile(self.root, shard, self.shard_size, fmt.MASKS)
                    self._shards[shard] = f
                    if self.remote is not None:
                        self._mapped[shard] = None
                        while len(self._mapped) > self.keep:
                            old, _ = self._mapped.popitem(last=False)
                            self._shards[old] = None
        return f

    def _decode(self, sample: int, out: np.ndarray) -> None:
        """Sample ``sample``'s mask tile into ``out``; a bucket store's cached shard that fails a
        chunk's check is dropped and fetched again, once (a copy damaged on this disk)."""
        shard, local = divmod(sample, self.shard_size)
        if self.remote is None:
            decode_mask(self._shard(shard), local, out)
            return
        f = self._shard(shard)  # fetched and checked whole: a failure here names the bucket's object
        try:
            decode_mask(f, local, out)
            return
        except CorruptChunkError:
            assert self.remote.mask_cache is not None
            with self._lock:
                self._shards[shard] = None
                self._mapped.pop(shard, None)
            self.remote.mask_cache.refetch(shard)
        try:
            decode_mask(self._shard(shard), local, out)
        except CorruptChunkError as e:  # named by its URL, not by the mirror's path
            raise CorruptChunkError(self.remote.where(e.shard), e.sample, e.detail) from None

    def read_masks_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """The mask tiles of ``indices`` decoded into ``out`` ((n, T, T) uint8, C-contiguous),
        each crc-checked, its declared size and its values checked: CorruptChunkError naming
        the shard file and the sample."""
        if self.record.masks is None:
            raise ValueError("this store holds no masks")
        idx = np.asarray(indices, dtype=np.int64)
        t = self.tile
        if out.dtype != np.uint8 or out.shape != (len(idx), t, t) or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous uint8 ({len(idx)}, {t}, {t}), "
                             f"got {out.dtype} {out.shape}")
        counts = self.counts(idx) if self.record.masks is MaskKind.INSTANCE else None
        samples = idx.tolist()
        if self.remote is not None and self.ranged:  # ranged requests: each chunk's crc32c checked
            assert self.remote.mask_ranges is not None
            payloads = self.remote.mask_ranges.payloads(samples)
            for k, (sample, payload) in enumerate(zip(samples, payloads, strict=True)):
                decode_mask_payload(payload, self._where(sample), sample, out[k])
        else:
            for k, sample in enumerate(samples):
                self._decode(sample, out[k])
        for k, sample in enumerate(samples):
            problem = self._values_problem(out[k], None if counts is None else int(counts[k]))
            if problem:
                raise CorruptChunkError(self._where(sample), sample, problem)

    def _where(self, sample: int) -> str:
        """The masks shard holding ``sample``, for messages: its path, or a bucket store's URL."""
        shard = sample // self.shard_size
        if self.remote is not None:
            return self.remote.storage.where(fmt.shard_relpath(shard, fmt.MASKS))
        return str(fmt.shard_path(self.root, shard, fmt.MASKS))

    def _values_problem(self, mask: np.ndarray, count: int | None) -> str:
        if count is not None:
            top = int(mask.max())
            return f"the mask holds instance id {top}, the tile has {count} objects" if top > count else ""
        bad = ~self._allowed[mask]
        if bad.any():
            return f"the mask holds class id {int(mask[bad][0])}, not in the category table"
        return ""

    def __getstate__(self) -> dict[str, object]:
        # maps and locks do not cross process boundaries: each process maps the shards anew
        state = self.__dict__.copy()
        state["_shards"] = [None] * len(self._shards)
        state["_mapped"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        for f in self._shards:
            if f is not None:
                f.close()
        self._shards = [None] * len(self._shards)


def decode_mask(f: ShardFile, local: int, out: np.ndarray) -> None:
    """Chunk ``local`` of the masks shard ``f`` decoded into ``out`` ((T, T) uint8), its crc32c
    checked and its zstd frame's declared size compared with the tile before decompressing."""
    decode_mask_payload(f.chunk(local), str(f.path), f.first + local, out)


def decode_mask_payload(payload: memoryview, where: str, sample: int, out: np.ndarray) -> None:
    """A mask chunk's payload (its crc32c already checked) decoded into ``out`` ((T, T) uint8),
    its zstd frame's declared size compared with the tile first: CorruptChunkError naming
    ``where`` (the shard) and ``sample``."""
    size = zstd_content_size(payload)
    if size != out.nbytes:
        what = "no decoded size" if size < 0 else f"{size} decoded bytes"  # not a frame, or a streamed one
        raise CorruptChunkError(where, sample, f"mask chunk declares {what}, the tile holds {out.nbytes}")
    try:
        COMPRESSORS[fmt.MASK_CODEC].decode(payload, out=out)
    except Exception as e:  # noqa: BLE001 - whatever the codec raises on a bad chunk is its reason
        raise CorruptChunkError(where, sample, f"mask does not decode: {one_line(e)}") from None


TARGET_DTYPES: Final = {fmt.OBJECT_OFFSETS: np.dtype("<i8"), fmt.OBJECTS: np.dtype("<f8"),
                         fmt.FRAMES: np.dtype("<f8")}


def target_shapes(store: StoreAttrs) -> dict[str, tuple[int, ...]]:
    """The shape of each of the targets' arrays read whole that the store holds, by name."""
    if store.targets is None:
        return {}
    shapes = {fmt.OBJECT_OFFSETS: (store.samples + 1,), fmt.OBJECTS: (store.targets.objects, 6),
              fmt.FRAMES: (store.samples, 4)}
    return {name: shapes[name] for name in store.targets.arrays if name in shapes}


def read_target_arrays(root: Path, store: StoreAttrs, location: str) -> dict[str, np.ndarray]:
    """The targets' arrays read whole (every chunk checked against its crc32c, each array
    against its digest), then their values checked (``objects_problem``, ``frames_problem``):
    StoreFormatError or CorruptChunkError naming the array. By name, as ``target_shapes``."""
    arrays = {name: read_small_array(root, store, name).astype(TARGET_DTYPES[name], copy=False).reshape(shape)
              for name, shape in target_shapes(store).items()}
    if fmt.OBJECTS in arrays:
        problem = objects_problem(arrays[fmt.OBJECT_OFFSETS], arrays[fmt.OBJECTS], store)
        if problem:
            raise StoreFormatError(f"{location}/{fmt.OBJECTS}: {problem}")
    problem = frames_problem(arrays[fmt.FRAMES], store.samples) if arrays else ""
    if problem:
        raise StoreFormatError(f"{location}/{fmt.FRAMES}: {problem}")
    return arrays


def open_targets(root: Path, store: StoreAttrs, location: str, *, remote: RemoteStore | None = None,
                 arrays: Mapping[str, np.ndarray] | None = None) -> StoreTargets | None:
    """The checked targets of the store at ``root``; None for a store without targets (any
    version-2 store). Without ``remote`` the masks' shards are under ``root`` and are checked
    for presence and size here; with it (a store in a bucket, ``root`` its mirror) they were
    checked against the bucket's listing, and are fetched as they are read.
    ``arrays``: the arrays as ``read_target_arrays`` gave them, with the masks' shards checked
    by the same check (the node's record of it, ``checked``); read and checked here otherwise."""
    if store.targets is None:
        return None
    if arrays is None:
        if store.masks is not None and remote is None:
            check_array(root, store, fmt.MASKS)
        arrays = read_target_arrays(root, store, location)
    for values in arrays.values():
        values.flags.writeable = False
    return StoreTargets(root, store, arrays.get(fmt.OBJECT_OFFSETS), arrays.get(fmt.OBJECTS),
                        arrays[fmt.FRAMES], location=location, remote=remote)


def targets_problems(root: Path, store: StoreAttrs,
                     remote: RemoteStore | None = None) -> tuple[list[str], StoreTargets | None]:
    """The value checks of ``open_targets`` as ``verify`` lines (its arrays' files already
    checked; ``remote``: a bucket store's, ``root`` its mirror), and the targets when they
    opened."""
    if store.targets is None:
        return [], None
    try:
        return [], open_targets(root, store, str(root), remote=remote)
    except (CorruptChunkError, StoreFormatError) as e:
        return [str(e)], None


def mask_shard_problems(root: Path, store: StoreAttrs, shard: int, deep: bool,
                        targets: StoreTargets | None, *, digest: bool = True) -> list[str]:
    """Every chunk of masks shard ``shard`` crc-checked (``deep``: decoded, and its values
    checked against ``targets`` where they opened), then (``digest``) the file's sha256: one
    line per problem."""
    path = fmt.shard_path(root, shard, fmt.MASKS)
    try:
        f = ShardFile(root, shard, store.shard_size, fmt.MASKS)
    except CorruptChunkError as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001 - a damaged store is a finding, never a traceback
        return [f"{path}: cannot read: {type(e).__name__}: {e}"]
    problems = []
    held = store.held(shard)
    if len(f) != held:
        problems.append(f"{path}: index lists {len(f)} chunks, expected {held}")
    mask = np.empty((store.tile, store.tile), dtype=np.uint8)
    for local in range(held):
        try:
            if deep:
                decode_mask(f, local, mask)
                if targets is not None:
                    sample = f.first + local
                    count = int(targets.counts([sample])[0]) if targets.masks is MaskKind.INSTANCE else None
                    problem = targets._values_problem(mask, count)
                    if problem:
                        problems.append(f"{path}: sample {sample}: {problem}")
            else:
                f.chunk(local)
        except CorruptChunkError as e:
            problems.append(str(e))
    f.close()
    if not digest:  # a download, checked against it as it came
        return problems
    try:
        problem = shard_digest_problem(path, store, shard, fmt.MASKS)
    except OSError as e:
        problem = f"cannot read: {e.strerror or e}"
    if problem:
        problems.append(f"{path}: {problem}")
    return problems
