"""A store's targets, checked and read: each tile's objects (boxes, category ids, crowd flags),
its frame (the affine from source-image pixels to tile pixels) and its mask tile.

``open_targets`` reads the small arrays whole once every chunk of them is checked against its
crc32c and digest, then checks their values (offsets from 0 and non-decreasing to the object
count, every box inside its tile with positive width and height, every category in the
table, crowd flags 0 or 1, frames finite with positive scales, at most MAX_MASK_OBJECTS a
tile with instance masks) before anything indexes with them. Mask tiles are read like image
tiles: the shard's index checked once, each chunk's crc32c as it is read, its zstd frame's
declared size against the tile before it is decompressed, and its values against the kind.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.arrays import check_array, read_small_array
from tilefeed.store.attrs import StoreAttrs, TargetsRecord
from tilefeed.store.codec import COMPRESSORS, zstd_content_size
from tilefeed.store.errors import CorruptChunkError, StoreFormatError, one_line
from tilefeed.store.format import MaskKind
from tilefeed.store.shard import ShardFile, shard_digest_problem


def objects_problem(offsets: np.ndarray, objects: np.ndarray, store: StoreAttrs) -> str:
    """'' when the object rows are what the format allows (see the module docstring)."""
    assert store.targets is not None
    if offsets.shape != (store.samples + 1,) or objects.shape != (store.targets.objects, 6):
        return "object_offsets or objects is not of the shape the attributes give"
    if offsets[0] != 0 or offsets[-1] != len(objects):
        return f"object_offsets must run from 0 to the object count {len(objects)}"
    counts = np.diff(offsets)
    if (counts < 0).any():
        return f"object_offsets decrease at sample {int(np.argmax(counts < 0))}"
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
                 frames: np.ndarray, *, location: str = "", masks_here: bool = True) -> None:
        assert store.targets is not None
        self.record: TargetsRecord = store.targets
        self.location = location or str(root)
        # a store in object storage: its boxes and frames are read, its masks' shards are not
        self.masks_here = masks_here
        self.offsets, self.objects, self.frames = offsets, objects, frames
        self.root, self.tile, self.shard_size = root, store.tile, store.shard_size
        self._store = store
        self._shards: list[ShardFile | None] = [None] * store.shards if store.masks is not None else []
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
        if self.offsets is None or self.objects is None:
            return [np.empty((0, 6)) for _ in indices]
        off = self.offsets
        return [self.objects[off[i]:off[i + 1]] for i in np.asarray(indices, dtype=np.int64).tolist()]

    def counts(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Each sample's object count, int64."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.offsets is None:
            return np.zeros(len(idx), dtype=np.int64)
        return self.offsets[idx + 1] - self.offsets[idx]

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
            with self._lock:
                f = self._shards[shard]
                if f is None:
                    f = ShardFile(self.root, shard, self.shard_size, fmt.MASKS)
                    self._shards[shard] = f
        return f

    def read_masks_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """The mask tiles of ``indices`` decoded into ``out`` ((n, T, T) uint8, C-contiguous),
        each crc-checked, its declared size and its values checked: CorruptChunkError naming
        the shard file and the sample."""
        if self.record.masks is None:
            raise ValueError("this store holds no masks")
        if not self.masks_here:
            raise StoreFormatError(f"{self.location}: masks of a store in object storage are not read yet; "
                                   "copy the store to a folder")
        idx = np.asarray(indices, dtype=np.int64)
        t = self.tile
        if out.dtype != np.uint8 or out.shape != (len(idx), t, t) or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous uint8 ({len(idx)}, {t}, {t}), "
                             f"got {out.dtype} {out.shape}")
        counts = self.counts(idx) if self.record.masks is MaskKind.INSTANCE else None
        for k, sample in enumerate(idx.tolist()):
            shard, local = divmod(sample, self.shard_size)
            f = self._shard(shard)
            decode_mask(f, local, out[k])
            problem = self._values_problem(out[k], None if counts is None else int(counts[k]))
            if problem:
                raise CorruptChunkError(str(f.path), sample, problem)

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
    payload = f.chunk(local)
    size = zstd_content_size(payload)
    if size != out.nbytes:
        raise CorruptChunkError(str(f.path), f.first + local,
                                f"mask chunk declares {size} decoded bytes, the tile holds {out.nbytes}")
    try:
        COMPRESSORS[fmt.MASK_CODEC].decode(payload, out=out)
    except Exception as e:  # noqa: BLE001 - whatever the codec raises on a bad chunk is its reason
        raise CorruptChunkError(str(f.path), f.first + local, f"mask does not decode: {one_line(e)}") from None


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


def open_targets(root: Path, store: StoreAttrs, location: str, *, shards_here: bool = True,
                 arrays: Mapping[str, np.ndarray] | None = None) -> StoreTargets | None:
    """The checked targets of the store at ``root``; None for a store without targets (any
    version-2 store). ``shards_here``: the masks' shards are under ``root`` and are checked for
    presence and size here (a store in a bucket: its boxes and frames are read, its masks are
    not, and reading them is refused in one line).
    ``arrays``: the arrays as ``read_target_arrays`` gave them, with the masks' shards checked
    by the same check (the node's record of it, ``checked``); read and checked here otherwise."""
    if store.targets is None:
        return None
    if arrays is None:
        if store.masks is not None and shards_here:
            check_array(root, store, fmt.MASKS)
        arrays = read_target_arrays(root, store, location)
    for values in arrays.values():
        values.flags.writeable = False
    return StoreTargets(root, store, arrays.get(fmt.OBJECT_OFFSETS), arrays.get(fmt.OBJECTS),
                        arrays[fmt.FRAMES], location=location, masks_here=shards_here)


def targets_problems(root: Path, store: StoreAttrs) -> tuple[list[str], StoreTargets | None]:
    """The value checks of ``open_targets`` as ``verify`` lines (its arrays' files already
    checked), and the targets when they opened."""
    if store.targets is None:
        return [], None
    try:
        return [], open_targets(root, store, str(root))
    except (CorruptChunkError, StoreFormatError) as e:
        return [str(e)], None


def mask_shard_problems(root: Path, store: StoreAttrs, shard: int, deep: bool,
                        targets: StoreTargets | None) -> list[str]:
    """Every chunk of masks shard ``shard`` crc-checked (``deep``: decoded, and its values
    checked against ``targets`` where they opened), then the file's sha256: one line per problem."""
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
    try:
        problem = shard_digest_problem(path, store, shard, fmt.MASKS)
    except OSError as e:
        problem = f"cannot read: {e.strerror or e}"
    if problem:
        problems.append(f"{path}: {problem}")
    return problems
