"""Parquet files of image-text rows (Hugging Face ``datasets``' exports, LAION-style tables of
image bytes): each row a sample, its image in one column and its captions and fields in others.

Every file is checked on its footer before any of its data is read: a footer of more than
``MAX_FOOTER`` bytes, more than ``MAX_ROWS`` rows, or a row group whose columns read here (the
image column included) declare more than ``MAX_GROUP_BYTES`` uncompressed makes the file a
reject, as does a file that is no parquet file, cannot be read or lacks the run's columns: the
run goes on with the other files (a SRC whose every file is such a reject holds no images, and
is refused naming the first). A row group whose image column declares more than
``MAX_IMAGE_GROUP_BYTES`` (a worker holds one group's image column) is a reject of its rows.
The driver reads the caption, field and label columns ``BATCH_ROWS`` rows at a time and never
the image bytes; a row group that fails there keeps the rows listed before it and makes the
file a reject. Each sample is listed with its *member* (file, row group, row, column), which
the worker reads (``read_member``); a local file's size and time of change are part of the
run's fingerprint. The image column is ``--image-column``, else the one ``datasets`` marks as
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
# A row group's image column, which a worker holds whole while it reads the group's rows: a
# group over this is a reject
MAX_IMAGE_GROUP_BYTES: Final = 512 << 20
BATCH_ROWS: Final = 4096  # rows of captions and fields the scan turns into objects at a time
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
    group; the rows' rejects and the files' as the module docstring says."""
    files = parquet_files(src)
    out.notes.append(f"SRC read as parquet ({len(files)} file{'s' if len(files) > 1 else ''})")
    total, listed = 0, out.table.count
    refused: list[str] = []  # the files that are rejects, why
    for path in files:
        total += _scan_file(path, options, pairs, out, refused)
        if total > MAX_ROWS:
            raise SourceError(f"SRC {str(src)!r} holds more than the {MAX_ROWS} rows a parquet source may hold")
    if len(refused) == len(files) and out.table.count == listed:
        others = len(files) - 1
        more = f" (and {others} other file{'s' if others > 1 else ''}, each a reject)" if others else ""
        raise SourceError(f"SRC {str(src)!r} holds no images: {refused[0]}{more}")
    return out.scan()


def _scan_file(found: Path | str, options: SourceOptions, pairs: PairOptions, out: PairSink,
               refused: list[str]) -> int:
    """One file's rows into ``out``; the rows it read. A file that cannot be opened, or whose
    columns are not those of the run, is a reject; one that fails in a row group keeps the rows
    listed before it and is a reject naming the group. Each such reason is added to
    ``refused``."""

    def refuse(reason: str) -> None:
        out.reject(name, reason)
        refused.append(reason)

    path: Path | BucketObject
    if isinstance(found, str):  # an object in a bucket: its size and ETag, read once
        try:
            path = stat_object(found)
        except FileNotFoundError:
            out.reject(found, f"{found!r}: missing: object not found")
            refused.append(f"{found!r}: missing: object not found")
            return 0
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

    try:
        pf = open_checked(path, read_columns)
        image, data = holder["image"], holder["data"]
        struct = _struct_image(pf.schema_arrow, image, path)
        if not isinstance(path, BucketObject):
            # the file's size and time of change, in the run's fingerprint: its members record
            # only where a row lies, so a file rewritten in place must still change the run
            info = os.stat(path)
            out.table.container(os.path.realpath(path), info.st_size, info.st_mtime_ns)
    except (SourceError, OSError) as e:
        refuse(str(e) if isinstance(e, SourceError) else f"{name!r}: unreadable: {e.strerror or e}")
        return 0
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
        images = _declared_bytes(group, image)
        if images > MAX_IMAGE_GROUP_BYTES:
            out.reject(f"{file}#{row}-{row + group.num_rows - 1}",
                       f"row group {g}: its image column declares {images} bytes uncompressed, over the "
                       f"{MAX_IMAGE_GROUP_BYTES >> 20} MiB a worker holds; rewrite the file with smaller row "
                       "groups")
            row += group.num_rows
            continue
        nulls = _null_count(group, leaf) if struct else 0
        with_paths = nulls != 0 and named_files  # some rows may name a file instead of holding bytes
        # the captions and fields a batch at a time: never a whole row group of them as objects
        batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], use_threads=False,
                                  columns=[*data, *([f"{image}.path"] if with_paths else [])])
        done = 0
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    if done != group.num_rows:
                        raise ValueError(f"it holds {done} rows, not the {group.num_rows} its footer declares")
                    break
                if done + batch.num_rows > group.num_rows:
                    raise ValueError(f"it holds more than the {group.num_rows} rows its footer declares")
                values = {n: batch.column(n).to_pylist() for n in data}
                paths = batch.column(image).to_pylist() if with_paths else None
            except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on damaged pages: one line
                refuse(f"{name!r}: row group {g} cannot be read after {row} rows (those kept): {_line(e)}")
                return row
            for r in range(batch.num_rows):
                _row(out, pairs, resolve, {n: column[r] for n, column in values.items()},
                     paths[r] if paths else None, row, f"{file}#{row}",
                     {"parquet": real, "group": g, "row": done + r, "column": image, **extra},
                     nulls == group.num_rows)
                row += 1
            done += batch.num_rows
    return row


def _row(out: PairSink, pairs: PairOptions, resolve: Callable[[int, str], tuple[str, str | None]],
         record: dict[str, Any], named: Any, row: int, listed: str, held: dict[str, Any],
         no_bytes: bool) -> None:
    """One row into ``out``: ``held`` its member, ``named`` its image's struct of ``path`` where
    read, ``no_bytes`` when no row of its group holds bytes (a row naming a file is that file)."""
    captions = {n: record.get(n) for n in pairs.caption_key}
    member: dict[str, Any] | None = held
    path = (named or {}).get("path")
    if path:
        if not isinstance(path, str) or "\0" in path:
            out.reject(listed, "unusable image path: not text or holding a NUL")
            return
        where, _ = resolve(row, path)  # a path outside the folder refuses the run
        if no_bytes:
            listed, member = where, None  # no row holds bytes: the file is the source
        else:
            held["path"] = where  # read when the row's bytes are null
    elif no_bytes:
        out.reject(listed, "no image: its bytes and its path are both null")
        return
    out.sample(listed, captions, record, member)


def _declared_bytes(group: Any, column: str) -> int:
    """The bytes the row group's chunks of ``column`` (and of its struct's fields) declare
    uncompressed."""
    size = 0
    for i in range(group.num_columns):
        chunk = group.column(i)
        if chunk.path_in_schema == column or chunk.path_in_schema.startswith(column + "."):
            size += max(chunk.total_uncompressed_size, 0)
    return size


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
            if not 0 <= key[1] < pf.metadata.num_row_groups:
                raise ValueError(f"the file has no row group {key[1]}")
            images = _declared_bytes(pf.metadata.row_group(key[1]), key[2])
            if images > MAX_IMAGE_GROUP_BYTES:
                raise ValueError(f"its row group's image column declares {images} bytes uncompressed, over "
                                 f"the {MAX_IMAGE_GROUP_BYTES >> 20} MiB a worker holds")
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
