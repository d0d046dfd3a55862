"""What a scan of image-text sources keeps per source besides its path and label: its captions,
its metadata fields and, for an image held inside another file (a tar member, a parquet row),
where its bytes are (its *member*).

A table is a folder of two files, written in store order as the scan lists sources: ``lines``,
one JSON object a source (``{"t": {name: caption}, "f": {name: value}, "m": member or null}``),
and ``index``, the little-endian int64 offset of every line and then the file's size, so a
part's lines are one byte range. Nothing holds every source: the writer streams the lines once,
holding a chunk of each array it writes (``metadata._write_pairs``).

A field's dtype is decided by the values the scan met: whole numbers only, int64; numbers,
float64 (a source without the field: NaN); anything else, a string (numbers written as JSON
writes them, objects and lists as JSON text; a source without it: ""). Booleans are 0 and 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError

LINES: Final = "lines"
INDEX: Final = "index"
WRITE_BUFFER: Final = 1 << 18
_INT64: Final = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class PairTable:
    """A finished table: ``count`` sources' captions (``texts``, by name, in order), fields
    (name, dtype) and members, in ``folder``; ``labelled``: the sources' labels are class
    labels; ``digest``: sha256 of the lines, part of the run's fingerprint."""

    folder: Path
    count: int
    texts: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]
    labelled: bool
    digest: str

    def read(self, first: int, count: int) -> bytes:
        """The lines of sources [first, first + count), back to back (each ends in a newline)."""
        stop = min(first + count, self.count)
        if stop <= first:
            return b""
        index = self.folder / INDEX
        start = int(np.fromfile(index, dtype="<i8", count=1, offset=8 * first)[0])
        end = int(np.fromfile(index, dtype="<i8", count=1, offset=8 * stop)[0])
        with open(self.folder / LINES, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every source's record, in order."""
        with open(self.folder / LINES, "rb") as f:
            for line in f:
                yield json.loads(line)


def members(lines: bytes) -> list[dict[str, Any] | None]:
    """Each source's member (None: a file of its own), from a part's lines."""
    return [json.loads(line)["m"] for line in lines.splitlines()]


def stored(value: Any, dtype: str) -> Any:
    """A caption's or field's value as the store holds it in an array of ``dtype``: text as it
    is (an absent one ""; numbers, objects and lists as JSON writes them), a number as int or
    float (absent: 0 or NaN)."""
    if dtype == "string":
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if value is None:
        return math.nan if dtype == "float64" else 0
    return float(value) if dtype == "float64" else int(value)


def _kind(value: Any) -> str:
    """The narrowest dtype that holds ``value``: int64, float64 or string."""
    if isinstance(value, bool):
        return "int64"
    if isinstance(value, int):
        return "int64" if _INT64[0] <= value <= _INT64[1] else "string"
    if isinstance(value, float):
        return "float64"
    return "string"


_WIDER: Final = {("int64", "float64"): "float64", ("float64", "int64"): "float64"}


class PairTableWriter:
    """Appends one record per source, in store order; ``close`` gives the ``PairTable``.

    Parameters
    ----------
    folder : Path
        An empty folder the caller owns.
    texts : sequence of str
        The caption names every record may hold (``--caption-key``).
    fields : sequence of str
        The field names kept (``--fields``); others a source carries are dropped.
    labelled : bool
        The sources' labels are class labels.
    """

    def __init__(self, folder: Path, texts: Sequence[str], fields: Sequence[str], labelled: bool) -> None:
        for name in (*texts, *fields):
            if not fmt.PAIR_NAME.fullmatch(name):
                raise SourceError(f"{name!r} cannot name a caption or field: use letters, digits and _ "
                                  "(at most 64, not starting with a digit)")
        if len(texts) > fmt.MAX_TEXTS or len(fields) > fmt.MAX_FIELDS:
            raise SourceError(f"a store holds at most {fmt.MAX_TEXTS} caption names and "
                              f"{fmt.MAX_FIELDS} fields")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.texts, self.field_names, self.labelled = folder, tuple(texts), tuple(fields), labelled
        self.kinds: dict[str, str] = {}
        self._lines = open(folder / LINES, "wb", buffering=WRITE_BUFFER)
        self._index = open(folder / INDEX, "wb", buffering=WRITE_BUFFER)
        self._hash = hashlib.sha256()
        self.count = self.nbytes = 0

    def add(self, texts: Mapping[str, str], fields: Mapping[str, Any],
            member: Mapping[str, Any] | None = None) -> None:
        """One source's captions (by name; each UTF-8 text of at most MAX_TEXT_BYTES, checked
        by the scan, which rejects the source otherwise), its fields (others dropped) and its
        member."""
        kept = {name: fields[name] for name in self.field_names if fields.get(name) is not None}
        for name, value in kept.items():
            kind, was = _kind(value), self.kinds.get(name)
            if isinstance(value, float) and not math.isfinite(value):
                kind = "float64"
            self.kinds[name] = kind if was is None or was == kind else _WIDER.get((was, kind), "string")
        record = {"t": {k: v for k, v in texts.items() if k in self.texts}, "f": kept,
                  "m": None if member is None else dict(member)}
        line = json.dumps(record, ensure_ascii=False, allow_nan=True).encode() + b"\n"
        self._index.write(self.nbytes.to_bytes(8, "little"))
        self._lines.write(line)
        self._hash.update(line)
        self.count += 1
        self.nbytes += len(line)

    def container(self, path: str, size: int, mtime_ns: int) -> None:
        """A local file the members that follow lie in (a tar, a parquet file): its size and
        time of change go into the digest, not the lines, so that a run over a file rewritten
        in place is not found up to date (a member records only where its bytes lie).

        Parameters
        ----------
        path : str
            The file's real path, as its members name it.
        size, mtime_ns : int
            Its ``st_size`` and ``st_mtime_ns`` as the scan read it.
        """
        self._hash.update(b"\0container\0" + json.dumps([path, size, mtime_ns]).encode() + b"\n")

    def close(self) -> PairTable:
        self._index.write(self.nbytes.to_bytes(8, "little"))
        self._lines.close()
        self._index.close()
        fields = tuple((name, self.kinds.get(name, "string")) for name in self.field_names)
        return PairTable(self.folder, self.count, self.texts, fields, self.labelled, self._hash.hexdigest())
