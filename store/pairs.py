"""A store's captions and metadata fields (format version 4), checked and read whole.

Captions (``text.NAME``) and fields (``field.NAME``) hold one row per source, as
``source_paths`` does: sample i's caption is row ``sources[i]``. Numeric fields are read as the
other small arrays are (``arrays.read_small_array``). String arrays (captions, string fields)
are decoded here rather than through zarr-python, whose vlen-utf8 codec allocates whatever a
chunk's header declares: every chunk is checked against its crc32c and the array's sha256
first, then its zstd frame must declare at most the bytes a chunk of its rows can hold, its
vlen header exactly its rows, each string must be UTF-8 of at most the row's limit
(``MAX_TEXT_BYTES`` for a caption, ``MAX_PATH_BYTES`` for a field) and a caption holds no NUL.
The same arrays read with zarr-python alone (``zarr.open_group(store)["text.caption"][:]``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numcodecs import VLenUTF8

from tilefeed.store import format as fmt
from tilefeed.store.arrays import check_array, read_small_array
from tilefeed.store.attrs import StoreAttrs, store_attrs
from tilefeed.store.codec import COMPRESSORS, zstd_content_size
from tilefeed.store.errors import ConfigError, CorruptChunkError, one_line

STRINGS = np.dtypes.StringDType()
_VLEN_UTF8 = VLenUTF8()


def _strings_chunk(path: Path, data: bytes, rows: int, most_row: int, caption: bool) -> np.ndarray:
    """One checked chunk of a string array: ``rows`` strings (the chunk's full rows)."""
    payload = memoryview(data)[: -fmt.CRC_NBYTES]
    if len(data) < fmt.CRC_NBYTES or fmt.crc_bytes(payload) != data[-fmt.CRC_NBYTES:]:
        raise CorruptChunkError(str(path), None, "chunk crc32c mismatch")
    most = 4 + rows * (4 + most_row)
    size = zstd_content_size(payload)
    if not 0 <= size <= most:
        what = "no decoded size" if size < 0 else f"{size} decoded bytes"
        raise CorruptChunkError(str(path), None,
                                f"declares {what}, a chunk of {rows} strings holds at most {most}")
    out = np.empty(size, dtype=np.uint8)
    try:
        COMPRESSORS[fmt.SMALL_ARRAY_CODEC].decode(payload, out=out)
    except Exception as e:  # noqa: BLE001 - whatever the codec raises on a bad chunk is its reason
        raise CorruptChunkError(str(path), None, f"does not decode: {one_line(e)}") from None
    body = out.tobytes()
    if len(body) < 4 or struct.unpack_from("<I", body)[0] != rows:
        raise CorruptChunkError(str(path), None, f"its vlen header does not declare its {rows} strings")
    try:
        values = _VLEN_UTF8.decode(body)
    except UnicodeDecodeError:
        raise CorruptChunkError(str(path), None, "holds a string that is not valid UTF-8") from None
    except Exception as e:  # noqa: BLE001 - a truncated or overlong item list
        raise CorruptChunkError(str(path), None, f"its strings do not decode: {one_line(e)}") from None
    if len(values) != rows:
        raise CorruptChunkError(str(path), None, f"holds {len(values)} strings, not {rows}")
    for k, value in enumerate(values):
        if (not isinstance(value, str) or len(value) > most_row
                or len(value.encode("utf-8", "surrogatepass")) > most_row):
            raise CorruptChunkError(str(path), None, f"string {k} is longer than {most_row} UTF-8 bytes")
        if caption and "\0" in value:
            raise CorruptChunkError(str(path), None, f"caption {k} holds a NUL character")
    return np.asarray(values, dtype=STRINGS)


def read_strings(root: Path, attrs: Mapping[str, Any] | StoreAttrs, name: str) -> np.ndarray:
    """A whole string array beside the tiles (a caption array, a string field), every chunk
    checked as the module docstring says; CorruptChunkError naming the file on damage."""
    store = store_attrs(attrs, root)
    check_array(root, store, name)
    rec = store.arrays[name]
    if rec.dtype != "string":
        raise ValueError(f"{name} holds numbers; read it with read_small_array")
    caption = name.startswith(fmt.TEXT_PREFIX)
    parts = []
    for path in rec.chunk_paths(root):
        parts.append(_strings_chunk(path, path.read_bytes(), rec.chunk, rec.max_row_bytes, caption))
    return np.concatenate(parts)[: rec.length] if parts else np.empty(0, dtype=STRINGS)


@dataclass(frozen=True)
class StorePairs:
    """A store's captions and fields, one row per source, read whole and checked.

    Attributes
    ----------
    texts : dict of str to numpy.ndarray
        Caption name -> its strings (numpy ``StringDType``), one per source.
    fields : dict of str to numpy.ndarray
        Field name -> its values (int64, float64 or ``StringDType``), one per source.
    labelled : bool
        The store's labels are class labels (False: every label is 0, the one class ``image``).
    """

    texts: dict[str, np.ndarray] = field(default_factory=dict)
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    labelled: bool = True


def read_pairs(root: Path, attrs: Mapping[str, Any] | StoreAttrs, texts: tuple[str, ...] | None = None,
               fields: tuple[str, ...] | None = None) -> StorePairs:
    """The captions and fields a store holds (``texts``/``fields``: only these names; None:
    all), each array checked before it is used."""
    store = store_attrs(attrs, root)
    dtypes = dict(store.fields)
    wanted_texts = store.texts if texts is None else texts
    wanted_fields = tuple(dtypes) if fields is None else fields
    return StorePairs(
        texts={n: read_strings(root, store, fmt.text_array(n)) for n in wanted_texts},
        fields={n: (read_strings(root, store, fmt.field_array(n)) if dtypes[n] == "string"
                    else read_small_array(root, store, fmt.field_array(n))) for n in wanted_fields},
        labelled=store.labelled)


def sample_rows(root: Path, attrs: Mapping[str, Any] | StoreAttrs) -> np.ndarray:
    """Each sample's row of the captions and fields: its source (the ``sources`` array)."""
    return read_small_array(root, attrs, fmt.SOURCES)


def check_held(attrs: StoreAttrs, texts: tuple[str, ...], fields: tuple[str, ...], location: str,
               asked: str = "fields") -> None:
    """A one-line ConfigError naming the first caption or field the store does not hold, and
    what it holds; ``asked``: the option that named the fields (``fields``, ``where``)."""
    missing = [n for n in texts if n not in attrs.texts]
    if missing:
        raise ConfigError(f"text: store {location!r} holds no caption named {missing[0]!r} "
                          f"(it holds: {', '.join(attrs.texts) or 'none'})")
    kinds = dict(attrs.fields)
    missing = [n for n in fields if n not in kinds]
    if missing:
        raise ConfigError(f"{asked}: store {location!r} holds no field {missing[0]!r} "
                          f"(it holds: {', '.join(kinds) or 'none'})")
