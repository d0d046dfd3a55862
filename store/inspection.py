"""Describe a store (``tilefeed info``) and check it end to end (``tilefeed verify``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.arrays import array_problems, boxes_problem, labels_problem, read_small_array
from tilefeed.store.pairs import read_pairs
from tilefeed.store.attrs import StoreAttrs
from tilefeed.store.codec import TileCodec
from tilefeed.store.documents import load_attrs
from tilefeed.store.shard import ShardFile, shard_digest_problem
from tilefeed.store.targets import StoreTargets, mask_shard_problems, targets_problems
from tilefeed.store.cache_dir import default_cache_dir, make_cache_dir
from tilefeed.store.remote import RemoteStore
from tilefeed.store.location import open_storage
from tilefeed.store.storage import is_url, local_path
from tilefeed.store.errors import CorruptChunkError


def _open(store: str | Path, storage_options: dict[str, Any] | None,
          cache_dir: Path | None = None) -> tuple[Path, str, RemoteStore | None]:
    """(folder with the metadata, name for messages, the remote side of a bucket store). Neither
    ``info`` nor ``verify`` reads a cached shard, so a store without shard digests is not warned
    about here."""
    if is_url(store):
        remote = RemoteStore(str(store), storage_options, cache_dir, check=False, warn=False)
        return remote.mirror, remote.storage.url, remote
    open_storage(store, storage_options)  # refuses options given for a folder
    return local_path(store), str(local_path(store)), None


@dataclass(frozen=True)
class StoreInfo:
    """What ``tilefeed info`` says of a store: its attributes as they are recorded (plain JSON
    values), with where it is and the bytes it takes.

    Attributes
    ----------
    path : str
        The folder, or the bucket URL.
    format : str
        The format's name and version, ``"tilefeed v2"``.
    samples, sources, accepted, rejected : int
        Tiles; sources read; sources that made tiles; sources refused.
    classes : list of str
        The class names, in label order.
    tile : list of int
        The tile's shape, ``[T, T, 3]``.
    codec : str
        The tile codec's name.
    quality : int or None
        The JPEG quality (None for a lossless codec).
    shard_size, shards : int
        Tiles per shard; shard files.
    bytes : int
        The bytes on disk (in the bucket, for a bucket store).
    made : dict
        The settings the store was made with.
    rejects : list of dict
        Each refused source's ``path`` and ``reason``.
    targets : dict or None
        A store with targets: ``boxes`` (bool), ``masks`` (None, "semantic" or "instance"),
        ``objects`` (how many), ``categories`` (each ``id`` and ``name``); None without.
    texts : list of str
        The caption names the store holds (empty without captions).
    fields : list of dict
        Each metadata field's ``name`` and ``dtype`` (int64, float64 or string).
    labelled : bool
        The labels are class labels (False: an image-text store without them).
    """

    path: str
    format: str
    samples: int
    sources: int
    accepted: int
    rejected: int
    classes: list[str]
    tile: list[int]
    codec: str
    quality: int | None
    shard_size: int
    shards: int
    bytes: int
    made: dict[str, Any]
    rejects: list[dict[str, str]]
    targets: dict[str, Any] | None = None
    texts: list[str] = field(default_factory=list)
    fields: list[dict[str, str]] = field(default_factory=list)
    labelled: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, in this order: ``tilefeed info --json``'s object."""
        return asdict(self)


# the fields of StoreInfo taken from the attributes as they are recorded
RECORDED = ("samples", "sources", "accepted", "rejected", "classes", "tile", "codec", "quality",
            "shard_size", "shards", "made", "rejects")


def bytes_on_disk(path: Path) -> int:
    """The bytes of a file, or of every file under a folder (links neither followed nor counted)."""
    if path.is_file() and not path.is_symlink():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def info(store: str | Path, storage_options: dict[str, Any] | None = None) -> StoreInfo:
    """The store's description (``tilefeed info``), from its attributes as recorded."""
    root, name, remote = _open(store, storage_options)
    attrs = load_attrs(root)
    on_disk = remote.bytes if remote is not None else bytes_on_disk(root)
    return StoreInfo(path=name, format=f"{attrs['format']} v{attrs['version']}", bytes=on_disk,
                     targets=attrs.get("targets"), texts=list(attrs.get("texts", [])),
                     fields=list(attrs.get("fields", [])), labelled=attrs.get("labelled", True),
                     **{key: attrs[key] for key in RECORDED})


def printable(text: str) -> str:
    """``text`` with newlines and other control characters escaped, for one-line text output."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def verify(
    store: str | Path, *, deep: bool = False, on_shard: Callable[[], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Every problem found, one line each naming the file (and sample); empty when sound.

    Every array is checked against what the attributes record (metadata digest, each chunk
    present and crc32c-checked, the whole array's digest; shard sizes), then every tile, and
    each shard's sha256 where the store records them. A bucket store is checked as the bucket
    holds it: every object is downloaded afresh into a scratch folder (never read from the cache
    folder, whose copies are not the bucket's objects), each shard checked as it downloads and
    removed once its tiles are.
    """
    if not is_url(store):
        return _verify(store, deep, on_shard, storage_options, None)
    cache = default_cache_dir()
    make_cache_dir(cache)  # the scratch folder goes beside the cache: the disk meant for shards
    scratch = Path(tempfile.mkdtemp(prefix=".verify-", dir=cache))  # a dot: no cache evicts it
    try:
        return _verify(store, deep, on_shard, storage_options, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _verify(store: str | Path, deep: bool, on_shard: Callable[[], None] | None,
            storage_options: dict[str, Any] | None, scratch: Path | None) -> list[str]:
    root, _, remote = _open(store, storage_options, scratch)
    try:
        return _problems(store, root, remote, deep, on_shard)
    finally:
        if remote is not None:
            remote.close()


def _problems(store: str | Path, root: Path, remote: RemoteStore | None, deep: bool,
              on_shard: Callable[[], None] | None) -> list[str]:
    meta = StoreAttrs.from_dict(load_attrs(root), f"store {str(store)!r}")
    # the shards first: their sizes bound every other count
    names = [fmt.IMAGES, *([fmt.MASKS] if meta.masks is not None else []), *meta.arrays]
    problems: list[str] = []
    if remote is not None:
        problems += [f"{path}: {detail}" for path, detail in remote.problems()]
    for name in names if remote is None else ():
        problems += [f"{path}: {detail}" for path, detail in array_problems(root, meta, name)]
    if not problems:  # zarr-python parses the documents only once they are known to be sound
        problems += _zarr_problems(root, names)
    targets: StoreTargets | None = None
    if not problems:
        problems += _small_array_problems(root, meta)
        found, targets = targets_problems(root, meta, remote)
        problems += found
    if remote is not None:  # the scratch folder's paths named by URL
        problems = [remote.where(p) for p in problems]
    codec = meta.tile_codec
    for shard in range(meta.shards):
        if remote is not None:
            if remote.shard_sizes[shard] is not None:  # a missing one is reported above
                problems += [remote.where(p)  # mirror paths named by URL
                             for p in _fetch_and_verify(remote, shard, meta, codec, deep)]
        elif fmt.shard_path(root, shard).is_file():  # a missing one is reported above
            problems += _verify_shard(root, shard, meta, codec, deep)
        if meta.masks is not None and remote is not None:
            assert remote.mask_cache is not None
            if remote.mask_sizes[shard] is not None:  # a missing one is reported above
                problems += [remote.where(p)
                             for p in _fetch_and_verify_masks(remote, shard, meta, deep, targets)]
        elif meta.masks is not None and fmt.shard_path(root, shard, fmt.MASKS).is_file():
            problems += mask_shard_problems(root, meta, shard, deep, targets)
        if on_shard:
            on_shard()
    return problems


def _small_array_problems(root: Path, meta: StoreAttrs) -> list[str]:
    """Labels that name no class, boxes outside their tile, captions and fields that do not
    decode (strings not UTF-8 or too long, a NUL in a caption)."""
    try:
        labels = read_small_array(root, meta, fmt.LABELS)
        boxes = read_small_array(root, meta, fmt.BOXES)
        read_pairs(root, meta)
    except CorruptChunkError as e:
        return [str(e)]
    found = [(fmt.LABELS, labels_problem(labels, len(meta.classes))),
             (fmt.BOXES, boxes_problem(boxes, meta.tile))]
    return [f"{root / name}: {problem}" for name, problem in found if problem]


def _zarr_problems(root: Path, names: list[str]) -> list[str]:
    """What keeps zarr-python (any Zarr v3 client) from opening the group and its arrays."""
    import zarr

    try:
        group = zarr.open_group(str(root), mode="r", zarr_format=3)
    except Exception as e:  # noqa: BLE001 - any failure to open is a finding
        return [f"{root / 'zarr.json'}: zarr cannot open the group: {type(e).__name__}: {e}"]
    problems = []
    for name in names:
        try:
            group[name]
        except Exception as e:  # noqa: BLE001
            problems.append(f"{root / name / 'zarr.json'}: zarr cannot open it: {type(e).__name__}: {e}")
    return problems


def _fetch_and_verify(remote: RemoteStore, shard: int, meta: StoreAttrs, codec: TileCodec,
                      deep: bool) -> list[str]:
    """The shard downloaded from the bucket into the scratch folder (its size, index and sha256
    checked on the way), its tiles checked, then the copy removed."""
    try:
        remote.cache.fetch(shard)
    except Exception as e:  # noqa: BLE001 - a shard that cannot be fetched whole is a finding
        return [str(e)]
    try:
        return _verify_shard(remote.mirror, shard, meta, codec, deep, digest=False)  # checked above
    finally:
        fmt.shard_path(remote.mirror, shard).unlink(missing_ok=True)


def _fetch_and_verify_masks(remote: RemoteStore, shard: int, meta: StoreAttrs, deep: bool,
                            targets: StoreTargets | None) -> list[str]:
    """The masks shard downloaded as ``_fetch_and_verify`` downloads an images shard (size,
    index and sha256 checked on the way), its chunks checked, then the copy removed."""
    assert remote.mask_cache is not None
    try:
        remote.mask_cache.fetch(shard)
    except Exception as e:  # noqa: BLE001 - a shard that cannot be fetched whole is a finding
        return [str(e)]
    try:
        return mask_shard_problems(remote.mirror, meta, shard, deep, targets, digest=False)  # checked above
    finally:
        fmt.shard_path(remote.mirror, shard, fmt.MASKS).unlink(missing_ok=True)


def _verify_shard(root: Path, shard: int, meta: StoreAttrs, codec: TileCodec, deep: bool,
                  digest: bool = True) -> list[str]:
    try:
        f = ShardFile(root, shard, meta.shard_size)
    except CorruptChunkError as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001 - a damaged store is a finding, never a traceback
        return [f"{fmt.shard_path(root, shard)}: cannot read: {type(e).__name__}: {e}"]
    problems = []
    held = meta.held(shard)
    if len(f) != held:
        problems.append(f"{f.path}: index lists {len(f)} chunks, expected {held}")
    tile = np.empty(codec.shape, dtype=np.uint8)
    for local in range(held):
        try:
            if deep:  # decoded to exactly the tile's bytes, as the reader decodes it
                f.read_into(local, codec, tile)
            else:
                f.chunk(local)
        except CorruptChunkError as e:
            problems.append(str(e))
        except Exception as e:  # noqa: BLE001 - any decoder failure is a finding, not a crash
            problems.append(f"{f.path}: sample {f.first + local}: does not decode: {e}")
    f.close()
    if digest:  # after the tiles: a damaged tile is named first, by its sample
        try:
            problem = shard_digest_problem(f.path, meta, shard)
        except OSError as e:
            problem = f"cannot read: {e.strerror or e}"
        if problem:
            problems.append(f"{f.path}: {problem}")
    return problems
