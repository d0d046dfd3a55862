"""A manifest of sources: CSV (``path,label``, a header naming those columns optional) or JSON
Lines (``{"path": ..., "label": ...}``), read as a stream, each row refused naming its line.

A row is a path inside the manifest's folder (after resolving links) unless ``allow_outside``;
a row that is a URL names an object store (s3, gs, az) and is read only from the buckets the
user allows; any other ``scheme://`` text is refused. Labels are read by rules, never guessed:
all integers are kept as they are; all names (none looks like a number) become sorted class
names; anything in between is refused naming the line.

The manifest is read twice, once to choose its label rule and once to write its sources; its
repeated paths are found by sorting (resolved path, line) records on disk (``spill``), not by
a set of them all.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO
from urllib.parse import urlsplit

import numpy as np

from tilefeed.preprocess.sources.scanning import BATCH, ClassLabels, Scan, SourceOptions, utf8
from tilefeed.preprocess.sources.source_list import SourceListWriter
from tilefeed.preprocess.sources.spill import SortedRuns
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import OBJECT_SCHEMES, is_url

_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


MAX_CLASSES: Final = 1 << 20  # integer labels: the largest names the class count


@dataclass(frozen=True)
class _Row:
    line: int
    path: str
    label: str | int | float  # as written: CSV text, or the JSON value


def _rows(manifest: Path) -> Iterator[_Row]:
    """The manifest's rows, read as a stream; a row that cannot be a source is a SourceError
    naming its line."""
    try:
        # utf-8-sig: spreadsheets start CSVs with a byte-order mark; newline="" lets csv see CRLF
        with open(manifest, newline="", encoding="utf-8-sig") as f:
            yield from _csv_rows(f, manifest) if manifest.suffix.lower() == ".csv" else _jsonl_rows(f, manifest)
    except OSError as e:
        raise SourceError(f"cannot read manifest {str(manifest)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SourceError(f"manifest {str(manifest)!r} is not UTF-8 text") from None


def _where(manifest: Path, row: _Row) -> str:
    return f"{manifest}:{row.line}"


def read_manifest(manifest: Path, options: SourceOptions, sink: SourceListWriter, scratch: Path) -> Scan:
    """Two passes: the first reads every row (each malformed one is refused naming its line)
    and chooses the label rule; the second resolves and lists the paths. The errors come in
    the order they did when the whole manifest was held: rows first, then paths (the first
    line at fault, a repeat included), then labels."""
    rule = _label_rule(_rows(manifest), manifest, options.labels)
    repeats = None if options.allow_duplicates else SortedRuns(scratch / "repeats")
    resolve = _resolver(manifest, options)
    fault: tuple[int, SourceError] | None = None
    batch: list[bytes] = []
    batch_labels: list[int] = []
    for row in _rows(manifest):
        try:
            path, real = resolve(row)
        except SourceError as e:  # the first: a repeat on an earlier line is reported first
            fault = (row.line, e)
            break
        if repeats is not None:
            repeats.add(_repeat_record(real, row))
        if rule.error is None:
            batch.append(path.encode("utf-8", "surrogateescape"))
            batch_labels.append(rule.label(row.label))
            if len(batch) == BATCH:
                sink.add(batch, np.array(batch_labels, dtype=np.int64))
                batch, batch_labels = [], []
    repeat = _first_repeat(repeats, manifest) if repeats is not None else None
    if repeat is not None and (fault is None or repeat[0] < fault[0]):
        raise repeat[1]
    if fault is not None:
        raise fault[1]
    if rule.error is not None:
        raise rule.error
    sink.add(batch, np.array(batch_labels, dtype=np.int64))
    return Scan(classes=rule.classes)


def _resolver(manifest: Path, options: SourceOptions) -> Callable[[_Row], tuple[str, str]]:
    """A row -> (its path, the file it names in the end, links resolved), or the SourceError
    that refuses it (a URL not allowed, a path outside the manifest's folder)."""
    base = os.path.abspath(manifest.parent)
    real_base = os.path.realpath(base)
    inside = real_base.rstrip("/") + "/"
    # the folders of a manifest's rows repeat: each is resolved once while it is in use
    real_folder = functools.lru_cache(maxsize=1 << 12)(os.path.realpath)

    def resolve(row: _Row) -> tuple[str, str]:
        if _URL.match(row.path):
            url = _checked_url(row, manifest, options)
            return url, url
        path = os.path.normpath(os.path.join(base, row.path))
        # the file it names in the end, links resolved: a link inside the folder may lead out
        folder, name = os.path.split(path)
        real = os.path.realpath(path) if os.path.islink(path) else os.path.join(real_folder(folder), name)
        if not options.allow_outside and real != real_base and not real.startswith(inside):
            via = f" (a link to {real!r})" if os.path.commonpath([base, path]) == base else ""
            raise SourceError(
                f"{_where(manifest, row)}: path {row.path!r}{via} is outside the manifest's folder "
                f"{base!r}; pass --allow-outside to read files elsewhere"
            )
        return path, real

    return resolve


def path_resolver(listing: Path, options: SourceOptions) -> Callable[[int, str], tuple[str, str]]:
    """A manifest's rule for another file that lists images (a caption table, a tar list, a
    parquet file's path rows): (line or row, the path as written) -> (its path, the file it
    names in the end), or the SourceError naming ``listing`` and the line that refuses it."""
    resolve = _resolver(listing, options)
    return lambda line, path: resolve(_Row(line, path, 0))


_LINE: Final = struct.Struct(">QI")  # a repeat record's line (big-endian: sorts as a number), path length


def _repeat_record(real: str, row: _Row) -> bytes:
    """(resolved path NUL line, the path as written, its label): sorted, the rows naming one
    file come together in line order."""
    path = row.path.encode()
    return b"".join((real.encode("utf-8", "surrogateescape"), b"\0", _LINE.pack(row.line, len(path)),
                     path, _label_key(row)))


def _label_key(row: _Row) -> bytes:
    """The label as bytes that are equal exactly when the labels compare equal in Python."""
    label = row.label
    if isinstance(label, str):
        return b"s" + label.encode()
    if isinstance(label, float) and not math.isfinite(label):
        return b"x%d" % row.line if math.isnan(label) else b"n" + repr(label).encode()  # nan != nan
    if isinstance(label, float) and label.is_integer():
        label = int(label)  # 3 == 3.0
    return b"n" + repr(label).encode()


def _first_repeat(records: SortedRuns, manifest: Path) -> tuple[int, SourceError] | None:
    """The earliest line that names a file an earlier line named, with its refusal."""
    best: tuple[int, bytes, bytes] | None = None  # (line, its record, the first record of its file)
    first, first_real = b"", b""
    for record in records:
        real = record[: record.index(b"\0")]
        if real == first_real and first:
            line = _LINE.unpack_from(record, len(real) + 1)[0]
            if best is None or line < best[0]:
                best = (line, record, first)
            first = b""  # a third row of the same file comes later than the second
        elif real != first_real:
            first, first_real = record, real
    if best is None:
        return None
    line, path, label = _repeat_fields(best[1])
    first_line, _, first_label = _repeat_fields(best[2])
    what = "with another label" if label != first_label else "again"
    return line, SourceError(
        f"{manifest}:{line}: {path!r} is listed {what} (first at line "
        f"{first_line}); remove the repeat, or pass --allow-duplicates to keep it"
    )


def _repeat_fields(record: bytes) -> tuple[int, str, bytes]:
    """(line, path as written, label key) of a repeat record."""
    at = record.index(b"\0") + 1
    line, length = _LINE.unpack_from(record, at)
    at += _LINE.size
    return line, record[at : at + length].decode(), record[at + length :]


def _checked_url(row: _Row, manifest: Path, options: SourceOptions) -> str:
    """A URL row: an object in a bucket the user allows, or a one-line refusal naming the line."""
    where = _where(manifest, row)
    scheme = row.path.split("://", 1)[0]
    if not is_url(row.path):
        raise SourceError(
            f"{where}: {scheme}:// is not an object store ({', '.join(s + '://' for s in OBJECT_SCHEMES)}) "
            "and a path is no URL: write the file's path, relative to the manifest's folder"
        )
    try:
        parts = urlsplit(row.path)
        bucket = parts.hostname
    except ValueError:
        bucket = None
    if "@" in row.path.split("://", 1)[1].split("/", 1)[0]:
        raise SourceError(f"{where}: the URL carries credentials (user@ or user:password@): remove them; "
                          "buckets are read with the cloud's standard configuration")
    if not bucket:
        raise SourceError(f"{where}: {row.path!r} names no bucket")
    if not options.bucket_allowed(row.path):
        raise SourceError(
            f"{where}: {row.path!r} is in the bucket {scheme}://{bucket}, which would be read with this "
            f"machine's cloud credentials; pass --allow-bucket {scheme}://{bucket} to read it "
            "(or --allow-bucket '*' for any bucket)"
        )
    return row.path


def _is_int(v: str | int | float) -> bool:
    return isinstance(v, int) or (isinstance(v, str) and bool(_INT.fullmatch(v.strip())))


def _is_number(v: str | int | float) -> bool:
    return not isinstance(v, str) or bool(_NUMBER.fullmatch(v.strip()))


@dataclass
class _Rule:
    """How a manifest's labels are read, chosen from all of them: as integers, or as names
    numbered in sorted order; or the refusal (raised once the paths are checked)."""

    classes: list[str]
    names: dict[str, int] | None = None  # name -> label, when labels are names
    error: SourceError | None = None

    def label(self, value: str | int | float) -> int:
        return int(value) if self.names is None else self.names[str(value).strip()]


def _label_rule(rows: Iterator[_Row], manifest: Path, rule: ClassLabels) -> _Rule:
    """One pass over the rows: what the label rule (auto, int or names) makes of them. Only
    what picks the rule and the first line at fault is kept, and the class names: never a
    value per row."""
    count = numeric = 0
    first_not_int = first_number = first_bad_int = None
    top = -1
    names: set[str] | None = set() if rule is not ClassLabels.INT else None
    for row in rows:
        count += 1
        is_int = _is_int(row.label)
        if _is_number(row.label):
            numeric += 1
            if first_number is None:
                first_number = row
                if rule is ClassLabels.AUTO:
                    names = None  # auto reads names only when none looks like a number
        if not is_int and first_not_int is None:
            first_not_int = row
        if is_int:
            top = max(top, int(row.label))
        if (not is_int or int(row.label) < 0) and first_bad_int is None:
            first_bad_int = row
        if names is not None:
            names.add(str(row.label).strip())
    if rule is ClassLabels.AUTO:
        if first_not_int is None:
            rule = ClassLabels.INT
        elif first_number is None:
            rule = ClassLabels.NAMES
        else:
            ints = 2 * numeric >= count
            bad = first_not_int if ints else first_number
            return _Rule([], error=SourceError(
                f"{_where(manifest, bad)}: label {bad.label!r} mixes with "
                f"{'integer labels' if ints else 'class names'}: fix it, or "
                "pass --labels int or --labels names to say how to read every label"
            ))
    if rule is ClassLabels.INT:
        if first_bad_int is not None:
            return _Rule([], error=SourceError(
                f"{_where(manifest, first_bad_int)}: label {first_bad_int.label!r} is not an integer >= 0"))
        if top >= MAX_CLASSES:  # the class list is sized by the largest label: checked first
            return _Rule([], error=SourceError(
                f"{manifest}: label {top} is over the {MAX_CLASSES} classes a store may hold"))
        return _Rule([str(i) for i in range(top + 1)])
    assert names is not None
    classes = sorted(names)
    return _Rule(classes, {name: i for i, name in enumerate(classes)})


def _csv_rows(f: TextIO, manifest: Path) -> Iterator[_Row]:
    rows = 0
    columns = (0, 1)
    for line, cells in enumerate(csv.reader(f), start=1):
        if not cells or not "".join(cells).strip():
            continue
        names = [c.strip().lower() for c in cells]
        if not rows and "path" in names and "label" in names:
            columns = (names.index("path"), names.index("label"))  # a header, by its column names
            continue
        if len(cells) <= max(columns):
            raise SourceError(f"{manifest}:{line}: expected 'path,label', got {','.join(cells)!r}")
        rows += 1
        yield _checked(manifest, line, cells[columns[0]].strip(), cells[columns[1]].strip())


def _jsonl_rows(f: TextIO, manifest: Path) -> Iterator[_Row]:
    for line, text in enumerate(f, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            path, label = obj["path"], obj["label"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SourceError(
                f'{manifest}:{line}: expected a JSON object {{"path": ..., "label": ...}}'
            ) from None
        if isinstance(label, bool) or not isinstance(label, (int, float, str)) or not isinstance(path, str):
            raise SourceError(f"{manifest}:{line}: path must be a string, label a number or string")
        yield _checked(manifest, line, path.strip(), label.strip() if isinstance(label, str) else label)


def _checked(manifest: Path, line: int, path: str, label: str | int | float) -> _Row:
    if not path:
        raise SourceError(f"{manifest}:{line}: empty path")
    if not utf8(path) or (isinstance(label, str) and not utf8(label)) or "\0" in path:
        raise SourceError(f"{manifest}:{line}: the path or label holds an escaped lone surrogate or NUL, "
                          "which no file name or class name can hold")
    if label == "":
        raise SourceError(f"{manifest}:{line}: empty label for {path!r}")
    return _Row(line, path, label)
