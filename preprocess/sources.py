"""Find the source images and their labels: a class-per-folder tree or a CSV / JSON Lines manifest.

Every path and name is untrusted. A manifest row is a path inside the manifest's folder (after
resolving links) unless ``allow_outside``; a row that is a URL names an object store (s3, gs,
az) and is read only from the buckets the user allows; any other ``scheme://`` text is refused.
A file whose name is not UTF-8 (which the store's text cannot hold) is a reject, not an error.

Labels are read by rules, never guessed: a manifest whose labels are all integers keeps them as
they are; one whose labels are all names (none looks like a number) gets sorted class names;
anything in between is refused naming the line. Class folders are read as torchvision's
ImageFolder reads them, except where the README says otherwise (hidden entries skipped, every
file an input, symlink loops followed once).

A scan streams: sources go to a list on disk (``sourcelist``) in store order as they are found,
sorted where sorting is needed by runs on disk (``spill``), so that no step holds every source.
A manifest is read twice, once to choose its label rule and once to write its sources; its
repeated paths are found by sorting (resolved path, line) records, not by a set of them all.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Final, TextIO
from urllib.parse import urlsplit

import numpy as np

from tilefeed.store.errors import ConfigError, SourceError
from tilefeed.preprocess.sourcelist import SourceList, SourceListWriter
from tilefeed.preprocess.spill import SortedRuns
from tilefeed.store.storage import OBJECT_SCHEMES, ObjectStorage, is_url

MANIFEST_SUFFIXES: Final = (".csv", ".jsonl", ".ndjson")
LABEL_RULES: Final = ("auto", "int", "names")
_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
BATCH: Final = 1 << 12  # sources handed to the list at once
LIST_FOLDER: Final = "list"


@dataclass(frozen=True)
class SourceOptions:
    """How SRC is read. ``labels``: auto (integers if all are, names if none looks numeric),
    int or names; the ``allow_*`` switches relax the rules that catch mistakes. ``buckets``:
    the buckets a manifest's URL rows may name (``s3://name``, or a bare ``name`` in any object
    store, or ``*`` for any); rows in other buckets are refused, as they would be read with
    this machine's cloud credentials."""

    labels: str = "auto"
    allow_duplicates: bool = False
    allow_outside: bool = False
    allow_empty_classes: bool = False
    buckets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.labels not in LABEL_RULES:
            raise ConfigError(f"--labels must be one of {', '.join(LABEL_RULES)}, got {self.labels!r}")
        allowed = []
        for bucket in self.buckets:
            text = bucket.strip().rstrip("/")
            if "://" in text:
                parts = urlsplit(text)
                if parts.scheme not in OBJECT_SCHEMES or not parts.hostname or "@" in parts.netloc:
                    raise ConfigError(f"--allow-bucket takes a bucket name or {OBJECT_SCHEMES[0]}://BUCKET "
                                      f"({', '.join(OBJECT_SCHEMES)}), got {bucket.split('@')[-1]!r}")
            elif not text or "/" in text:
                raise ConfigError(f"--allow-bucket takes a bucket name or s3://BUCKET, got {bucket!r}")
            allowed.append(text)
        object.__setattr__(self, "buckets", tuple(allowed))

    def bucket_allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        here = f"{parts.scheme}://{parts.netloc}"
        return any(b == "*" or b == parts.netloc or b == here or url.startswith(b + "/") for b in self.buckets)


@dataclass(frozen=True)
class Sources:
    """Source images in store order, with int labels into ``classes``: a scan held in memory,
    for callers that want lists (the writer reads a ``Listing`` instead)."""

    paths: list[str]
    labels: list[int]
    classes: list[str]
    skipped: list[tuple[str, str]]  # (path, reason): inputs that cannot enter the store
    hidden: int = 0  # hidden files and folders left out of a class-folder scan
    notes: list[str] = field(default_factory=list)  # what the summary should say about SRC

    def __len__(self) -> int:
        return len(self.paths)


@dataclass(frozen=True)
class Listing:
    """Source images in store order, listed on disk (``files``), with int labels into ``classes``."""

    files: SourceList
    classes: list[str]
    skipped: list[tuple[str, str]]  # (path, reason): inputs that cannot enter the store
    hidden: int = 0  # hidden files and folders left out of a class-folder scan
    notes: list[str] = field(default_factory=list)  # what the summary should say about SRC

    def __len__(self) -> int:
        return len(self.files)


@dataclass
class _Found:
    """What a scan learns besides the sources it lists."""

    classes: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    hidden: int = 0
    notes: list[str] = field(default_factory=list)


def find_sources(src: str | os.PathLike[str], options: SourceOptions | None = None,
                 exclude: Path | None = None) -> Sources:
    """Read SRC into memory; ``exclude`` is a folder inside it never to scan (the store being
    written). The lists are as large as SRC: the writer scans to disk (``scan_sources``)."""
    with tempfile.TemporaryDirectory(prefix="tilefeed-scan-") as scratch:
        listing = scan_sources(src, Path(scratch), options, exclude)
        paths = [p.decode("utf-8", "surrogateescape") for p in listing.files.paths()]
        labels = listing.files.labels(0, len(listing)).tolist()
    return Sources(paths, labels, listing.classes, listing.skipped, listing.hidden, listing.notes)


def check_source(src: str | os.PathLike[str]) -> None:
    """The checks of SRC that need no scan: a URL, or a folder or manifest that exists and
    whose path the store's text can hold. Done before the writer takes OUT's lock."""
    if is_url(src):
        return
    root = Path(src)
    if not utf8(str(root)):
        raise SourceError(f"SRC {shown(str(root))!r}: its path is not valid UTF-8, which the store's "
                          "text cannot hold; rename it or link to it under a UTF-8 name")
    if not root.exists():
        raise SourceError(f"SRC {str(root)!r} does not exist")
    if not root.is_dir() and root.suffix.lower() not in MANIFEST_SUFFIXES:
        raise SourceError(
            f"SRC {str(root)!r} must be a folder (one subfolder per class) or a manifest "
            f"({', '.join(MANIFEST_SUFFIXES)})"
        )


def scan_sources(src: str | os.PathLike[str], scratch: Path, options: SourceOptions | None = None,
                 exclude: Path | None = None, stride: int = BATCH) -> Listing:
    """Read SRC into a source list in ``scratch`` (an empty folder the caller owns and removes),
    indexed every ``stride`` sources; ``exclude`` is a folder inside SRC never to scan."""
    options = options or SourceOptions()
    check_source(src)
    sink = SourceListWriter(scratch / LIST_FOLDER, stride)
    try:
        if is_url(src):
            found = _scan_bucket(str(src), sink, scratch)
        elif Path(src).is_dir():
            found = _scan_tree(Path(src), options, exclude, sink, scratch)
        else:
            found = _read_manifest(Path(src), options, sink, scratch)
    finally:
        files = sink.close()
    if not len(files) and not found.skipped:
        raise SourceError(f"SRC {str(Path(src))!r} holds no images")
    return Listing(files, found.classes, found.skipped, found.hidden, found.notes)


def utf8(text: str) -> bool:
    """True when ``text`` is valid Unicode: no lone surrogates, which a name read from the
    file system holds where its bytes are not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(path: str) -> str:
    """``path`` as text the store can hold: bytes that are not UTF-8 written as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace") if not utf8(path) else path


NOT_UTF8: Final = ("unusable name: not valid UTF-8 (its bytes are shown as \\xNN), which the store's "
                   "text cannot hold; rename the file")


def _sortable(text: str) -> bytes:
    """``text`` as bytes whose order is the str order: UTF-8 keeps code point order, and
    ``surrogatepass`` keeps a name that is not UTF-8 (its lone surrogates) in its place."""
    return text.encode("utf-8", "surrogatepass")


# -- class folders ------------------------------------------------------------------------------
HELD_NAMES: Final = 1 << 18  # file names of one class sorted in memory; past this, on disk
SCAN_CHUNK: Final = 1 << 14  # entries of a folder read at once


class _Files:
    """One class folder's files, given folder by folder, read back in ImageFolder order:
    folders sorted by path, files by name.

    Held as (folder, names) while the class holds few; past HELD_NAMES, each file becomes a
    record, folder then NUL then name, in sorted runs on disk: sorted, the records come in that
    order too (a NUL sorts before any byte a longer folder path goes on with, and UTF-8 keeps
    code point order, as Python's str sort has it).
    """

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.groups: list[tuple[str, list[str]]] = []
        self.runs: SortedRuns | None = None
        self.count = 0

    def add(self, folder: str, names: list[str]) -> None:
        """Files in ``folder``; one folder's come in one or more calls, one after the other."""
        self.count += len(names)
        if self.runs is None and self.count <= HELD_NAMES:
            if self.groups and self.groups[-1][0] == folder:
                self.groups[-1][1].extend(names)
            else:
                self.groups.append((folder, names))
            return
        if self.runs is None:
            self.runs = SortedRuns(self.scratch / "walk")
            for held in self.groups:
                self._spill(*held)
            self.groups = []
        self._spill(folder, names)

    def _spill(self, folder: str, names: list[str]) -> None:
        assert self.runs is not None
        prefix = _sortable(folder) + b"\0"
        self.runs.extend([prefix + _sortable(name) for name in names])

    def batches(self) -> Iterator[tuple[str, list[str]]]:
        """The files in order, a folder (or BATCH records) at a time: (the folder, the names in
        it), or ("", the paths)."""
        if self.runs is None:
            for folder, names in sorted(self.groups, key=lambda g: g[0]):
                names.sort()
                yield folder, names
            return
        batch: list[str] = []
        for record in self.runs:
            batch.append(record.replace(b"\0", b"/", 1).decode("utf-8", "surrogatepass"))
            if len(batch) == BATCH:
                yield "", batch
                batch = []
        yield "", batch


@dataclass
class _Walk:
    """One class folder's files, with what the walk met on the way."""

    files: _Files
    skipped: list[tuple[str, str]] = field(default_factory=list)
    hidden: int = 0


def _walk(folder: Path, exclude: Path | None, scratch: Path) -> _Walk:
    """Every visible file under ``folder``, links followed, each real folder entered once.

    Files come in torchvision's ImageFolder order: folders sorted by path, files by name. The
    folders of one folder are entered in name order, depth first (which decides which of two
    links to one folder is the loop); its files are handed on unsorted, to be sorted with the
    class's.
    """
    walk = _Walk(_Files(scratch))
    seen: set[tuple[int, int]] = set()
    todo: list[tuple[str, bool]] = [(str(folder), True)]  # (path, is a folder), the next last
    while todo:
        path, is_folder = todo.pop()
        if not is_folder:
            walk.skipped.append((path, "dangling link: its target does not exist"))
            continue
        later = _visit(path, exclude, seen, walk)
        todo += [(f"{path}/{name}", is_dir) for name, is_dir in sorted(later, reverse=True)]
    return walk


def _visit(d: str, exclude: Path | None, seen: set[tuple[int, int]], walk: _Walk) -> list[tuple[str, bool]]:
    """Read the folder ``d`` into ``walk``: its files, hidden entries and what is wrong with it;
    its folders and dangling links come back, (name, is a folder), to be taken in name order."""
    later: list[tuple[str, bool]] = []
    try:
        st = os.stat(d)
        if (st.st_dev, st.st_ino) in seen:
            walk.skipped.append((d, "symlink loop: the folder it links to was already read"))
            return []
        seen.add((st.st_dev, st.st_ino))
        with os.scandir(d) as entries:
            # a folder's names are handed on a chunk at a time: a huge folder is never held whole
            while chunk := list(islice(entries, SCAN_CHUNK)):
                names: list[str] = []
                for entry in chunk:
                    name = entry.name
                    if name.startswith("."):
                        walk.hidden += 1
                    elif exclude is not None and name == exclude.name and (
                            Path(entry.path).absolute() == exclude):
                        continue
                    elif entry.is_dir():  # follows links
                        later.append((name, True))
                    elif entry.is_file():
                        names.append(name)
                    elif entry.is_symlink():
                        later.append((name, False))
                walk.files.add(d, names)
    except OSError as err:  # one unreadable folder is a reject, not the end of the scan
        walk.skipped.append((d, f"unreadable folder: {err.strerror or err}"))
        return []
    return later


def _scan_tree(root: Path, options: SourceOptions, exclude: Path | None, sink: SourceListWriter,
               scratch: Path) -> _Found:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise SourceError(f"cannot read SRC {str(root)!r}: {e.strerror or e}") from None
    hidden = sum(e.name.startswith(".") for e in entries)
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")
               and (exclude is None or Path(e.path).absolute() != exclude)]
    found = _Found(classes, hidden=hidden)
    if exclude is not None:
        found.notes.append(f"OUT {exclude.name!r} inside SRC was not scanned")
    for name in classes:
        if not utf8(name):
            raise SourceError(f"SRC {str(root)!r}: the class folder {shown(name)!r} has a name that is "
                              "not valid UTF-8, which the store's class names cannot hold; rename it")
    if not classes:
        raise SourceError(
            f"SRC {str(root)!r} has no class subfolders: put each class's images in a subfolder, "
            "or pass a manifest (CSV or JSON Lines of path,label)"
        )
    empty: list[str] = []
    for label, name in enumerate(classes):
        walk = _walk(root / name, exclude, scratch)
        if not walk.files.count:
            empty.append(name)
        for folder, names in walk.files.batches():
            found.skipped += _list_files(folder, names, label, sink)
        found.skipped += [(shown(p), reason) for p, reason in walk.skipped]
        found.hidden += walk.hidden
    found.skipped += [
        (shown(e.path), "outside any class folder") for e in entries
        if not e.name.startswith(".") and e.is_file()
    ]
    if empty and sink.count:
        if not options.allow_empty_classes:
            raise SourceError(
                f"SRC {str(root)!r}: class folder{'s' if len(empty) > 1 else ''} "
                f"{', '.join(map(repr, empty))} hold{'' if len(empty) > 1 else 's'} no files; "
                "an empty class would shift the ids of the classes after it. Remove it, or pass "
                "--allow-empty-classes to keep it as a class with no samples"
            )
        found.notes.append(f"empty classes kept: {', '.join(empty)}")
    return found


def _list_files(folder: str, names: list[str], label: int, sink: SourceListWriter) -> list[tuple[str, str]]:
    """Files (names in ``folder``, or paths when it is "") into the list, in order; those whose
    names are not UTF-8 come back as rejects."""
    if not names:
        return []
    prefix = f"{folder}/" if folder else ""
    try:
        sink.add_joined((prefix + ("\0" + prefix).join(names) + "\0").encode(), label)
        return []
    except UnicodeEncodeError:  # one name or more is not UTF-8: sort them out one by one
        paths = [prefix + name for name in names]
        named = [p for p in paths if utf8(p)]
        sink.add_joined("\0".join(named).encode() + b"\0" if named else b"", label)
        return [(shown(p), NOT_UTF8) for p in paths if not utf8(p)]


def _scan_bucket(url: str, sink: SourceListWriter, scratch: Path) -> _Found:
    """Class "folders" of a bucket prefix, read as ``_scan_tree`` reads a folder: the first key
    segment is the class, files in ImageFolder order (by folder, then name), hidden entries out.
    Keys are sorted as (class NUL folder NUL name) records, so a listing of any size is sorted
    on disk."""
    storage = ObjectStorage(url)
    attempts = 0

    def listing() -> tuple[_Found, SortedRuns]:
        nonlocal attempts
        attempts += 1  # a listing retried from its start begins afresh
        found, records = _Found([]), SortedRuns(scratch / f"bucket-{attempts}")
        classes: set[str] = set()
        for key in _keys(storage):
            parts = key.split("/")
            if any(p.startswith(".") for p in parts):
                found.hidden += 1
            elif len(parts) == 1:
                found.skipped.append((storage.where(key), "outside any class folder"))
            else:
                folder, name = key.rsplit("/", 1)
                classes.add(parts[0])
                records.add(b"\0".join((parts[0].encode(), folder.encode(), name.encode())))
        found.classes = sorted(classes)
        return found, records

    found, records = storage._call("listing", "", listing)  # retried whole, as any listing
    if not found.classes:
        raise SourceError(f"SRC {url!r} has no class prefixes (CLASS/IMAGE keys) or does not exist")
    labels = {name: label for label, name in enumerate(found.classes)}
    batch: list[bytes] = []
    batch_labels: list[int] = []
    for record in records:
        name, folder, file = record.split(b"\0")
        batch.append(storage.where(f"{folder.decode()}/{file.decode()}").encode())
        batch_labels.append(labels[name.decode()])
        if len(batch) == BATCH:
            sink.add(batch, np.array(batch_labels, dtype=np.int64))
            batch, batch_labels = [], []
    sink.add(batch, np.array(batch_labels, dtype=np.int64))
    return found


def _keys(storage: ObjectStorage) -> Iterator[str]:
    """Every key under the storage's prefix, batch by batch as the listing pages come."""
    import obstore

    for batch in obstore.list(storage.store, None):
        for meta in batch:
            yield meta["path"]


# -- manifests ----------------------------------------------------------------------------------
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


def _read_manifest(manifest: Path, options: SourceOptions, sink: SourceListWriter, scratch: Path) -> _Found:
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
    return _Found(rule.classes)


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


def _label_rule(rows: Iterator[_Row], manifest: Path, rule: str) -> _Rule:
    """One pass over the rows: what the label rule (auto, int or names) makes of them. Only
    what picks the rule and the first line at fault is kept, and the class names: never a
    value per row."""
    count = numeric = 0
    first_not_int = first_number = first_bad_int = None
    top = -1
    names: set[str] | None = set() if rule != "int" else None
    for row in rows:
        count += 1
        is_int = _is_int(row.label)
        if _is_number(row.label):
            numeric += 1
            if first_number is None:
                first_number = row
                if rule == "auto":
                    names = None  # auto reads names only when none looks like a number
        if not is_int and first_not_int is None:
            first_not_int = row
        if is_int:
            top = max(top, int(row.label))
        if (not is_int or int(row.label) < 0) and first_bad_int is None:
            first_bad_int = row
        if names is not None:
            names.add(str(row.label).strip())
    if rule == "auto":
        if first_not_int is None:
            rule = "int"
        elif first_number is None:
            rule = "names"
        else:
            ints = 2 * numeric >= count
            bad = first_not_int if ints else first_number
            return _Rule([], error=SourceError(
                f"{_where(manifest, bad)}: label {bad.label!r} mixes with "
                f"{'integer labels' if ints else 'class names'}: fix it, or "
                "pass --labels int or --labels names to say how to read every label"
            ))
    if rule == "int":
        if first_bad_int is not None:
            return _Rule([], error=SourceError(
                f"{_where(manifest, first_bad_int)}: label {first_bad_int.label!r} is not an integer >= 0"))
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
