"""A caption table, as open_clip's ``CsvDataset`` reads one: a TSV or CSV (``--csv-separator``,
a tab by default, whatever the suffix) or JSON Lines, a row per sample, its image path in
``--csv-img-key`` (``filepath``) and its caption in ``--csv-caption-key`` (``title``), stored as
the caption named ``caption``; with several ``--caption-key`` names, those columns are the
captions, by their names. Other columns named by ``--fields`` are the sample's fields, and
``--label-key`` its label.

Paths resolve as a manifest's do (``manifest.path_resolver``): against the table's folder,
inside it unless ``--allow-outside``, a URL only in an allowed bucket; a row at fault there
refuses the run naming its line. A row that cannot be read (a line over ``MAX_LINE_BYTES``, a
field over csv's limit, text that is not UTF-8, a JSON line that is not an object), a row
without an image path or without a caption is a reject naming its line. Lines are read one at
a time with a bound, and deciding what a file is reads at most ``MAX_HEADER_BYTES`` of it.
Unlike a manifest's, a path may repeat: a picture with several captions is several samples.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from tilefeed.preprocess.sources.manifest import path_resolver
from tilefeed.preprocess.sources.scanning import PairOptions, PairSink, Scan, SourceOptions
from tilefeed.store.errors import SourceError

JSON_SUFFIXES: Final = (".jsonl", ".ndjson")
MAX_HEADER_BYTES: Final = 1 << 20  # what deciding on a table reads of it, at most
# One line of a table: 16 captions and 64 fields at their limits take under 1 MiB; a field over
# csv's own limit (128 KiB, four captions' worth) rejects its row too
MAX_LINE_BYTES: Final = 4 << 20
_INT: Final = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT: Final = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def caption_columns(pairs: PairOptions) -> dict[str, str]:
    """Caption name -> the table's column holding it."""
    if pairs.caption_key == ("caption",):
        return {"caption": pairs.csv_caption_key}
    return {name: name for name in pairs.caption_key}


def header(table: Path, pairs: PairOptions, separator: str | None = None) -> list[str]:
    """The column names of ``table``: its CSV header (split on ``separator``, default
    ``--csv-separator``) or the keys of its first JSON line; [] when it cannot be read so, or
    when it does not end within the first ``MAX_HEADER_BYTES`` (never more is read)."""
    try:
        fd = os.open(table, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a named pipe never waits
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            prefix = os.pread(fd, MAX_HEADER_BYTES, 0)
        finally:
            os.close(fd)
    except OSError:
        return []
    lines = prefix.split(b"\n")
    if len(prefix) == MAX_HEADER_BYTES:
        lines.pop()  # cut short: the last line may go on past the prefix
    for data in lines:
        try:
            line = data.decode("utf-8-sig")
            if not line.strip():
                continue
            if table.suffix.lower() in JSON_SUFFIXES:
                first = json.loads(line)
                return [str(k) for k in first] if isinstance(first, dict) else []
            return [c.strip() for c in next(csv.reader([line], delimiter=separator or pairs.csv_separator))]
        except (UnicodeDecodeError, ValueError, RecursionError, csv.Error, StopIteration):
            return []
    return []


def _lines(f: BinaryIO, problems: list[tuple[int, str]]) -> Iterator[str]:
    """The lines of ``f`` as text, each read with a bound: a line over ``MAX_LINE_BYTES`` or not
    UTF-8 is skipped to its end, its number and reason added to ``problems``, and a blank line
    given in its place, so that line numbers hold."""
    number = 0
    while data := f.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(data) > MAX_LINE_BYTES:
            while data and not data.endswith(b"\n"):  # the rest of it, a bounded read at a time
                data = f.readline(MAX_LINE_BYTES)
            problems.append((number, f"a line over the {MAX_LINE_BYTES} bytes a row may hold"))
            yield "\n"
            continue
        try:
            yield data.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            problems.append((number, "not UTF-8 text"))
            yield "\n"


def _rows(table: Path, pairs: PairOptions) -> Iterator[tuple[int, dict[str, object] | str]]:
    """(line, row as column -> value, or why the line cannot be read), read as a stream, each
    line with a bound."""
    problems: list[tuple[int, str]] = []
    try:
        with open(table, "rb") as f:
            lines = _lines(f, problems)
            if table.suffix.lower() in JSON_SUFFIXES:
                for line, text in enumerate(lines, start=1):
                    yield from problems
                    problems.clear()
                    if not text.strip():
                        continue
                    try:
                        row = json.loads(text)
                    except (ValueError, RecursionError):
                        row = None
                    yield line, row if isinstance(row, dict) else "not a JSON object"
                return
            reader = csv.reader(lines, delimiter=pairs.csv_separator)
            names: list[str] | None = None
            while True:
                try:
                    cells = next(reader, None)
                except csv.Error as e:  # a field over csv's limit: this row only, the next read on
                    yield from problems
                    problems.clear()
                    yield reader.line_num, f"unreadable row: {e}"
                    continue
                yield from problems
                problems.clear()
                if cells is None:
                    return
                if not cells or not "".join(cells).strip():
                    continue
                if names is None:
                    names = [c.strip() for c in cells]
                    continue
                yield reader.line_num, dict(zip(names, cells, strict=False))
    except OSError as e:
        raise SourceError(f"cannot read {str(table)!r}: {e.strerror or e}") from None


def _number(value: object) -> object:
    """A CSV cell as the number it writes in its plain form (int, then float), else as it is:
    a key such as ``000123`` stays text."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return value


def scan_table(table: Path, options: SourceOptions, pairs: PairOptions, out: PairSink) -> Scan:
    """Every row of ``table`` into ``out``, in order."""
    columns = caption_columns(pairs)
    names = header(table, pairs)
    if pairs.csv_img_key not in names or not set(columns.values()) & set(names):
        raise SourceError(f"{str(table)!r}: its header ({', '.join(names) or 'none'}) lacks the image column "
                          f"{pairs.csv_img_key!r} or the caption column{'s' if len(columns) > 1 else ''} "
                          f"{', '.join(columns.values())}; name them with --csv-img-key and --csv-caption-key "
                          "(or --caption-key), and the separator with --csv-separator")
    if pairs.label_key is not None and pairs.label_key not in names:
        raise SourceError(f"{str(table)!r} has no label column {pairs.label_key!r} (--label-key)")
    out.notes.append(f"SRC read as a caption table ({pairs.csv_img_key}, {', '.join(columns.values())})")
    resolve = path_resolver(table, options)
    text_values = table.suffix.lower() not in JSON_SUFFIXES  # a CSV's cells are text: numbers read as such
    for line, row in _rows(table, pairs):
        if isinstance(row, str):
            out.reject(f"{table}:{line}", row)
            continue
        path = row.get(pairs.csv_img_key)
        if not isinstance(path, str) or not path.strip():
            out.reject(f"{table}:{line}", f"no image path in {pairs.csv_img_key!r}")
            continue
        if "\0" in path:
            out.reject(f"{table}:{line}", "the path holds a NUL")
            continue
        where, _ = resolve(line, path.strip())
        captions = {name: row.get(column) for name, column in columns.items()}
        out.sample(where, captions, row if text_values is False else {k: _number(v) for k, v in row.items()})
    return out.scan()
