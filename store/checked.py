"""A store's per-sample arrays, checked once per node and then memory-mapped by every process.

Opening a store checks it whole: every array against its digest, every shard's size, every
label and box in range. Done in each process, that costs time and memory that grow with the
store (`tilefeed bench scale` measures it), before the first batch. So the first process on
a node to open a store version checks it and leaves, in a private folder of the cache
(``checked/<key>``, this user's, mode 0700):

* the labels and boxes (and a store's targets: object offsets, objects, frames, their values
  checked), decoded, as ``.npy`` files every process maps (the page cache holds
  one copy for the node, and a process pays only for the pages its batches touch);
* a record of what was checked: the size, inode, device, modification and change times of every
  store file the check read, and the names of the ``.npy`` files it wrote.

A later open compares the record with a ``stat`` of each file (no file is read) and maps the
arrays. Anything that rewrites a file changes its change time, which no user can set, so a
file altered since, a link to another file, or a record of another store version fails the
comparison and the store is checked again. The folder is refused unless it is this user's and
private, and no name in it is followed as a link, so no other user can plant a record. Where
the cache cannot hold a record (unwritable, not private) the check runs in the process and the
arrays stay in its memory, as before, with a warning.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import threading
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from typing_extensions import Buffer

from tilefeed.store import format as fmt
from tilefeed.store.arrays import boxes_problem, check_array, labels_problem, read_small_array
from tilefeed.store.targets import TARGET_DTYPES, read_target_arrays, target_shapes
from tilefeed.store.attrs import StoreAttrs
from tilefeed.store.errors import StoreFormatError
from tilefeed.store.atomic import NOFOLLOW, create_new

RECORD_VERSION = 2  # 2: the targets' arrays too
RECORD = "record.json"
MAX_RECORD_BYTES = 64 << 20  # one stat line per file: 400 M samples make 400 k shards
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

Stat = tuple[int, int, int, int, int]  # size, inode, device, mtime_ns, ctime_ns


@dataclass(frozen=True)
class CheckedArrays:
    """What every read needs per sample, checked: labels (N,) and boxes (N, 4), int64; and a
    store with targets, their arrays (``targets.read_target_arrays``), by name."""

    labels: np.ndarray
    boxes: np.ndarray
    padded: bool  # some tile holds padding (pad fit, grid edges)
    mapped: bool  # from the node's record (False: checked and held in this process)
    targets: dict[str, np.ndarray] = field(default_factory=dict)


def checked_arrays(root: Path, store: StoreAttrs, location: str, cache_dir: Path, *,
                   shards_here: bool) -> CheckedArrays:
    """The labels and boxes of the store at ``root``, checked (``shards_here``: the shards are
    under ``root`` and are checked too; a bucket store's are checked by its cache)."""
    files = list(_checked_files(store, shards_here))
    try:
        folder = _private_folder(cache_dir, _key(root, store))
    except OSError as e:
        warnings.warn(f"the store check cannot be kept in {str(cache_dir)!r} ({e}): every process "
                      "checks the store and holds its arrays", stacklevel=3)
        return _check(root, store, location, files, shards_here)[0]
    try:
        found = _from_record(root, folder, store, files)
        if found is not None:
            return found
        arrays, before = _check(root, store, location, files, shards_here)
        if before is not None and before == _stats(root, files):  # nothing changed while it was read
            _keep(folder, store, files, before, arrays)
        return arrays
    finally:
        os.close(folder)


def _checked_files(store: StoreAttrs, shards_here: bool) -> Iterator[str]:
    """The store files a check reads, relative to its root."""
    yield "zarr.json"
    yield f"{fmt.IMAGES}/zarr.json"
    if shards_here:
        yield from (fmt.shard_relpath(s) for s in range(store.shards))
    if store.masks is not None:
        yield f"{fmt.MASKS}/zarr.json"
        if shards_here:
            yield from (fmt.shard_relpath(s, fmt.MASKS) for s in range(store.shards))
    for name, rec in store.arrays.items():
        yield f"{name}/zarr.json"
        yield from (fmt.small_chunk_path(Path(), name, i, rec.ndim).as_posix() for i in range(rec.chunks))


def _key(root: Path, store: StoreAttrs) -> str:
    """One folder per store location and version."""
    where = os.path.realpath(root)
    return hashlib.sha256(f"{where}\0{store.digest}".encode()).hexdigest()[:32]


def _stats(root: Path, files: Iterable[str]) -> list[Stat] | None:
    """Each file's stat, or None when one is missing."""
    out = []
    for name in files:
        try:
            st = os.stat(root / name)
        except OSError:
            return None
        out.append((st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns))
    return out


def _check(root: Path, store: StoreAttrs, location: str, files: list[str],
           shards_here: bool) -> tuple[CheckedArrays, list[Stat] | None]:
    """The whole check, in this process: every array against its digest, the shards for
    presence and size (the shards first: the sample count every other array is checked
    against comes from them), labels and boxes in range. Returns the stats taken before."""
    before = _stats(root, files)
    masks = (fmt.MASKS,) if store.masks is not None and shards_here else ()
    for name in (fmt.IMAGES, *masks, *store.arrays) if shards_here else store.arrays:
        if name not in (fmt.LABELS, fmt.BOXES, *TARGET_DTYPES):  # those are checked as they are read
            check_array(root, store, name)
    labels = read_small_array(root, store, fmt.LABELS).astype(np.int64, copy=False)
    boxes = read_small_array(root, store, fmt.BOXES).astype(np.int64, copy=False)
    for name, problem in ((fmt.LABELS, labels_problem(labels, len(store.classes))),
                          (fmt.BOXES, boxes_problem(boxes, store.tile))):
        if problem:
            raise StoreFormatError(f"{location}/{name}: {problem}")
    full = np.array([0, 0, store.tile, store.tile])
    targets = read_target_arrays(root, store, location)
    return CheckedArrays(labels, boxes, bool((boxes != full).any()), mapped=False, targets=targets), before


# -- the private folder ---------------------------------------------------------------------------
def _private_folder(cache_dir: Path, key: str) -> int:
    """A descriptor of ``cache_dir/checked/key``, each level made if absent and entered without
    following a link; OSError unless the last two are this user's and private."""
    os.makedirs(cache_dir, 0o700, exist_ok=True)
    fd = os.open(cache_dir, _DIR_FLAGS)
    try:
        for part in ("checked", key):
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise OSError(errno.EPERM, f"{part!r} is not this user's private folder (mode "
                              f"{stat.filemode(st.st_mode)}, uid {st.st_uid})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(folder: int, name: str, most: int) -> bytes | None:
    """A regular file of the folder, not a link; None when absent."""
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=folder)
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(most + 1)


def _from_record(root: Path, folder: int, store: StoreAttrs, files: list[str]) -> CheckedArrays | None:
    """The arrays the record vouches for, or None (absent, another version, a file changed)."""
    data = _read(folder, RECORD, MAX_RECORD_BYTES)
    if data is None or len(data) > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(data)
        if (record["version"] != RECORD_VERSION or record["digest"] != store.digest
                or record["files"] != files):
            return None
        if [tuple(s) for s in record["stats"]] != _stats(root, files):
            return None
        labels = _mapped(folder, record["labels"], (store.samples,))
        boxes = _mapped(folder, record["boxes"], (store.samples, 4))
        padded = record["padded"]
        targets = {name: _mapped(folder, record["targets"][name], shape, TARGET_DTYPES[name])
                   for name, shape in target_shapes(store).items()}
    except (ValueError, KeyError, TypeError, OSError):
        return None  # a record this code did not write whole: check again
    if labels is None or boxes is None or not isinstance(padded, bool) or any(
            values is None for values in targets.values()):
        return None
    return CheckedArrays(labels, boxes, padded, mapped=True,
                         targets={name: values for name, values in targets.items() if values is not None})


_INT64: Final = np.dtype("<i8")


def _mapped(folder: int, name: Any, shape: tuple[int, ...],
            expected: np.dtype[Any] = _INT64) -> np.ndarray | None:
    """The ``.npy`` file ``name`` of the folder, mapped read-only, if it holds ``expected``
    values of ``shape`` (int64 unless said)."""
    if not isinstance(name, str) or "/" in name or not name.endswith(".npy"):
        return None
    fd = os.open(name, os.O_RDONLY | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=folder)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            return None
        found, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        if found != shape or fortran or dtype != expected:
            return None
        if not np.prod(shape):  # nothing to map (a store whose tiles hold no objects)
            return np.empty(shape, dtype=expected)
        # the map checks the file holds the whole array (ValueError when it is short); a plain
        # array over it (the map its base), as gathering rows from a memmap costs its subclass's
        return np.asarray(np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape))


def _keep(folder: int, store: StoreAttrs, files: list[str], stats: list[Stat],
          arrays: CheckedArrays) -> None:
    """Write the arrays, then the record naming them (so a record never names a file that is
    not whole); earlier arrays of the folder go. Failing to keep them costs only a recheck."""
    token = uuid.uuid4().hex[:12]
    names = {"labels": f"labels-{token}.npy", "boxes": f"boxes-{token}.npy"}
    targets = {name: f"{name}-{token}.npy" for name in arrays.targets}
    try:
        saved: list[tuple[str, np.ndarray, np.dtype[Any]]] = [
            ("labels", arrays.labels, _INT64), ("boxes", arrays.boxes, _INT64),
            *((name, arrays.targets[name], TARGET_DTYPES[name]) for name in targets)]
        for key, values, dtype in saved:
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(values, dtype=dtype), allow_pickle=False)
            _write(folder, names.get(key) or targets[key], buf.getbuffer())
        record = {"version": RECORD_VERSION, "digest": store.digest, "files": files,
                  "stats": [list(s) for s in stats], "padded": arrays.padded, **names, "targets": targets}
        _write(folder, RECORD, json.dumps(record, separators=(",", ":")).encode())
        for entry in os.listdir(folder):
            if entry.endswith(".npy") and entry not in (*names.values(), *targets.values()):
                os.unlink(entry, dir_fd=folder)
    except OSError as e:  # a full disk, a folder made read-only
        warnings.warn(f"the store check could not be kept ({e}); the next process checks again",
                      stacklevel=4)


def _write(folder: int, name: str, data: Buffer) -> None:
    """``name`` in the folder, whole or not at all: a new temporary file (never a link's
    target), then a rename within the folder."""
    tmp = f".{name}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = create_new(tmp, 0o600, dir_fd=folder)
    with open(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
