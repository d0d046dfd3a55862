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
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO
from urllib.parse import urlsplit

from tilefeed.preprocess.errors import ConfigError, SourceError
from tilefeed.preprocess.storage import OBJECT_SCHEMES, ObjectStorage, is_url

MANIFEST_SUFFIXES: Final = (".csv", ".jsonl", ".ndjson")
LABEL_RULES: Final = ("auto", "int", "names")
_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


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
    """Source images in store order, with int labels into ``classes``."""

    paths: list[str]
    labels: list[int]
    classes: list[str]
    skipped: list[tuple[str, str]]  # (path, reason): inputs that cannot enter the store
    hidden: int = 0  # hidden files and folders left out of a class-folder scan
    notes: list[str] = field(default_factory=list)  # what the summary should say about SRC

    def __len__(self) -> int:
        return len(self.paths)


def find_sources(src: str | os.PathLike[str], options: SourceOptions | None = None,
                 exclude: Path | None = None) -> Sources:
    """Read SRC; ``exclude`` is a folder inside it never to scan (the store being written)."""
    options = options or SourceOptions()
    if is_url(src):
        return _scan_bucket(str(src), options)
    root = Path(src)
    if not utf8(str(root)):
        raise SourceError(f"SRC {shown(str(root))!r}: its path is not valid UTF-8, which the store's "
                          "text cannot hold; rename it or link to it under a UTF-8 name")
    if not root.exists():
        raise SourceError(f"SRC {str(root)!r} does not exist")
    if root.is_dir():
        found = _scan_tree(root, options, exclude)
    elif root.suffix.lower() in MANIFEST_SUFFIXES:
        found = _read_manifest(root, options)
    else:
        raise SourceError(
            f"SRC {str(root)!r} must be a folder (one subfolder per class) or a manifest "
            f"({', '.join(MANIFEST_SUFFIXES)})"
        )
    if not found.paths and not found.skipped:
        raise SourceError(f"SRC {str(root)!r} holds no images")
    return found


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


def _named(paths: list[str], labels: list[int]) -> tuple[list[str], list[int], list[tuple[str, str]]]:
    """The inputs whose names are UTF-8, and the others as rejects."""
    good = [k for k, p in enumerate(paths) if utf8(p)]
    if len(good) == len(paths):
        return paths, labels, []
    bad = sorted(set(range(len(paths))) - set(good))
    return [paths[k] for k in good], [labels[k] for k in good], [(shown(paths[k]), NOT_UTF8) for k in bad]


# -- class folders ------------------------------------------------------------------------------
@dataclass
class _Walk:
    """One class folder's files, with what the walk met on the way."""

    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    hidden: int = 0


def _walk(folder: Path, exclude: Path | None) -> _Walk:
    """Every visible file under ``folder``, links followed, each real folder entered once.

    Files come in torchvision's ImageFolder order: folders sorted by path, files by name.
    """
    walk = _Walk()
    seen: set[tuple[int, int]] = set()
    groups: list[tuple[str, list[Path]]] = []

    def visit(d: Path) -> None:
        try:
            st = d.stat()
            if (st.st_dev, st.st_ino) in seen:
                walk.skipped.append((str(d), "symlink loop: the folder it links to was already read"))
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as err:  # one unreadable folder is a reject, not the end of the scan
            walk.skipped.append((str(d), f"unreadable folder: {err.strerror or err}"))
            return
        files: list[Path] = []
        groups.append((str(d), files))
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                walk.hidden += 1
            elif exclude is not None and path.absolute() == exclude:
                continue
            elif entry.is_dir():  # follows links
                visit(path)
            elif entry.is_file():
                files.append(path)
            elif entry.is_symlink():
                walk.skipped.append((str(path), "dangling link: its target does not exist"))

    visit(folder)
    walk.files = [f for _, files in sorted(groups, key=lambda g: g[0]) for f in files]
    return walk


def _scan_tree(root: Path, options: SourceOptions, exclude: Path | None) -> Sources:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise SourceError(f"cannot read SRC {str(root)!r}: {e.strerror or e}") from None
    hidden = sum(e.name.startswith(".") for e in entries)
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")
               and (exclude is None or Path(e.path).absolute() != exclude)]
    notes = []
    if exclude is not None:
        notes.append(f"OUT {exclude.name!r} inside SRC was not scanned")
    for name in classes:
        if not utf8(name):
            raise SourceError(f"SRC {str(root)!r}: the class folder {shown(name)!r} has a name that is "
                              "not valid UTF-8, which the store's class names cannot hold; rename it")
    if not classes:
        raise SourceError(
            f"SRC {str(root)!r} has no class subfolders: put each class's images in a subfolder, "
            "or pass a manifest (CSV or JSON Lines of path,label)"
        )
    paths: list[str] = []
    labels: list[int] = []
    skipped: list[tuple[str, str]] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        walk = _walk(root / name, exclude)
        files, _, unnamed = _named([str(f) for f in walk.files], [label] * len(walk.files))
        paths += files
        labels += [label] * len(files)
        skipped += unnamed + [(shown(p), reason) for p, reason in walk.skipped]
        hidden += walk.hidden
        if not walk.files:
            empty.append(name)
    skipped += [
        (shown(e.path), "outside any class folder") for e in entries
        if not e.name.startswith(".") and e.is_file()
    ]
    if empty and paths:
        if not options.allow_empty_classes:
            raise SourceError(
                f"SRC {str(root)!r}: class folder{'s' if len(empty) > 1 else ''} "
                f"{', '.join(map(repr, empty))} hold{'' if len(empty) > 1 else 's'} no files; "
                "an empty class would shift the ids of the classes after it. Remove it, or pass "
                "--allow-empty-classes to keep it as a class with no samples"
            )
        notes.append(f"empty classes kept: {', '.join(empty)}")
    return Sources(paths, labels, classes, skipped, hidden=hidden, notes=notes)


def _scan_bucket(url: str, options: SourceOptions) -> Sources:
    """Class "folders" of a bucket prefix, read as ``_scan_tree`` reads a folder: the first key
    segment is the class, files in ImageFolder order (by folder, then name), hidden entries out."""
    storage = ObjectStorage(url)
    by_class: dict[str, list[str]] = {}
    skipped: list[tuple[str, str]] = []
    hidden = 0
    for key in storage.sizes():
        parts = key.split("/")
        if any(p.startswith(".") for p in parts):
            hidden += 1
        elif len(parts) == 1:
            skipped.append((storage.where(key), "outside any class folder"))
        else:
            by_class.setdefault(parts[0], []).append(key)
    if not by_class:
        raise SourceError(f"SRC {url!r} has no class prefixes (CLASS/IMAGE keys) or does not exist")
    classes = sorted(by_class)
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        keys = sorted(by_class[name], key=lambda k: k.rsplit("/", 1))
        paths += [storage.where(k) for k in keys]
        labels += [label] * len(keys)
    return Sources(paths, labels, classes, skipped, hidden=hidden)


# -- manifests ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Row:
    line: int
    path: str
    label: str | int | float  # as written: CSV text, or the JSON value


def _read_manifest(manifest: Path, options: SourceOptions) -> Sources:
    try:
        # utf-8-sig: spreadsheets start CSVs with a byte-order mark; newline="" lets csv see CRLF
        with open(manifest, newline="", encoding="utf-8-sig") as f:
            rows = _csv_rows(f, manifest) if manifest.suffix.lower() == ".csv" else _jsonl_rows(f, manifest)
    except OSError as e:
        raise SourceError(f"cannot read manifest {str(manifest)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SourceError(f"manifest {str(manifest)!r} is not UTF-8 text") from None
    paths = _resolve_paths(rows, manifest, options)
    labels, classes = _labels(rows, manifest, options.labels)
    return Sources(paths, labels, classes, [])


def _where(manifest: Path, row: _Row) -> str:
    return f"{manifest}:{row.line}"


def _resolve_paths(rows: list[_Row], manifest: Path, options: SourceOptions) -> list[str]:
    base = os.path.abspath(manifest.parent)
    real_base = os.path.realpath(base)
    paths: list[str] = []
    first: dict[str, _Row] = {}
    for row in rows:
        if _URL.match(row.path):
            path = real = _checked_url(row, manifest, options)
        else:
            path = os.path.normpath(os.path.join(base, row.path))
            # the file it names in the end, links resolved: a link inside the folder may lead out
            real = os.path.realpath(path)
            if not options.allow_outside and os.path.commonpath([real_base, real]) != real_base:
                via = f" (a link to {real!r})" if os.path.commonpath([base, path]) == base else ""
                raise SourceError(
                    f"{_where(manifest, row)}: path {row.path!r}{via} is outside the manifest's folder "
                    f"{base!r}; pass --allow-outside to read files elsewhere"
                )
        if real in first and not options.allow_duplicates:  # two names of one file repeat it
            earlier = first[real]
            what = "with another label" if earlier.label != row.label else "again"
            raise SourceError(
                f"{_where(manifest, row)}: {row.path!r} is listed {what} (first at line "
                f"{earlier.line}); remove the repeat, or pass --allow-duplicates to keep it"
            )
        first.setdefault(real, row)
        paths.append(path)
    return paths


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


def _labels(rows: list[_Row], manifest: Path, rule: str) -> tuple[list[int], list[str]]:
    def is_int(v: str | int | float) -> bool:
        return isinstance(v, int) or (isinstance(v, str) and bool(_INT.fullmatch(v.strip())))

    def is_number(v: str | int | float) -> bool:
        return not isinstance(v, str) or bool(_NUMBER.fullmatch(v.strip()))

    if rule == "auto":
        ints = [is_int(r.label) for r in rows]
        if all(ints):
            rule = "int"
        elif not any(is_number(r.label) for r in rows):
            rule = "names"
        else:
            numeric = sum(is_number(r.label) for r in rows)
            bad = next(r for r in rows if (not is_int(r.label) if 2 * numeric >= len(rows)
                                           else is_number(r.label)))
            raise SourceError(
                f"{_where(manifest, bad)}: label {bad.label!r} mixes with "
                f"{'integer labels' if 2 * numeric >= len(rows) else 'class names'}: fix it, or "
                "pass --labels int or --labels names to say how to read every label"
            )
    if rule == "int":
        values = []
        for r in rows:
            if not is_int(r.label) or int(r.label) < 0:
                raise SourceError(f"{_where(manifest, r)}: label {r.label!r} is not an integer >= 0")
            values.append(int(r.label))
        return values, [str(i) for i in range(max(values, default=-1) + 1)]
    names = sorted({str(r.label).strip() for r in rows})
    index = {n: i for i, n in enumerate(names)}
    return [index[str(r.label).strip()] for r in rows], names


def _csv_rows(f: TextIO, manifest: Path) -> list[_Row]:
    rows: list[_Row] = []
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
        rows.append(_checked(manifest, line, cells[columns[0]].strip(), cells[columns[1]].strip()))
    return rows


def _jsonl_rows(f: TextIO, manifest: Path) -> list[_Row]:
    rows: list[_Row] = []
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
        rows.append(_checked(manifest, line, path.strip(), label.strip() if isinstance(label, str) else label))
    return rows


def _checked(manifest: Path, line: int, path: str, label: str | int | float) -> _Row:
    if not path:
        raise SourceError(f"{manifest}:{line}: empty path")
    if not utf8(path) or (isinstance(label, str) and not utf8(label)) or "\0" in path:
        raise SourceError(f"{manifest}:{line}: the path or label holds an escaped lone surrogate or NUL, "
                          "which no file name or class name can hold")
    if label == "":
        raise SourceError(f"{manifest}:{line}: empty label for {path!r}")
    return _Row(line, path, label)
