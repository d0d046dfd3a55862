"""Find the source images and their labels: a class-per-folder tree (``folders``), a bucket of
CLASS/IMAGE keys (``bucket``), or a CSV / JSON Lines manifest (``manifest``).

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
from tilefeed.preprocess.sources.pairs import PairTable
from tilefeed.preprocess.sources.scanning import BATCH, Scan, SourceOptions, shown, utf8
from tilefeed.preprocess.sources.source_list import SourceList, SourceListWriter
from tilefeed.preprocess.sources.targets import TargetSource, scan_targets
from tilefeed.preprocess.settings import TargetOptions
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import is_url

MANIFEST_SUFFIXES: Final = (".csv", ".jsonl", ".ndjson")
LIST_FOLDER: Final = "list"


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
                 exclude: Path | None = None, stride: int = BATCH,
                 targets: TargetOptions | None = None) -> Listing:
    """Read SRC into a source list in ``scratch`` (an empty folder the caller owns and removes),
    indexed every ``stride`` sources; ``exclude`` is a folder inside SRC never to scan.
    ``targets``: SRC is an image folder with targets beside it (``sources.targets``)."""
    options = options or SourceOptions()
    check_source(src)
    sink = SourceListWriter(scratch / LIST_FOLDER, stride)
    found_targets = None
    try:
        if targets is not None and targets.kind is not None:
            if is_url(src) or not Path(src).is_dir():
                raise SourceError(f"SRC {str(src)!r}: targets are read beside an image folder on this machine")
            found, found_targets = scan_targets(Path(src), targets, exclude, sink, scratch)
        elif is_url(src):
            found = scan_bucket(str(src), sink, scratch)
        elif Path(src).is_dir():
            found = scan_tree(Path(src), options, exclude, sink, scratch)
        else:
            found = read_manifest(Path(src), options, sink, scratch)
    finally:
        files = sink.close()
    if not len(files) and not found.skipped:
        raise SourceError(f"SRC {str(Path(src))!r} holds no images")
    return Listing(files=files, targets=found_targets, **_found(found))


def _found(scan: Scan) -> dict[str, Any]:
    """What ``scan`` found besides its sources, by field name: a ``Scan``'s part of a
    ``Listing`` or of ``Sources``."""
    return {f.name: getattr(scan, f.name) for f in fields(Scan)}
