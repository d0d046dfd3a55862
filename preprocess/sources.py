"""Find the source images and their labels: a class-per-folder tree or a CSV / JSON Lines manifest."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from preprocess.errors import SourceError

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson")


@dataclass(frozen=True)
class Sources:
    """Source images in store order, with int labels into ``classes``."""

    paths: list[str]
    labels: list[int]
    classes: list[str]
    skipped: list[tuple[str, str]]  # (path, reason): files seen that cannot carry a label

    def __len__(self) -> int:
        return len(self.paths)


def find_sources(src: str | os.PathLike[str]) -> Sources:
    root = Path(src)
    if not root.exists():
        raise SourceError(f"SRC {str(root)!r} does not exist")
    if root.is_dir():
        found = _scan_tree(root)
    elif root.suffix.lower() in MANIFEST_SUFFIXES:
        found = _read_manifest(root)
    else:
        raise SourceError(
            f"SRC {str(root)!r} must be a folder (one subfolder per class) or a manifest "
            f"({', '.join(MANIFEST_SUFFIXES)})"
        )
    if not found.paths and not found.skipped:
        raise SourceError(f"SRC {str(root)!r} holds no images")
    return found


def _visible_files(folder: Path) -> list[Path]:
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        files.extend(Path(dirpath, f) for f in filenames if not f.startswith("."))
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def _scan_tree(root: Path) -> Sources:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SourceError(
            f"SRC {str(root)!r} has no class subfolders: put each class's images in a subfolder, "
            "or pass a manifest (CSV or JSON Lines of path,label)"
        )
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for f in _visible_files(root / name):
            paths.append(str(f))
            labels.append(label)
    skipped = [
        (str(root / e.name), "outside any class folder")
        for e in sorted(os.scandir(root), key=lambda e: e.name)
        if e.is_file() and not e.name.startswith(".")
    ]
    return Sources(paths, labels, classes, skipped)


def _read_manifest(manifest: Path) -> Sources:
    base = manifest.parent
    rows: list[tuple[str, str | int]] = []
    try:
        with open(manifest, newline="", encoding="utf-8") as f:
            if manifest.suffix.lower() == ".csv":
                rows = _csv_rows(f, manifest)
            else:
                rows = _jsonl_rows(f, manifest)
    except OSError as e:
        raise SourceError(f"cannot read manifest {str(manifest)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SourceError(f"manifest {str(manifest)!r} is not UTF-8 text") from None
    paths = [str(p if os.path.isabs(p) else base / p) for p, _ in rows]
    raw = [label for _, label in rows]
    if all(isinstance(v, int) for v in raw):
        ints = [int(v) for v in raw]
        if any(v < 0 for v in ints):
            raise SourceError(f"manifest {str(manifest)!r}: labels must be >= 0")
        classes = [str(i) for i in range(max(ints, default=-1) + 1)]
        return Sources(paths, ints, classes, [])
    names = sorted({str(v) for v in raw})
    index = {n: i for i, n in enumerate(names)}
    return Sources(paths, [index[str(v)] for v in raw], names, [])


def _label(value: str) -> str | int:
    value = value.strip()
    return int(value) if value.lstrip("-").isdigit() else value


def _csv_rows(f: TextIO, manifest: Path) -> list[tuple[str, str | int]]:
    rows = []
    for lineno, row in enumerate(csv.reader(f), start=1):
        if not row or not "".join(row).strip():
            continue
        if lineno == 1 and [c.strip().lower() for c in row[:2]] == ["path", "label"]:
            continue
        if len(row) < 2 or not row[0].strip():
            raise SourceError(f"{manifest}:{lineno}: expected 'path,label', got {','.join(row)!r}")
        rows.append((row[0].strip(), _label(row[1])))
    return rows


def _jsonl_rows(f: TextIO, manifest: Path) -> list[tuple[str, str | int]]:
    rows = []
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            path, label = obj["path"], obj["label"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SourceError(
                f'{manifest}:{lineno}: expected a JSON object {{"path": ..., "label": ...}}'
            ) from None
        if isinstance(label, bool) or not isinstance(label, (int, str)) or not isinstance(path, str):
            raise SourceError(f"{manifest}:{lineno}: path must be a string, label an int or string")
        rows.append((path, label))
    return rows
