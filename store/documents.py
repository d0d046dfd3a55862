"""The store's JSON documents: each zarr.json read within bounds and parsed, the group's
tilefeed attributes found and checked (``open_store``), and every array's zarr.json checked
against what the attributes record, since zarr-python reads one and tilefeed the other."""

from __future__ import annotations

import json
import os
from pathlib import Path
from stat import S_ISREG
from typing import Any, Final

from tilefeed.store.attrs import ArrayRecord, StoreAttrs, attrs_digest, short_repr
from tilefeed.store.errors import CorruptChunkError, StoreFormatError, one_line, unfinished_store
from tilefeed.store.format import (
    ATTRS_KEY,
    CODEC_TABLE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MASK_CODEC,
    MAX_METADATA_BYTES,
    READ_VERSIONS,
    MAX_NESTING,
    SMALL_ARRAY_CODEC,
    WORK_DIR,
    inside,
)


def parse_document(document: bytes) -> tuple[Any, str]:
    """(the parsed document, '') or (None, what is wrong): larger than MAX_METADATA_BYTES, not
    JSON, or nested deeper than MAX_NESTING (Python's parser recurses, and so do its users)."""
    if len(document) > MAX_METADATA_BYTES:
        return None, f"{len(document)} bytes, more than a metadata document may hold ({MAX_METADATA_BYTES})"
    try:
        doc = json.loads(document)
    except RecursionError:
        return None, f"nested deeper than {MAX_NESTING} levels"
    except ValueError as e:
        return None, f"not JSON: {one_line(e)}"
    if _nesting(doc) > MAX_NESTING:
        return None, f"nested deeper than {MAX_NESTING} levels"
    return doc, ""


def _nesting(doc: Any) -> int:
    """How deep lists and objects nest in ``doc``, counted without recursion (and stopping as
    soon as the limit is passed)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def read_document(path: Path) -> bytes:
    """A metadata file's bytes, at most MAX_METADATA_BYTES + 1 of them (so parse_document refuses a
    larger one without reading it all); OSError when it is absent or not a plain file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe would block the open itself
    with open(fd, "rb") as f:
        if not S_ISREG(os.fstat(fd).st_mode):  # a device or a pipe never ends
            raise OSError(f"{path} is not a plain file")
        return f.read(MAX_METADATA_BYTES + 1)


# -- opening a store -------------------------------------------------------------------------------
def read_attrs(root: Path) -> dict[str, Any] | None:
    """The store's tilefeed attributes, or None when the group metadata is absent or not ours."""
    try:
        return parse_attrs(read_document(root / "zarr.json"))
    except OSError:
        return None


def parse_attrs(group_metadata: bytes) -> dict[str, Any] | None:
    """The tilefeed attributes in a group's ``zarr.json``, or None when they are not ours."""
    meta, problem = parse_document(group_metadata)
    return None if problem else _ours(meta)


def _ours(meta: Any) -> dict[str, Any] | None:
    """A group document's tilefeed attributes, whatever shape the document has; else None."""
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    attrs = attrs.get(ATTRS_KEY) if isinstance(attrs, dict) else None
    return attrs if isinstance(attrs, dict) and attrs.get("format") == FORMAT_NAME else None


def load_attrs(root: str | Path) -> dict[str, Any]:
    """The attributes of a complete tilefeed store this code can read, or a StoreFormatError.
    Every field is checked (``StoreAttrs.from_dict``); the arrays are checked by ``array_problems``."""
    return open_store(root)[0]


def open_store(root: str | Path) -> tuple[dict[str, Any], StoreAttrs]:
    """``load_attrs`` and the typed record it checked them into."""
    root = Path(root)
    if not root.is_dir():
        raise StoreFormatError(f"store {str(root)!r} does not exist or is not a folder: make one with "
                               f"`tilefeed preprocess IMAGES {root}`")
    path = root / "zarr.json"
    if path.exists() and not inside(root, path):
        raise StoreFormatError(f"{path}: lies outside the store (a link)")
    try:
        meta, problem = parse_document(read_document(path))
    except OSError:
        meta, problem = None, ""
    if problem:
        raise StoreFormatError(f"{path}: {problem}")
    attrs = _ours(meta)
    if attrs is None:
        if (root / WORK_DIR).exists():
            raise unfinished_store(str(root))
        raise StoreFormatError(f"{str(root)!r} is not a tilefeed store (no tilefeed group metadata): make one "
                               f"with `tilefeed preprocess IMAGES {root}`")
    version = attrs.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {short_repr(version)}; this tilefeed reads versions up "
            f"to {FORMAT_VERSION}: upgrade tilefeed"
        )
    if version < READ_VERSIONS[0]:
        raise StoreFormatError(
            f"store {str(root)!r} has format version {version}, whose labels and other arrays carry "
            f"no checksums; rebuild it with the same `tilefeed preprocess` command plus --overwrite"
        )
    if attrs.get("digest") != attrs_digest(attrs):
        raise CorruptChunkError(str(path), None,
                                "the store's attributes differ from what was written (sha256 mismatch)")
    return attrs, StoreAttrs.from_dict(attrs, f"store {str(root)!r}")


# -- the arrays' own documents, as zarr-python reads them ------------------------------------------
_DEFAULT_KEYS: Final = {"name": "default", "configuration": {"separator": "/"}}
_INDEX_CODECS: Final = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


def _codec_name(codec: Any) -> Any:
    return codec.get("name") if isinstance(codec, dict) else codec


def _codecs_problem(codecs: Any, expected: list[tuple[str, dict[str, Any]]]) -> str:
    """'' when ``codecs`` is that chain (names, and the settings a decoder reads)."""
    names = [name for name, _ in expected]
    if not isinstance(codecs, list) or len(codecs) != len(expected):
        shown = [_codec_name(c) for c in codecs[:8]] if isinstance(codecs, list) else codecs
        return f"codecs are {short_repr(str(shown))}, expected {names}"
    for codec, (name, settings) in zip(codecs, expected, strict=True):
        config = codec.get("configuration") if isinstance(codec, dict) else None
        config = config if isinstance(config, dict) else {}
        if _codec_name(codec) != name or any(config.get(k) != v for k, v in settings.items()):
            return f"codec {short_repr(_codec_name(codec))} is not {name} {settings or ''}".rstrip()
        if name == "bytes" and config.get("endian", "little") != "little":
            return "a bytes codec is not little-endian"
    return ""


def _fields_problem(doc: dict[str, Any], expected: dict[str, Any]) -> str:
    for key, value in expected.items():
        if doc.get(key) != value:
            return f"{key} is {short_repr(doc.get(key))}, the store's attributes say {short_repr(value)}"
    if doc.get("storage_transformers", []) != []:
        return "storage_transformers are declared (tilefeed reads none)"
    return ""


def images_document_problem(doc: Any, store: StoreAttrs) -> str:
    """How the images array's zarr.json disagrees with the attributes ('' when it does not):
    zarr-python reads what it declares, tilefeed what the attributes say, and both must agree."""
    t = store.tile
    return _sharded_document_problem(doc, store, [t, t, 3], CODEC_TABLE[store.codec].declared())


def masks_document_problem(doc: Any, store: StoreAttrs) -> str:
    """How the masks array's zarr.json disagrees with the attributes ('' when it does not): one
    (T, T) uint8 tile per chunk, sharded as the images, zstd then crc32c inside."""
    t = store.tile
    return _sharded_document_problem(doc, store, [t, t], CODEC_TABLE[MASK_CODEC].declared())


def _sharded_document_problem(doc: Any, store: StoreAttrs, tile: list[int],
                              declared: list[tuple[str, dict[str, Any]]]) -> str:
    """How a sharded tile array's zarr.json (uint8, ``tile`` shaped chunks, ``shard_size`` of
    them a shard) disagrees with the attributes and its inner codecs ``declared``."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    problem = _fields_problem(doc, {
        "zarr_format": 3, "node_type": "array", "shape": [store.samples, *tile], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [store.shard_size, *tile]}},
        "chunk_key_encoding": _DEFAULT_KEYS})
    if problem:
        return problem
    codecs = doc.get("codecs")
    sharding = codecs[0] if isinstance(codecs, list) and len(codecs) == 1 else None
    if not isinstance(sharding, dict) or sharding.get("name") != "sharding_indexed":
        return f"codecs are {short_repr(codecs)}, expected one sharding_indexed"
    config = sharding.get("configuration")
    if not isinstance(config, dict):
        return "sharding_indexed has no configuration"
    problem = _fields_problem(config, {"chunk_shape": [1, *tile], "index_codecs": _INDEX_CODECS,
                                       "index_location": "end"})
    return problem or _codecs_problem(config.get("codecs"), declared)


def small_document_problem(doc: Any, rec: ArrayRecord) -> str:
    """How an array's zarr.json disagrees with its record in the attributes ('' when it does not)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    rest = [rec.row] if rec.ndim == 2 else []
    problem = _fields_problem(doc, {
        "zarr_format": 3, "node_type": "array", "shape": [rec.length, *rest], "data_type": rec.dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [rec.chunk, *rest]}},
        "chunk_key_encoding": _DEFAULT_KEYS})
    serializer = "vlen-utf8" if rec.dtype == "string" else "bytes"
    return problem or _codecs_problem(doc.get("codecs"), CODEC_TABLE[SMALL_ARRAY_CODEC].declared(serializer))
