"""A caption table, as open_clip's ``CsvDataset`` reads one: a TSV or CSV (``--csv-separator``,
a tab by default, whatever the suffix) or JSON Lines, a row per sample, its image path in
``--csv-img-key`` (``filepath``) and its caption in ``--csv-caption-key`` (``title``), stored as
the caption named ``caption``; with several ``--caption-key`` names, those columns are the
captions, by their names. Other columns named by ``--fields`` are the sample's fields, and
``--label-key`` its label.

Paths resolve as a manifest's do (``manifest.path_resolver``): against the table's folder,
inside it unless ``--allow-outside``, a URL only in an allowed bucket; a row at fault there
refuses the run naming its line. A row without a caption is a reject. Unlike a manifest's, a
path may repeat: a picture with several captions is several samples.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tilefeed.preprocess.sources.manifest import path_resolver
from tilefeed.preprocess.sources.scanning import PairOptions, PairSink, Scan, SourceOptions
from tilefeed.store.errors import SourceError

JSON_SUFFIXES: Final = (".jsonl", ".ndjson")
_INT: Final = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT: Final = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def caption_columns(pairs: PairOptions) -> dict[str, str]:
    """Caption name -> the table's column holding it."""
    if pairs.caption_key == ("caption",):
        return {"caption": pairs.csv_caption_key}
    return {name: name for name in pairs.caption_key}


def header(table: Path, pairs: PairOptions, separator: str | None = None) -> list[str]:
    """The column names of ``table``: its CSV header (split on ``separator``, default
    ``--csv-separator``) or the keys of its first JSON line; [] when it cannot be read so."""
    try:
        with open(table, newline="", encoding="utf-8-sig") as f:
            for line in f:
                if not line.strip():
                    continue
                if table.suffix.lower() in JSON_SUFFIXES:
                    first = json.loads(line)
                    return [str(k) for k in first] if isinstance(first, dict) else []
                return [c.strip() for c in next(csv.reader([line], delimiter=separator or pairs.csv_separator))]
    except (OSError, UnicodeDecodeError, ValueError, csv.Error, StopIteration):
        return []
    return []


def _rows(table: Path, pairs: PairOptions) -> Iterator[tuple[int, dict[str, object]]]:
    """(line, row as column -> value), read as a stream; a row that cannot be read refuses the
    run naming its line."""
    try:
        with open(table, newline="", encoding="utf-8-sig") as f:
            if table.suffix.lower() in JSON_SUFFIXES:
                for line, text in enumerate(f, start=1):
                    if not text.strip():
                        continue
                    try:
                        row = json.loads(text)
                    except (ValueError, RecursionError):
                        raise SourceError(f"{table}:{line}: not a JSON object") from None
                    if not isinstance(row, dict):
                        raise SourceError(f"{table}:{line}: not a JSON object")
                    yield line, row
                return
            reader = csv.reader(f, delimiter=pairs.csv_separator)
            names: list[str] | None = None
            try:
                for cells in reader:
                    if not cells or not "".join(cells).strip():
                        continue
                    if names is None:
                        names = [c.strip() for c in cells]
                        continue
                    yield reader.line_num, dict(zip(names, cells, strict=False))
            except csv.Error as e:
                raise SourceError(f"{table}:{reader.line_num}: {e}") from None
    except OSError as e:
        raise SourceError(f"cannot read {str(table)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SourceError(f"{str(table)!r} is not UTF-8 text") from None


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
        path = row.get(pairs.csv_img_key)
        if not isinstance(path, str) or not path.strip():
            raise SourceError(f"{table}:{line}: no image path in {pairs.csv_img_key!r}")
        if "\0" in path:
            raise SourceError(f"{table}:{line}: the path holds a NUL")
        where, _ = resolve(line, path.strip())
        captions = {name: row.get(column) for name, column in columns.items()}
        out.sample(where, captions, row if text_values is False else {k: _number(v) for k, v in row.items()})
    return out.scan()
