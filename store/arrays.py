"""Every array of a store checked against what the attributes record: each zarr.json against
its sha256 and the record, the shards' sizes, each small array's chunks for presence, size,
crc32c and sha256; and the small arrays read whole once checked."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from stat import S_ISREG
from typing import Any

import numpy as np

from tilefeed.store.attrs import ArrayRecord, StoreAttrs, store_attrs
from tilefeed.store.codec import COMPRESSORS, zstd_content_size
from tilefeed.store.documents import (
    images_document_problem,
    masks_document_problem,
    parse_document,
    small_document_problem,
)
from tilefeed.store.errors import CorruptChunkError, one_line
from tilefeed.store.format import (
    CRC_NBYTES,
    IMAGES,
    MASKS,
    MAX_METADATA_BYTES,
    SMALL_ARRAY_CODEC,
    crc_bytes,
    inside,
    shard_path,
)
from tilefeed.store.shard import sha256_files


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
    if name == IMAGES:
        recorded = store.images_metadata_sha256
    elif name == MASKS:
        assert store.masks is not None
        recorded = store.masks.metadata_sha256
    else:
        recorded = store.arrays[name].metadata_sha256
    if hashlib.sha256(data).hexdigest() != recorded:
        return [(str(path), "differs from what was written (sha256 mismatch)")]
    doc, problem = parse_document(data)
    if not problem:
        if name == IMAGES:
            problem = images_document_problem(doc, store)
        elif name == MASKS:
            problem = masks_document_problem(doc, store)
        else:
            problem = small_document_problem(doc, store.arrays[name])
    return [(str(path), problem)] if problem else []


def _shard_problems(root: Path, store: StoreAttrs, shard_sizes: Sequence[int | None] | None,
                    name: str = IMAGES) -> list[tuple[str, str]]:
    problems = []
    recorded = store.masks.shard_bytes if name == MASKS and store.masks is not None else store.shard_bytes
    for shard, expected in enumerate(recorded):
        path = shard_path(root, shard, name)
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
    if name != IMAGES and name not in store.arrays and not (name == MASKS and store.masks is not None):
        return [(str(root / name), "not recorded in the store's attributes")]
    problems = _metadata_problems(root, store, name)
    if name in (IMAGES, MASKS):
        return problems + _shard_problems(root, store, shard_sizes, name)
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
            COMPRESSORS[SMALL_ARRAY_CODEC].decode(payload, out=out)
        except Exception as e:  # noqa: BLE001 - whatever the codec raises on a bad chunk is its reason
            raise CorruptChunkError(str(path), None, f"does not decode: {one_line(e)}") from None
        parts.append(out.view(np.dtype(rec.dtype).newbyteorder("<")))
    if not parts:  # an array of no rows (a store whose tiles hold no objects)
        parts.append(np.empty(0, dtype=np.dtype(rec.dtype).newbyteorder("<")))
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
