"""Parquet files of image-text rows (Hugging Face ``datasets``' exports, LAION-style tables of
image bytes): each row a sample, its image in one column and its captions and fields in others.

Every file is checked on its footer before any of its data is read: a footer of more than
``MAX_FOOTER`` bytes, more than ``MAX_ROWS`` rows, or a row group whose columns read here (the
image column included, which a worker reads a row group of) declare more than
``MAX_GROUP_BYTES`` uncompressed is refused in one line. The driver then reads one row group of
the caption, field and label columns at a time and never the image bytes: each sample is listed
with its *member* (file, row group, row, column), which the worker reads
(``read_member``). The image column is ``--image-column``, else the one ``datasets`` marks as
an ``Image`` in the file's schema metadata, else ``image``; it is binary, or a struct of
``bytes`` and ``path`` as ``datasets`` writes it. A row whose bytes are null and whose path is
set names a file beside the parquet file, resolved and checked as a manifest's row is.

SRC may be in a bucket: a ``.parquet`` object, or a prefix (ending in ``/``) whose ``.parquet``
objects are read. Such a file is never downloaded: its footer, then each row group's columns,
are read through ranged GETs (``webdataset.RangedFile``) on the condition that the object is
the one the scan found (its ETag, which each member also records, so that a worker reads the
same bytes and a resumed run's fingerprint changes only when the object does), with the same
checks as a local file's. A row's path there is a key beside the parquet object, held inside its
prefix unless ``--allow-outside``; a URL, inside that prefix or in a bucket ``--allow-bucket``
names (``webdataset.bucket_resolver``).

pyarrow is an optional dependency (``pip install tilefeed[text]``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from tilefeed.preprocess.sources.manifest import path_resolver
from tilefeed.preprocess.sources.scanning import PairOptions, PairSink, Scan, SourceOptions
from tilefeed.preprocess.sources.objects import (BucketObject, ObjectChanged, RangedFile, bucket_resolver,
                                                 bucket_url, list_objects, stat_object)
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import is_url

MAX_ROWS: Final = 1 << 31  # rows of one file, and of all of SRC's files together
MAX_GROUP_BYTES: Final = 2 << 30  # the columns read of one row group, uncompressed
MAX_FOOTER: Final = 64 << 20  # a file's footer (its metadata), read whole by pyarrow
HF_KEY: Final = b"huggingface"  # the schema metadata where `datasets` describes its features
NEEDS_PYARROW: Final = "reading parquet files needs pyarrow: pip install tilefeed[text]"
# A bucket parquet file's read-ahead: pyarrow reads the footer's tail and then each column chunk
# whole, so a small window only saves a request on the footer and on small chunks.
PARQUET_READ_AHEAD: Final = 64 << 10


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, or the one-line SourceError that says how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(NEEDS_PYARROW) from None
    return pq


def parquet_files(src: Path | str) -> list[Path | str]:
    """SRC's parquet files: SRC itself, or the visible ``.parquet`` files in the folder (or
    directly under the bucket prefix), sorted."""
    if isinstance(src, str) and is_url(src):
        bucket_url(src)
        if src.lower().endswith(".parquet"):
            return [src]
        objects, _ = list_objects(src)
        urls: list[Path | str] = [o.url for o in objects if o.url.lower().endswith(".parquet")]
        if not urls:
            raise SourceError(f"SRC {src!r} holds no .parquet objects (or is no prefix of this bucket)")
        return urls
    src = Path(src)
    if not src.is_dir():
        return [src]
    files = sorted(p for p in src.iterdir() if p.suffix.lower() == ".parquet" and not p.name.startswith(".")
                   and p.is_file())
    if not files:
        raise SourceError(f"SRC {str(src)!r} holds no .parquet files")
    return list(files)


def _name(path: Path | str | BucketObject) -> str:
    """A parquet file as messages name it: its path or its URL."""
    return path.url if isinstance(path, BucketObject) else str(path)


def _footer_size(path: Path | BucketObject) -> int:
    """The byte count the file's last 8 bytes declare for its footer; SourceError for a file
    that is not a regular parquet file. Opened without blocking: a named pipe never waits."""
    if isinstance(path, BucketObject):
        size = path.size
        tail = RangedFile(path, 8).pread(size - 8, 8) if size >= 12 else b""
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise SourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SourceError(f"{str(path)!r} is not a regular file")
            size = info.st_size
            tail = os.pread(fd, 8, max(size - 8, 0)) if size >= 12 else b""
        finally:
            os.close(fd)
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise SourceError(f"{_name(path)!r} is not a parquet file (no PAR1 footer)")
    footer = int.from_bytes(tail[:4], "little")
    if footer + 12 > size:
        raise SourceError(f"{_name(path)!r} is not a parquet file: its footer declares {footer} bytes, more "
                          "than the file holds")
    return footer


def open_checked(path: Path | str | BucketObject, columns: Callable[[Any], list[str]] | None = None) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` whose footer was checked before any of its data is
    read; ``columns`` gives, from its arrow schema, the columns the run reads (default all).
    ``path`` is a file, or an object in a bucket (its URL, or as ``stat_object`` read it), read
    through ranged GETs.

    Raises
    ------
    SourceError
        One line: not a parquet file (a missing object too), a footer over ``MAX_FOOTER``, more
        than ``MAX_ROWS`` rows declared (in all or by its row groups), or a row group whose
        columns read declare more than ``MAX_GROUP_BYTES`` uncompressed.
    """
    pq = pyarrow_parquet()
    if isinstance(path, str) and is_url(path):
        try:
            path = stat_object(path)
        except FileNotFoundError:
            raise SourceError(f"{path!r} does not exist") from None
    elif isinstance(path, str):
        path = Path(path)
    name = _name(path)
    footer = _footer_size(path)
    if footer > MAX_FOOTER:
        raise SourceError(f"{name!r}: its footer declares {footer} bytes of metadata, over the "
                          f"{MAX_FOOTER >> 20} MiB read")
    try:
        source = RangedFile(path, PARQUET_READ_AHEAD) if isinstance(path, BucketObject) else str(path)
        pf = pq.ParquetFile(source)
        meta = pf.metadata
    except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on a damaged footer
        raise SourceError(f"{name!r} is not a readable parquet file: {_line(e)}") from None
    if meta.num_rows > MAX_ROWS or meta.num_rows < 0:
        raise SourceError(f"{name!r}: its footer declares {meta.num_rows} rows, over the {MAX_ROWS} a "
                          "parquet source may hold")
    names = columns(pf.schema_arrow) if columns is not None else None
    rows = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        rows += group.num_rows
        size = 0
        for i in range(group.num_columns):
            column = group.column(i)
            top = column.path_in_schema
            if names is None or any(top == n or top.startswith(n + ".") for n in names):
                size += max(column.total_uncompressed_size, 0)
        if size > MAX_GROUP_BYTES:
            raise SourceError(f"{name!r}: row group {g} declares {size} bytes uncompressed in the columns "
                              f"read, over the {MAX_GROUP_BYTES >> 30} GiB a row group may hold; rewrite it "
                              "with smaller row groups")
    if rows != meta.num_rows:
        raise SourceError(f"{name!r}: its row groups hold {rows} rows, its footer declares {meta.num_rows}")
    return pf


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def image_column(schema: Any, options: PairOptions) -> str:
    """The image column: ``--image-column``, the ``datasets`` ``Image`` feature, or ``image``."""
    if options.image_column:
        return options.image_column
    meta = schema.metadata or {}
    try:
        features = json.loads(meta[HF_KEY])["info"]["features"]
        for name, feature in features.items():
            if isinstance(feature, dict) and feature.get("_type") == "Image":
                return str(name)
    except (KeyError, TypeError, ValueError, AttributeError):
        pass  # no metadata of `datasets`, or not of this form: the default name
    return "image"


def _struct_image(schema: Any, column: str, path: Path | BucketObject) -> bool:
    """True for a struct image column (``bytes``, ``path``), False for a binary one."""
    import pyarrow as pa

    kind = schema.field(column).type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return False
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        bytes_kind = kind.field("bytes").type
        if pa.types.is_binary(bytes_kind) or pa.types.is_large_binary(bytes_kind):
            return True
    raise SourceError(f"{_name(path)!r}: the image column {column!r} is {kind}, not binary or a struct of "
                      "bytes and path")


def scan_parquet(src: Path | str, options: SourceOptions, pairs: PairOptions, out: PairSink) -> Scan:
    """Every row of SRC's parquet files into ``out``, file by file (sorted), row group by row
    group; the rows' rejects and the files' refusals as the module docstring says."""
    files = parquet_files(src)
    out.notes.append(f"SRC read as parquet ({len(files)} file{'s' if len(files) > 1 else ''})")
    total = 0
    for path in files:
        total += _scan_file(path, options, pairs, out)
        if total > MAX_ROWS:
            raise SourceError(f"SRC {str(src)!r} holds more than the {MAX_ROWS} rows a parquet source may hold")
    return out.scan()


def _scan_file(found: Path | str, options: SourceOptions, pairs: PairOptions, out: PairSink) -> int:
    path: Path | BucketObject
    if isinstance(found, str):  # an object in a bucket: its size and ETag, read once
        try:
            path = stat_object(found)
        except FileNotFoundError:
            raise SourceError(f"SRC {found!r} does not exist") from None
    else:
        path = found
    name = _name(path)
    holder: dict[str, Any] = {}

    def read_columns(schema: Any) -> list[str]:
        image = image_column(schema, pairs)
        if image not in schema.names:
            raise SourceError(f"{name!r} has no image column {image!r} (its columns: "
                              f"{', '.join(schema.names)}); name it with --image-column")
        captions = [n for n in pairs.caption_key if n in schema.names]
        if not captions:
            raise SourceError(f"{name!r} has none of the caption columns {', '.join(pairs.caption_key)} "
                              f"(its columns: {', '.join(schema.names)}); name them with --caption-key")
        if pairs.label_key is not None and pairs.label_key not in schema.names:
            raise SourceError(f"{name!r} has no label column {pairs.label_key!r} (--label-key)")
        others = [n for n in (*pairs.field_names, pairs.label_key) if n is not None and n in schema.names]
        holder.update(image=image, data=list(dict.fromkeys(n for n in (*captions, *others) if n != image)))
        return [image, *holder["data"]]

    pf = open_checked(path, read_columns)
    image, data = holder["image"], holder["data"]
    struct = _struct_image(pf.schema_arrow, image, path)
    resolve: Callable[[int, str], tuple[str, str | None]]
    extra: dict[str, Any] = {}  # a bucket object's size and ETag, in every member
    if isinstance(path, BucketObject):
        file = real = path.url
        in_bucket = bucket_resolver(path.url, options)
        resolve = lambda line, named: (in_bucket(line, named), None)  # noqa: E731
        extra = {"parquet_size": path.size, **({"etag": path.etag} if path.etag else {})}
    else:
        file, real = os.path.abspath(path), os.path.realpath(path)
        resolve = path_resolver(path, options)
    meta = pf.metadata
    leaf = None
    if struct:
        leaf = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == f"{image}.bytes"),
                    None)
    named_files = struct and pf.schema_arrow.field(image).type.get_field_index("path") >= 0
    row = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        nulls = _null_count(group, leaf) if struct else 0
        try:
            table = pf.read_row_group(g, columns=data) if data else None
            values = {name: table.column(name).to_pylist() for name in data} if table is not None else {}
            del table
            paths = None
            if nulls != 0 and named_files:  # some rows may name a file instead of holding bytes: their paths
                paths = pf.read_row_group(g, columns=[f"{image}.path"]).column(image).to_pylist()
            columns = [*values.values(), *([paths] if paths is not None else [])]
            if any(len(column) != group.num_rows for column in columns):
                raise ValueError(f"it holds other than the {group.num_rows} rows its footer declares")
        except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on damaged pages: one line
            raise SourceError(f"{name!r}: row group {g} cannot be read: {_line(e)}") from None
        for r in range(group.num_rows):
            record = {name: column[r] for name, column in values.items()}
            captions = {name: record.get(name) for name in pairs.caption_key}
            listed = f"{file}#{row}"
            held: dict[str, Any] = {"parquet": real, "group": g, "row": r, "column": image, **extra}
            member: dict[str, Any] | None = held
            named = (paths[r] or {}).get("path") if paths else None
            if named:
                if not isinstance(named, str) or "\0" in named:
                    out.reject(listed, "unusable image path: not text or holding a NUL")
                    row += 1
                    continue
                where, _ = resolve(row, named)  # a path outside the folder refuses the run
                if nulls == group.num_rows:
                    listed, member = where, None  # no row holds bytes: the file is the source
                else:
                    held["path"] = where  # read when the row's bytes are null
            elif nulls == group.num_rows:
                out.reject(listed, "no image: its bytes and its path are both null")
                row += 1
                continue
            out.sample(listed, captions, record, member)
            row += 1
    return row


def _null_count(group: Any, leaf: int | None) -> int | None:
    """The nulls the row group's ``bytes`` column declares (None: not known)."""
    if leaf is None:
        return None
    stats = group.column(leaf).statistics
    if stats is None or not stats.has_null_count:
        return None
    return int(stats.null_count)


class MemberReader:
    """Reads the image bytes of parquet members, keeping the last row group's image column:
    the rows of one part are contiguous, so a part reads each of its row groups once."""

    def __init__(self) -> None:
        self._key: tuple[str, int, str] | None = None
        self._column: Any = None

    def read(self, member: dict[str, Any]) -> bytes | str:
        """The row's image bytes, or the path of the file it names when its bytes are null."""
        key = (str(member["parquet"]), int(member["group"]), str(member["column"]))
        if key != self._key:
            self._key, self._column = None, None  # the last group's column goes before the next is read
            pf = open_checked(_member_file(member), lambda schema: [key[2]])
            self._column = pf.read_row_group(key[1], columns=[key[2]]).column(key[2])
            self._key = key
        value = self._column[int(member["row"])].as_py()  # this row's bytes alone are copied
        if isinstance(value, dict):
            value = value.get("bytes")
        if value is None:
            if member.get("path"):
                return str(member["path"])
            raise ValueError("its bytes are null")
        return bytes(value)


def _member_file(member: dict[str, Any]) -> Path | BucketObject:
    """The file a member's row lies in; in a bucket, the object as the scan found it (its ETag
    the condition of every read), or, where the store gives no ETag, as it is now if its size is
    still the scan's."""
    where = str(member["parquet"])
    if not is_url(where):
        return Path(where)
    size = int(member["parquet_size"])
    if member.get("etag"):
        return BucketObject(bucket_url(where, "a member's parquet file"), size, str(member["etag"]))
    found = stat_object(where)
    if found.size != size:
        raise ObjectChanged(f"{where} changed since the scan read it (it is {found.size} bytes, not {size})")
    return found
