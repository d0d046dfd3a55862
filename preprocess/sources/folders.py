"""Class folders read as torchvision's ImageFolder reads them: one subfolder of SRC per class,
numbered in name order, and every visible file under it an input, in ImageFolder order (folders
sorted by path, files by name). Hidden entries are left out and counted, links are followed and
each real folder entered once, so a symlink loop is a reject rather than an endless walk.

A class's files are sorted in memory while few and in runs on disk past ``HELD_NAMES``
(``spill``), and a folder is read ``SCAN_CHUNK`` entries at a time: no step holds a whole class.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Final

from tilefeed.preprocess.sources.scanning import BATCH, NOT_UTF8, Scan, SourceOptions, shown, utf8
from tilefeed.preprocess.sources.source_list import SourceListWriter
from tilefeed.preprocess.sources.spill import SortedRuns
from tilefeed.store.errors import SourceError

HELD_NAMES: Final = 1 << 18  # file names of one class sorted in memory; past this, on disk
SCAN_CHUNK: Final = 1 << 14  # entries of a folder read at once
# The one class of a store made with targets: its image-level label says nothing (every tile's
# is 0); what it holds is in its objects and masks.
IMAGE_CLASS: Final = "image"


def scan_tree(root: Path, options: SourceOptions, exclude: Path | None, sink: SourceListWriter,
              scratch: Path) -> Scan:
    """The class folders of ``root`` into ``sink``, one class after another; ``exclude`` is a
    folder inside ``root`` never to scan (the store being written)."""
    entries, classes = _class_folders(root, exclude)
    skipped: list[tuple[str, str]] = []
    hidden = sum(e.name.startswith(".") for e in entries)
    empty: list[str] = []
    for label, name in enumerate(classes):
        walk = _walk(root / name, exclude, scratch)
        if not walk.files.count:
            empty.append(name)
        for folder, names in walk.files.batches():
            skipped += _list_files(folder, names, label, sink)
        skipped += [(shown(p), reason) for p, reason in walk.skipped]
        hidden += walk.hidden
    skipped += [
        (shown(e.path), "outside any class folder") for e in entries
        if not e.name.startswith(".") and e.is_file()
    ]
    notes = [f"OUT {exclude.name!r} inside SRC was not scanned"] if exclude is not None else []
    if empty and sink.count:
        if not options.allow_empty_classes:
            raise SourceError(
                f"SRC {str(root)!r}: class folder{'s' if len(empty) > 1 else ''} "
                f"{', '.join(map(repr, empty))} hold{'' if len(empty) > 1 else 's'} no files; "
                "an empty class would shift the ids of the classes after it. Remove it, or pass "
                "--allow-empty-classes to keep it as a class with no samples"
            )
        notes.append(f"empty classes kept: {', '.join(empty)}")
    return Scan(classes=classes, skipped=skipped, hidden=hidden, notes=notes)


def _class_folders(root: Path, exclude: Path | None) -> tuple[list[os.DirEntry[str]], list[str]]:
    """The entries of ``root`` by name, and its class folders: the visible folders but
    ``exclude``, each named in UTF-8 (a class name is store text)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise SourceError(f"cannot read SRC {str(root)!r}: {e.strerror or e}") from None
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")
               and (exclude is None or Path(e.path).resolve() != exclude)]
    for name in classes:
        if not utf8(name):
            raise SourceError(f"SRC {str(root)!r}: the class folder {shown(name)!r} has a name that is "
                              "not valid UTF-8, which the store's class names cannot hold; rename it")
    if not classes:
        raise SourceError(
            f"SRC {str(root)!r} has no class subfolders: put each class's images in a subfolder, "
            "or pass a manifest (CSV or JSON Lines of path,label)"
        )
    return entries, classes


def _sortable(text: str) -> bytes:
    """``text`` as bytes whose order is the str order: UTF-8 keeps code point order, and
    ``surrogatepass`` keeps a name that is not UTF-8 (its lone surrogates) in its place."""
    return text.encode("utf-8", "surrogatepass")


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
    handed = False  # some of the folder's files are in the list already
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
                            Path(entry.path).resolve() == exclude):
                        continue
                    elif entry.is_dir():  # follows links
                        later.append((name, True))
                    elif entry.is_file():
                        names.append(name)
                    elif entry.is_symlink():
                        later.append((name, False))
                walk.files.add(d, names)
                handed = True
    except OSError as err:  # one unreadable folder is a reject, not the end of the scan
        reason = err.strerror or err
        # read partway: what was read stays listed, the reject stands for the rest (and the
        # folders found before the error are still read)
        walk.skipped.append((d, f"folder read stopped partway: {reason}" if handed
                             else f"unreadable folder: {reason}"))
    return later


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


def scan_images(root: Path, exclude: Path | None, sink: SourceListWriter, scratch: Path) -> Scan:
    """Every visible file under ``root`` (no class folders: a detection or segmentation set's
    image folder), in ImageFolder order, each of label 0; ``exclude`` as for ``scan_tree``."""
    if not root.is_dir():
        raise SourceError(f"{str(root)!r} is not a folder of images")
    walk = _walk(root, exclude, scratch)
    skipped: list[tuple[str, str]] = []
    for folder, names in walk.files.batches():
        skipped += _list_files(folder, names, 0, sink)
    skipped += [(shown(p), reason) for p, reason in walk.skipped]
    notes = [f"OUT {exclude.name!r} inside SRC was not scanned"] if exclude is not None else []
    return Scan(classes=[IMAGE_CLASS], skipped=skipped, hidden=walk.hidden, notes=notes)
