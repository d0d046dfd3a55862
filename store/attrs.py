"""The store's group attributes as a typed record: ``StoreAttrs.from_dict`` checks every field
for type and range and against the others before any count sizes a loop or an allocation;
``to_dict`` is the one way a writer puts them in the group's zarr.json."""

from __future__ import annotations

import hashlib
import json
import re
import reprlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.store.codec import TileCodec
from tilefeed.store.errors import StoreFormatError
from tilefeed.store.format import (
    CODECS,
    COLS,
    CRC_NBYTES,
    FORMAT_NAME,
    FORMAT_VERSION,
    IMAGES,
    MASKS,
    MAX_CATEGORIES,
    MAX_CATEGORY_ID,
    MAX_MASK_OBJECTS,
    MAX_NAME_BYTES,
    MAX_OBJECTS,
    OBJECT_OFFSETS,
    OBJECTS,
    FRAMES,
    FIELD_DTYPES,
    MAX_FIELDS,
    MAX_LISTED_REJECTS,
    MAX_TEXT_BYTES,
    MAX_TEXTS,
    PAIR_NAME,
    PAIRS_VERSION,
    READ_VERSIONS,
    REJECT_ARRAYS,
    TEXT_CHUNK,
    TEXT_PREFIX,
    ROW_WIDTH,
    MAX_PATH_BYTES,
    MAX_SHARD_SIZE,
    PATHS_CHUNK,
    REQUIRED_ARRAYS,
    ROWS,
    SMALL_ARRAYS,
    SMALL_CHUNK,
    SMALL_DTYPES,
    SOURCE_PATHS,
    TILE_SIDES,
    Codec,
    MaskKind,
    ceil_div,
    field_array,
    is_pair_array,
    text_array,
    index_nbytes,
    shard_count,
    small_chunk_path,
)


def attrs_digest(attrs: dict[str, Any]) -> str:
    """sha256 of the attributes themselves (less this digest): a flipped byte there is caught."""
    body = {k: v for k, v in attrs.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def short_repr(value: Any) -> str:
    """A value for a one-line message: short, whatever a hostile document put there."""
    text = _REPR.repr(value)  # a few entries of a few levels, however large the value
    return text if len(text) <= 60 else text[:57] + "..."


_REPR: Final = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fields:
    """One JSON object of the attributes, read field by field: a field absent or not of the type
    and range the format gives it is a StoreFormatError naming it (``arrays.labels.chunk``)."""

    def __init__(self, value: Any, where: str, path: str) -> None:
        if not isinstance(value, dict):
            raise StoreFormatError(f"{where}: attribute {path!r} must be an object, got {short_repr(value)}")
        self.d, self.where, self.path = value, where, path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, what: str) -> StoreFormatError:
        value = self.d.get(key)
        return StoreFormatError(f"{self.where}: attribute {self.name(key)!r} {what}, got {short_repr(value)}")

    def get(self, key: str) -> Any:
        if key not in self.d:
            raise StoreFormatError(f"{self.where}: attribute {self.name(key)!r} is missing")
        return self.d[key]

    def whole(self, key: str, low: int, high: int) -> int:
        value = self.get(key)
        if not _is_int(value) or not low <= value <= high:
            raise self.fail(key, f"must be a whole number in {low}..{high}")
        return int(value)

    def equal(self, key: str, expected: int, why: str) -> int:
        value = self.get(key)
        if not _is_int(value) or value != expected:
            raise self.fail(key, f"must be {expected} ({why})")
        return int(value)

    def digests(self, key: str, count: int) -> tuple[str, ...]:
        """A list of exactly ``count`` sha256 digests in hex."""
        value = self.get(key)
        if (not isinstance(value, list) or len(value) != count
                or not all(isinstance(v, str) and _is_sha256(v) for v in value)):
            raise self.fail(key, f"must list {count} sha256 digests in hex (one per shard)")
        return tuple(value)

    def text(self, key: str, hex64: bool = False) -> str:
        value = self.get(key)
        if not isinstance(value, str) or hex64 and not _is_sha256(value):
            raise self.fail(key, "must be a sha256 in hex" if hex64 else "must be a string")
        return value

    def values(self, key: str, item: type, low: int = 0) -> list[Any]:
        value = self.get(key)
        if (not isinstance(value, list) or len(value) < low
                or not all(isinstance(v, item) and not isinstance(v, bool) for v in value)):
            raise self.fail(key, f"must be a list of {low} or more {item.__name__} values")
        return value

    def child(self, key: str) -> _Fields:
        return _Fields(self.get(key), self.where, self.name(key))


_SHA256: Final = re.compile("[0-9a-f]{64}")


def _is_sha256(text: str) -> bool:
    return _SHA256.fullmatch(text) is not None


@dataclass(frozen=True)
class ArrayRecord:
    """What the attributes record of one array beside the tiles (chunked along rows only)."""

    name: str
    length: int
    chunk: int  # rows per chunk
    ndim: int
    chunks: int
    sha256: str  # of the chunk files, in order
    metadata_sha256: str
    data_type: str = ""  # a field's (the attributes' ``fields``) or "string" for captions; '' otherwise

    @property
    def row(self) -> int:
        """Values per row: boxes hold four (top, left, height, width), objects six, frames
        four, the others one."""
        return ROW_WIDTH.get(self.name, 1)

    @property
    def dtype(self) -> str:
        return self.data_type or SMALL_DTYPES[self.name]

    @property
    def max_row_bytes(self) -> int:
        """The most UTF-8 bytes one row of a string array holds."""
        return MAX_TEXT_BYTES if self.name.startswith(TEXT_PREFIX) else MAX_PATH_BYTES

    def chunk_path(self, root: Path, index: int) -> Path:
        return small_chunk_path(root, self.name, index, self.ndim)

    def chunk_paths(self, root: Path) -> Iterator[Path]:
        return (self.chunk_path(root, i) for i in range(self.chunks))

    @property
    def decoded_chunk_bytes(self) -> int:
        """The bytes of one decoded chunk (zarr writes edge chunks whole); 0 for strings."""
        return 0 if self.dtype == "string" else self.chunk * self.row * np.dtype(self.dtype).itemsize

    @property
    def max_chunk_file(self) -> int:
        """The largest a chunk file can be: zstd's worst case over the decoded chunk (strings:
        each a path and its length), and the crc32c."""
        decoded = self.decoded_chunk_bytes or 4 + self.chunk * (4 + self.max_row_bytes)
        return decoded + (decoded >> 7) + 512 + CRC_NBYTES

    @classmethod
    def from_dict(cls, name: str, f: _Fields, samples: int, sources: int, objects: int = 0,
                  data_type: str = "", rejected: int = 0) -> ArrayRecord:
        if name == SOURCE_PATHS:  # one per source read, the skipped ones aside
            length, most = f.whole("length", 1, sources), PATHS_CHUNK
        elif name in REJECT_ARRAYS:
            length, most = f.equal("length", rejected, "one per rejected source"), PATHS_CHUNK
        elif is_pair_array(name):  # as source_paths (their lengths are compared once all are read)
            length = f.whole("length", 1, sources)
            most = TEXT_CHUNK if name.startswith(TEXT_PREFIX) else PATHS_CHUNK if data_type == "string" \
                else SMALL_CHUNK
        elif name == OBJECT_OFFSETS:
            length, most = f.equal("length", samples + 1, "one per sample and one more"), SMALL_CHUNK
        elif name == OBJECTS:
            length, most = f.equal("length", objects, "targets.objects"), SMALL_CHUNK
        else:
            length, most = f.equal("length", samples, "one per sample"), SMALL_CHUNK
        # the writer's chunks, exactly: a smaller chunk would only multiply the files a reader
        # lists and checks (10**12 objects in chunks of one row) before the first is found missing
        chunk = f.equal("chunk", max(1, min(length, most)), f"min(length, {most}) rows")
        return cls(name=name, length=length, chunk=chunk,
                   ndim=f.equal("ndim", 2 if name in ROW_WIDTH else 1, f"the dimensions of {name}"),
                   chunks=f.equal("chunks", ceil_div(length, chunk), "ceil(length / chunk)"),
                   sha256=f.text("sha256", hex64=True), metadata_sha256=f.text("metadata_sha256", hex64=True),
                   data_type=data_type)

    def to_dict(self) -> dict[str, Any]:
        return {"length": self.length, "chunk": self.chunk, "ndim": self.ndim, "chunks": self.chunks,
                "sha256": self.sha256, "metadata_sha256": self.metadata_sha256}


@dataclass(frozen=True)
class TargetsRecord:
    """What a store with targets holds (the attributes' ``targets``): boxes or not, which masks,
    the category table (the source's own ids and their names, ids ascending) and how many
    objects the ``objects`` array holds.

    Attributes
    ----------
    boxes : bool
        The store holds ``object_offsets`` and ``objects``: boxes, category ids, crowd flags.
    masks : MaskKind or None
        The store holds a ``masks`` array of this kind.
    categories : tuple of (int, str)
        (id, name) of every category, as the source file numbers and names them.
    objects : int
        Rows of ``objects`` (0 without boxes).
    """

    boxes: bool
    masks: MaskKind | None
    categories: tuple[tuple[int, str], ...]
    objects: int

    @property
    def names(self) -> dict[int, str]:
        """Category id -> name."""
        return dict(self.categories)

    @classmethod
    def from_dict(cls, f: _Fields) -> TargetsRecord:
        boxes = f.get("boxes")
        if not isinstance(boxes, bool):
            raise f.fail("boxes", "must be true or false")
        masks = f.get("masks")
        if masks is not None and masks not in tuple(MaskKind):
            raise f.fail("masks", f"must be null or one of {', '.join(MaskKind)}")
        kind = None if masks is None else MaskKind(masks)
        if kind is MaskKind.INSTANCE and not boxes:
            raise f.fail("masks", "must not be instance without boxes (instance ids index the objects)")
        if not boxes and kind is None:
            raise f.fail("boxes", "must be true, or masks given (a targets entry holds something)")
        objects = f.whole("objects", 0, MAX_OBJECTS if boxes else 0)
        return cls(boxes=boxes, masks=kind, categories=_categories(f), objects=objects)

    def to_dict(self) -> dict[str, Any]:
        return {"boxes": self.boxes, "masks": None if self.masks is None else self.masks.value,
                "categories": [{"id": i, "name": n} for i, n in self.categories], "objects": self.objects}

    @property
    def arrays(self) -> tuple[str, ...]:
        """The arrays a store with these targets holds beside the classification ones."""
        return ((OBJECT_OFFSETS, OBJECTS) if self.boxes else ()) + (FRAMES,) + (
            (MASKS,) if self.masks is not None else ())


def _categories(f: _Fields) -> tuple[tuple[int, str], ...]:
    value = f.get("categories")
    why = (f"must list at most {MAX_CATEGORIES} {{id, name}} objects, ids whole numbers in "
           f"0..{MAX_CATEGORY_ID} ascending, names strings of at most {MAX_NAME_BYTES} bytes")
    if not isinstance(value, list) or len(value) > MAX_CATEGORIES:
        raise f.fail("categories", why)
    out: list[tuple[int, str]] = []
    for entry in value:
        cid: Any = entry.get("id") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if (not _is_int(cid) or not 0 <= cid <= MAX_CATEGORY_ID or not isinstance(name, str)
                or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
                or (out and cid <= out[-1][0])):
            raise f.fail("categories", why)
        out.append((int(cid), name))
    return tuple(out)


@dataclass(frozen=True)
class ShardedRecord:
    """What the attributes record of the masks array (sharded as the images): each shard file's
    size and sha256, and the sha256 of its zarr.json."""

    shard_bytes: tuple[int, ...]
    shard_sha256: tuple[str, ...]
    metadata_sha256: str

    @classmethod
    def from_dict(cls, f: _Fields, shards: int) -> ShardedRecord:
        f.equal("chunks", shards, "the shard count")
        sizes = tuple(f.values("shard_bytes", int))
        if len(sizes) != shards:
            raise f.fail("shard_bytes", f"must list {shards} sizes (one per shard)")
        return cls(shard_bytes=sizes, shard_sha256=f.digests("shard_sha256", shards),
                   metadata_sha256=f.text("metadata_sha256", hex64=True))

    def to_dict(self) -> dict[str, Any]:
        return {"chunks": len(self.shard_bytes), "shard_bytes": list(self.shard_bytes),
                "shard_sha256": list(self.shard_sha256), "metadata_sha256": self.metadata_sha256}


@dataclass(frozen=True)
class StoreAttrs:
    """The group attributes of a store, every field checked for type and range and against the
    others, so no count sizes a loop or an allocation before it has been: ``from_dict``.

    What ties the counts to the bytes on disk: ``shards`` is the length of ``shard_bytes``
    (bounded by the document), ``samples`` agrees with both and with each shard's size, which is
    compared with the file or the bucket listing before a shard is read; the arrays beside the
    tiles hold one row per sample, their chunks at most SMALL_CHUNK rows."""

    samples: int
    sources: int
    accepted: int
    rejected: int
    tile: int
    codec: Codec  # given as a string, it is made a Codec
    quality: int | None
    shard_size: int
    shards: int
    shard_bytes: tuple[int, ...]
    images_metadata_sha256: str
    classes: tuple[str, ...]
    made: dict[str, Any]
    rejects: tuple[tuple[str, str], ...]
    fingerprint: str
    arrays: dict[str, ArrayRecord]  # the arrays beside the tiles, by name
    digest: str  # of the other fields (``attrs_digest``); a writer's record gets it from ``sealed``
    # sha256 of each shard file; None in stores written before shards had digests, whose copies
    # (a bucket store's cache) cannot be checked against the original
    shard_sha256: tuple[str, ...] | None = None
    targets: TargetsRecord | None = None  # version 3: what a store made from a source with targets holds
    masks: ShardedRecord | None = None  # present exactly when ``targets.masks`` is
    version: int = FORMAT_VERSION  # the version read (a version-2 store's record says 2)
    # version 4: the caption names (arrays text.NAME), the metadata fields (name, dtype; arrays
    # field.NAME), and whether ``labels`` are class labels (False: all 0, the one class "image")
    texts: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()
    labelled: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec(self.codec))

    @property
    def tile_codec(self) -> TileCodec:
        return TileCodec(self.codec, self.tile, self.quality or 90)

    def held(self, shard: int) -> int:
        """The tiles shard ``shard`` holds: all but the last are full."""
        return min(self.shard_size, self.samples - shard * self.shard_size)

    @classmethod
    def from_dict(cls, attrs: Any, where: str) -> StoreAttrs:
        f = _Fields(attrs, where, "")
        if f.get("format") != FORMAT_NAME:
            raise f.fail("format", f"must be {FORMAT_NAME!r}")
        version = f.get("version")
        if not _is_int(version) or version not in READ_VERSIONS:
            raise f.fail("version", f"must be one of {', '.join(map(str, READ_VERSIONS))} (the versions "
                         "this tilefeed reads)")
        sources = f.whole("sources", 1, 2**48)
        rejects = _rejects(f)
        rejected = _rejected(f, len(rejects), version, sources)
        accepted = f.equal("accepted", sources - rejected, "sources less rejected")
        shard_size = f.whole("shard_size", 1, MAX_SHARD_SIZE)
        samples = f.whole("samples", 1, 2**48)
        shards = f.equal("shards", shard_count(samples, shard_size), "ceil(samples / shard_size)")
        tile = _tile(f)
        if f.get("codec") not in CODECS:
            raise f.fail("codec", f"must be one of {', '.join(CODECS)}")
        codec = Codec(f.get("codec"))
        quality = f.whole("quality", 1, 100) if codec is Codec.JPEG else None
        if codec is not Codec.JPEG and f.get("quality") is not None:
            raise f.fail("quality", f"must be null for codec {codec}")
        targets = None
        if "targets" in f.d:
            if version < 3:
                raise f.fail("targets", "must be absent in a version-2 store")
            targets = TargetsRecord.from_dict(f.child("targets"))
        texts, fields, labelled = _pairs(f, version)
        arrays = f.child("arrays")
        _array_names(arrays, targets, texts, fields, rejected > len(rejects))
        dtypes = {**{text_array(n): "string" for n in texts}, **{field_array(n): t for n, t in fields}}
        images = arrays.child(IMAGES)
        images.equal("chunks", shards, "the shard count")
        shard_bytes = tuple(images.values("shard_bytes", int))
        if len(shard_bytes) != shards:
            raise images.fail("shard_bytes", f"must list {shards} sizes (one per shard)")
        store = cls(
            samples=samples, sources=sources, accepted=accepted, rejected=rejected, tile=tile,
            codec=codec, quality=quality, shard_size=shard_size, shards=shards, shard_bytes=shard_bytes,
            images_metadata_sha256=images.text("metadata_sha256", hex64=True),
            classes=tuple(f.values("classes", str, low=1)), made=_made(f), rejects=rejects,
            fingerprint=f.text("fingerprint"), digest=f.text("digest", hex64=True),
            arrays={name: ArrayRecord.from_dict(name, arrays.child(name), samples, sources,
                                                targets.objects if targets else 0, dtypes.get(name, ""),
                                                rejected)
                    for name in arrays.d if name not in (IMAGES, MASKS)},
            shard_sha256=images.digests("shard_sha256", shards) if "shard_sha256" in images.d else None,
            targets=targets, version=int(version),
            masks=ShardedRecord.from_dict(arrays.child(MASKS), shards) if MASKS in arrays.d else None,
            texts=texts, fields=fields, labelled=labelled,
        )
        store._check_pair_lengths(arrays)
        store._check_shard_bytes(images)
        if store.masks is not None:
            store._check_mask_bytes(arrays.child(MASKS))
        return store

    def to_dict(self) -> dict[str, Any]:
        """The attributes as the group's zarr.json records them: ``from_dict`` reads back this record."""
        images: dict[str, Any] = {"chunks": self.shards, "shard_bytes": list(self.shard_bytes)}
        if self.shard_sha256 is not None:
            images["shard_sha256"] = list(self.shard_sha256)
        images["metadata_sha256"] = self.images_metadata_sha256
        sharded = {IMAGES: images, **({MASKS: self.masks.to_dict()} if self.masks is not None else {})}
        targets = {"targets": self.targets.to_dict()} if self.targets is not None else {}
        pairs = {"texts": list(self.texts), "fields": [{"name": n, "dtype": t} for n, t in self.fields],
                 "labelled": self.labelled} if self.version >= PAIRS_VERSION else {}
        return {
            "format": FORMAT_NAME, "version": self.version, "samples": self.samples,
            "sources": self.sources, "accepted": self.accepted, "rejected": self.rejected,
            "tile": [self.tile, self.tile, 3], "codec": self.codec.value, "quality": self.quality,
            "shard_size": self.shard_size, "shards": self.shards, "classes": list(self.classes),
            "made": dict(self.made), "rejects": [{"path": p, "reason": r} for p, r in self.rejects],
            "fingerprint": self.fingerprint, **targets, **pairs,
            "arrays": {**sharded, **{name: rec.to_dict() for name, rec in self.arrays.items()}},
            "digest": self.digest,
        }

    def sealed(self) -> StoreAttrs:
        """This record with ``digest`` set to the sha256 of its other fields."""
        return replace(self, digest=attrs_digest(self.to_dict()))

    def _check_shard_bytes(self, images: _Fields) -> None:
        """Each shard holds its index and a chunk per tile: an uncompressed one exactly the
        tile's bytes, any other at least one byte, each with its crc32c."""
        exact = self.codec is Codec.NONE
        per_tile = CRC_NBYTES + (self.tile_codec.nbytes if exact else 1)
        for shard, size in enumerate(self.shard_bytes):
            least = index_nbytes(self.shard_size) + self.held(shard) * per_tile
            if size < least or size > 2**62 or exact and size != least:
                raise images.fail("shard_bytes", f"entry {shard} must be {'' if exact else 'at least '}"
                                  f"{least} ({self.held(shard)} tiles and the index)")


    def _check_pair_lengths(self, arrays: _Fields) -> None:
        """Each caption and field array holds one row per source listed, as source_paths does."""
        listed = self.arrays[SOURCE_PATHS].length
        for name, rec in self.arrays.items():
            if is_pair_array(name) and rec.length != listed:
                raise arrays.child(name).fail("length", f"must be {listed} (one per source, as {SOURCE_PATHS})")

    @property
    def pair_arrays(self) -> tuple[str, ...]:
        """The caption and field arrays, captions first, in the attributes' order."""
        return (*(text_array(n) for n in self.texts), *(field_array(n) for n, _ in self.fields))

    def _check_mask_bytes(self, masks: _Fields) -> None:
        """Each masks shard holds its index and a chunk per tile, of one byte at least and its
        crc32c (a zstd frame is never empty)."""
        assert self.masks is not None
        for shard, size in enumerate(self.masks.shard_bytes):
            least = index_nbytes(self.shard_size) + self.held(shard) * (CRC_NBYTES + 1)
            if size < least or size > 2**62:
                raise masks.fail("shard_bytes", f"entry {shard} must be at least {least} "
                                 f"({self.held(shard)} tiles and the index)")

    @property
    def max_tile_objects(self) -> int:
        """The most objects a tile may hold: MAX_MASK_OBJECTS with instance masks."""
        return MAX_MASK_OBJECTS if self.targets is not None and self.targets.masks is MaskKind.INSTANCE else -1


def _tile(f: _Fields) -> int:
    tile = f.get("tile")
    low, high = TILE_SIDES
    if (not isinstance(tile, list) or len(tile) != 3 or not all(_is_int(v) for v in tile)
            or tile[0] != tile[1] or tile[2] != 3 or not low <= tile[0] <= high):
        raise f.fail("tile", f"must be [T, T, 3] with T in {low}..{high}")
    return int(tile[0])


def _rejects(f: _Fields) -> tuple[tuple[str, str], ...]:
    rejects = f.get("rejects")
    if not isinstance(rejects, list) or not all(
            isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("reason"), str)
            for r in rejects):
        raise f.fail("rejects", "must be a list of {path, reason} strings")
    return tuple((r["path"], r["reason"]) for r in rejects)


def _made(f: _Fields) -> dict[str, Any]:
    made = f.child("made").d
    scalar = (str, int, float, bool, type(None))
    for key, value in made.items():
        if not isinstance(value, scalar) and not (
                isinstance(value, list) and all(isinstance(v, scalar) for v in value)):
            raise StoreFormatError(f"{f.where}: attribute 'made.{key[:40]}' must be a value or a "
                                   f"list of values, got {short_repr(value)}")
    return dict(made)


def _pairs(f: _Fields, version: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], bool]:
    """The caption names, the fields (name, dtype) and whether labels are class labels: absent
    before version 4 (no captions or fields, labelled), each checked from version 4 on."""
    if version < PAIRS_VERSION:
        for key in ("texts", "fields", "labelled"):
            if key in f.d:
                raise f.fail(key, f"must be absent in a version-{version} store")
        return (), (), True
    names = f.values("texts", str)
    named = all(PAIR_NAME.fullmatch(n) for n in names)
    if len(names) > MAX_TEXTS or len(set(names)) != len(names) or not named:
        raise f.fail("texts", f"must list at most {MAX_TEXTS} distinct names of letters, digits and _")
    value = f.get("fields")
    why = (f"must list at most {MAX_FIELDS} distinct {{name, dtype}} objects, names of letters, digits and _, "
           f"dtypes one of {', '.join(FIELD_DTYPES)}")
    if not isinstance(value, list) or len(value) > MAX_FIELDS:
        raise f.fail("fields", why)
    fields: list[tuple[str, str]] = []
    for entry in value:
        name = entry.get("name") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if (not isinstance(name, str) or not PAIR_NAME.fullmatch(name) or dtype not in FIELD_DTYPES
                or name in dict(fields)):
            raise f.fail("fields", why)
        fields.append((name, str(dtype)))
    labelled = f.get("labelled")
    if not isinstance(labelled, bool):
        raise f.fail("labelled", "must be true or false")
    return tuple(names), tuple(fields), labelled


def _rejected(f: _Fields, listed: int, version: int, sources: int) -> int:
    """The rejected count: the entries of ``rejects``; from version 4, more where ``rejects``
    lists its most (MAX_LISTED_REJECTS) and the reject arrays hold every one."""
    if version < PAIRS_VERSION:
        return f.equal("rejected", listed, "the entries of rejects")
    rejected = f.whole("rejected", listed, sources)
    if rejected > listed != MAX_LISTED_REJECTS:
        raise f.fail("rejected", f"must be the entries of rejects, or more where rejects lists "
                     f"{MAX_LISTED_REJECTS}")
    return rejected


def _array_names(arrays: _Fields, targets: TargetsRecord | None, texts: tuple[str, ...] = (),
                 fields: tuple[tuple[str, str], ...] = (), overflow: bool = False) -> None:
    """Array names come from the fixed set and the captions and fields the attributes name: a
    name is a path under the store root, and ``../elsewhere`` or ``/etc`` would have a reader
    look outside it. The targets', captions' and fields' arrays are present exactly when the
    attributes say so."""
    pairs = (*(text_array(n) for n in texts), *(field_array(n) for n, _ in fields))
    known = (IMAGES, MASKS, *SMALL_ARRAYS, *pairs)
    for name in pairs:
        arrays.get(name)
    for name in arrays.d:
        if name not in known:
            raise StoreFormatError(f"{arrays.where}: attribute 'arrays' names {short_repr(name)}, not one of "
                                   f"{', '.join(known)}")
    for name in REQUIRED_ARRAYS:
        arrays.get(name)
    held = targets.arrays if targets is not None else ()
    for name in (OBJECT_OFFSETS, OBJECTS, FRAMES, MASKS):
        if (name in arrays.d) != (name in held):
            has, hold = ("holds", "do not hold") if name in arrays.d else ("lacks", "hold")
            raise StoreFormatError(f"{arrays.where}: attribute 'arrays' {has} {name}, which the store's "
                                   f"targets {hold}")
    for name in REJECT_ARRAYS:  # every reject, where the attributes list only the first ones
        if (name in arrays.d) != overflow:
            has = "holds" if name in arrays.d else "lacks"
            raise StoreFormatError(f"{arrays.where}: attribute 'arrays' {has} {name}, which a store "
                                   f"{'listing' if overflow else 'not listing'} only its first "
                                   f"{MAX_LISTED_REJECTS} rejects {'holds' if overflow else 'lacks'}")
    if (ROWS in arrays.d) != (COLS in arrays.d):
        raise StoreFormatError(f"{arrays.where}: attribute 'arrays' must hold both {ROWS} and {COLS} "
                               "(grid mode) or neither")


def store_attrs(attrs: Mapping[str, Any] | StoreAttrs, root: Path) -> StoreAttrs:
    return attrs if isinstance(attrs, StoreAttrs) else StoreAttrs.from_dict(attrs, f"store {str(root)!r}")

