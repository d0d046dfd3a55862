"""Find the source images and their labels: a class-per-folder tree (``folders``), a bucket of
CLASS/IMAGE keys (``bucket``), or a CSV / JSON Lines manifest (``manifest``); or image-text
samples with their captions and fields (``PairOptions``): WebDataset tar shards
(``webdataset``), parquet files (``parquet``) or a caption table (``table``), whose captions,
fields and members go to a pair table beside the source list (``pairs``).

``--source auto`` decides what SRC is from SRC itself (``decide``): a brace pattern, a ``.tar``,
a ``.txt`` list of tars or a folder of tars are WebDataset shards; a ``.parquet`` or a folder of
them, parquet; a ``.tsv``, or a ``.csv`` / ``.jsonl`` whose header names the caption column and
no ``label`` column, a caption table; any other ``.csv`` / ``.jsonl`` a manifest and a folder
of class folders, as before. A folder that would be two of these is refused, naming
``--source``. In a bucket, shards and parquet are told the same way, a prefix ending in ``/``
by one listing of it (``_prefix_kind``); any other bucket SRC is CLASS/IMAGE keys.

Every path and name is untrusted. A file whose name is not UTF-8 (which the store's text cannot
hold) is a reject, not an error. Class folders are read as torchvision's ImageFolder reads them,
except where the README says otherwise (hidden entries skipped, every file an input, symlink
loops followed once).

A scan streams: sources go to a list on disk (``sourcelist``) in store order as they are found,
sorted where sorting is needed by runs on disk (``spill``), so that no step holds every source.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from tilefeed.preprocess.sources.bucket import scan_bucket
from tilefeed.preprocess.sources.folders import scan_tree
from tilefeed.preprocess.sources.manifest import read_manifest
from tilefeed.preprocess.sources.pairs import PairTable, PairTableWriter
from tilefeed.preprocess.sources.scanning import (BATCH, PAIR_KINDS, PairOptions, PairSink, Scan, SourceKind,
                                                  SourceOptions, shown, utf8)
from tilefeed.preprocess.sources.source_list import SourceList, SourceListWriter
from tilefeed.preprocess.sources.targets import TargetSource, scan_targets
from tilefeed.preprocess.settings import TargetOptions
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import is_url

MANIFEST_SUFFIXES: Final = (".csv", ".jsonl", ".ndjson")
LIST_FOLDER: Final = "list"
PAIRS_FOLDER: Final = "pairs"
TABLE_SUFFIXES: Final = (".tsv",)  # a caption table whatever its header


@dataclass(frozen=True, kw_only=True)
class Listing(Scan):
    """Source images in store order, listed on disk (``files``), with int labels into ``classes``,
    and their targets' table and records where SRC has targets."""

    files: SourceList
    targets: TargetSource | None = None
    # image-text sources: each listed source's captions, fields and member, in list order
    pairs: PairTable | None = None

    def __len__(self) -> int:
        return len(self.files)


@dataclass(frozen=True, kw_only=True)
class Sources(Scan):
    """Source images in store order, with int labels into ``classes``: a scan held in memory,
    for callers that want lists (the writer reads a ``Listing`` instead)."""

    paths: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.paths)


def find_sources(src: str | os.PathLike[str], options: SourceOptions | None = None,
                 exclude: Path | None = None) -> Sources:
    """Read SRC into memory; ``exclude`` is a folder inside it never to scan (the store being
    written). The lists are as large as SRC: the writer scans to disk (``scan_sources``)."""
    with tempfile.TemporaryDirectory(prefix="tilefeed-scan-") as scratch:
        listing = scan_sources(src, Path(scratch), options, exclude)
        paths = [p.decode("utf-8", "surrogateescape") for p in listing.files.paths()]
        labels = listing.files.labels(0, len(listing)).tolist()
    return Sources(paths=paths, labels=labels, **_found(listing))


def decide(src: str | os.PathLike[str], pairs: PairOptions | None,
           exclude: Path | None = None) -> SourceKind:
    """What SRC is: ``pairs.source``, or, for ``auto`` (and without ``pairs``: today's rules,
    folders or a manifest), what SRC itself says, as the module docstring has it.

    Raises
    ------
    SourceError
        A folder that holds both tar shards and parquet files (or either beside class folders),
        or a ``.csv`` whose header, read with the default tab, holds one comma-separated row of
        the caption columns.
    """
    chosen = SourceKind.AUTO if pairs is None else pairs.source
    if chosen is not SourceKind.AUTO:
        return chosen
    text = os.fspath(src)
    if pairs is None:
        return SourceKind.FOLDERS if is_url(src) or Path(src).is_dir() else SourceKind.MANIFEST
    from tilefeed.preprocess.sources.webdataset import is_pattern

    if is_url(src):  # a bucket of CLASS/IMAGE keys, as before, unless it names shards or parquet
        if is_pattern(text) or text.lower().endswith((".tar", ".txt")):
            return SourceKind.WEBDATASET
        if text.lower().endswith(".parquet"):
            return SourceKind.PARQUET
        return _prefix_kind(text) if text.endswith("/") else SourceKind.FOLDERS

    root = Path(src)
    suffix = root.suffix.lower()
    if is_pattern(text) and not root.exists():
        return SourceKind.WEBDATASET
    if root.is_dir():
        return _folder_kind(root, exclude)
    if suffix in (".tar", ".txt"):
        return SourceKind.WEBDATASET
    if suffix == ".parquet":
        return SourceKind.PARQUET
    if suffix in TABLE_SUFFIXES:
        return SourceKind.TABLE
    if suffix in MANIFEST_SUFFIXES:
        from tilefeed.preprocess.sources.table import caption_columns, header

        captions = set(caption_columns(pairs).values())
        names = header(root, pairs)
        if captions & set(names) and ("label" not in names or pairs.label_key is not None):
            return SourceKind.TABLE
        commas = header(root, pairs, ",") if suffix == ".csv" and pairs.csv_separator != "," else []
        if captions & set(commas) and "label" not in commas and len(names) == 1:
            raise SourceError(f"SRC {text!r}: its header is comma-separated and names the caption column, "
                              f"but caption tables are read with --csv-separator {pairs.csv_separator!r} "
                              "(open_clip's default, a tab): pass --csv-separator ','")
    return SourceKind.MANIFEST if suffix in MANIFEST_SUFFIXES else SourceKind.FOLDERS


def _folder_kind(root: Path, exclude: Path | None) -> SourceKind:
    """A folder of tars, of parquet files (img2dataset's per-shard ones beside tars do not
    count), or of class folders."""
    tars: set[str] = set()
    tables: set[str] = set()
    folders = 0
    try:
        with os.scandir(root) as entries:
            for e in entries:
                if e.name.startswith("."):
                    continue
                stem, suffix = os.path.splitext(e.name)
                if suffix.lower() == ".tar" and e.is_file():
                    tars.add(stem)
                elif suffix.lower() == ".parquet" and e.is_file():
                    tables.add(stem)
                elif e.is_dir() and (exclude is None or Path(e.path).resolve() != exclude):
                    folders += 1
    except OSError as e:
        raise SourceError(f"cannot read SRC {str(root)!r}: {e.strerror or e}") from None
    return _kind_held(str(root), tars, tables, folders)


_FOUND: Final = {SourceKind.WEBDATASET: ".tar shards", SourceKind.PARQUET: ".parquet files",
                 SourceKind.FOLDERS: "subfolders"}


def _kind_held(src: str, tars: set[str], tables: set[str], folders: int | bool) -> SourceKind:
    """What a folder or a bucket prefix holding these tar stems, parquet stems and subfolders
    is: one kind, or a SourceError naming --source where it holds two (img2dataset's parquet
    beside its tar, of the same stem, is the tar's, not a source of its own)."""
    found = [kind for kind, there in ((SourceKind.WEBDATASET, tars), (SourceKind.PARQUET, tables - tars),
                                      (SourceKind.FOLDERS, folders)) if there]
    if len(found) > 1 and (tars or tables):
        raise SourceError(f"SRC {src!r} holds {' and '.join(_FOUND[k] for k in found)}: pass --source "
                          f"{' or --source '.join(k.value for k in found)} to say which to read")
    return found[0] if found else SourceKind.FOLDERS


def _prefix_kind(url: str) -> SourceKind:
    """A bucket prefix's kind, as a folder's (``_folder_kind``), from one listing of it."""
    from tilefeed.preprocess.sources.objects import bucket_url, list_objects

    objects, folders = list_objects(bucket_url(url))
    stems = [os.path.splitext(o.url.rsplit("/", 1)[-1]) for o in objects]
    tars = {stem for stem, suffix in stems if suffix.lower() == ".tar"}
    tables = {stem for stem, suffix in stems if suffix.lower() == ".parquet"}
    return _kind_held(url, tars, tables, bool(folders))


def check_source(src: str | os.PathLike[str], pairs: PairOptions | None = None) -> None:
    """The checks of SRC that need no scan: a URL, or a folder or manifest that exists and
    whose path the store's text can hold (with ``pairs``, a tar, a pattern of tars, a list of
    them, a parquet file or a caption table too). Done before the writer takes OUT's lock."""
    kind = pairs.source if pairs is not None else SourceKind.AUTO
    if kind is SourceKind.AUTO and not (not is_url(src) and Path(src).is_dir()):
        kind = decide(src, pairs)  # a folder is decided by its scan, which knows which folder is OUT
    if kind in PAIR_KINDS:
        if is_url(src) or "://" in os.fspath(src):  # shards and parquet in a bucket: read in place
            from tilefeed.preprocess.sources.objects import bucket_url

            bucket_url(os.fspath(src))
            if kind is SourceKind.TABLE:
                raise SourceError(f"SRC {os.fspath(src)!r}: caption tables are read from this machine's files "
                                  "only (their rows may name pictures in a bucket)")
            return
        from tilefeed.preprocess.sources.webdataset import is_pattern

        if not utf8(os.fspath(src)):
            raise SourceError(f"SRC {shown(os.fspath(src))!r}: its path is not valid UTF-8, which the store's "
                              "text cannot hold; rename it or link to it under a UTF-8 name")
        if not Path(src).exists() and not (kind is SourceKind.WEBDATASET and is_pattern(os.fspath(src))):
            raise SourceError(f"SRC {os.fspath(src)!r} does not exist")
        return
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
            f"({', '.join(MANIFEST_SUFFIXES)})" + ("" if pairs is None else
                                                  ", or image-text samples (--source: tar shards, parquet, "
                                                  "a caption table)")
        )


def scan_sources(src: str | os.PathLike[str], scratch: Path, options: SourceOptions | None = None,
                 exclude: Path | None = None, stride: int = BATCH,
                 targets: TargetOptions | None = None, pairs: PairOptions | None = None) -> Listing:
    """Read SRC into a source list in ``scratch`` (an empty folder the caller owns and removes),
    indexed every ``stride`` sources; ``exclude`` is a folder inside SRC never to scan.
    ``targets``: SRC is an image folder with targets beside it (``sources.targets``).
    ``pairs``: SRC may be image-text samples (``decide``); their captions, fields and members
    go to the listing's pair table."""
    options = options or SourceOptions()
    check_source(src, pairs)
    with_targets = targets is not None and targets.kind is not None
    kind = SourceKind.FOLDERS if with_targets else decide(src, pairs, exclude)
    sink = SourceListWriter(scratch / LIST_FOLDER, stride)
    found_targets = None
    table: PairTable | None = None
    try:
        if kind in PAIR_KINDS:
            assert pairs is not None
            found, table = _scan_pairs(src, kind, options, pairs, sink, scratch)
        elif targets is not None and targets.kind is not None:
            if is_url(src) or not Path(src).is_dir():
                raise SourceError(f"SRC {str(src)!r}: targets are read beside an image folder on this machine")
            found, found_targets = scan_targets(Path(src), targets, exclude, sink, scratch)
        elif is_url(src):
            found = scan_bucket(str(src), sink, scratch)
        elif kind is SourceKind.FOLDERS or (kind is SourceKind.AUTO and Path(src).is_dir()):
            if not Path(src).is_dir():
                raise SourceError(f"SRC {str(src)!r}: --source folders reads a folder of class folders")
            found = scan_tree(Path(src), options, exclude, sink, scratch)
        else:
            if Path(src).is_dir():
                raise SourceError(f"SRC {str(src)!r}: --source manifest reads a .csv or .jsonl file")
            found = read_manifest(Path(src), options, sink, scratch)
    finally:
        files = sink.close()
    if not len(files) and not found.skipped:
        raise SourceError(f"SRC {str(src) if kind in PAIR_KINDS else str(Path(src))!r} holds no images")
    return Listing(files=files, targets=found_targets, pairs=table, **_found(found))


def _scan_pairs(src: str | os.PathLike[str], kind: SourceKind, options: SourceOptions, pairs: PairOptions,
                sink: SourceListWriter, scratch: Path) -> tuple[Scan, PairTable]:
    """Image-text samples into ``sink`` and a pair table in ``scratch``."""
    writer = PairTableWriter(scratch / PAIRS_FOLDER, pairs.caption_key, pairs.field_names, pairs.labelled)
    out = PairSink(sink, writer, pairs)
    try:
        if kind is SourceKind.WEBDATASET:
            from tilefeed.preprocess.sources.webdataset import scan_webdataset

            found = scan_webdataset(os.fspath(src), options, pairs, out)
        elif kind is SourceKind.PARQUET:
            from tilefeed.preprocess.sources.parquet import scan_parquet

            found = scan_parquet(os.fspath(src) if is_url(src) else Path(src), options, pairs, out)
        else:
            from tilefeed.preprocess.sources.table import scan_table

            found = scan_table(Path(src), options, pairs, out)
    finally:
        out.flush()
        table = writer.close()
    return found, table


def _found(scan: Scan) -> dict[str, Any]:
    """What ``scan`` found besides its sources, by field name: a ``Scan``'s part of a
    ``Listing`` or of ``Sources``."""
    return {f.name: getattr(scan, f.name) for f in fields(Scan)}
