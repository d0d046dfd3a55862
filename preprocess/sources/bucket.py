"""The class "folders" of a bucket prefix (``s3://bucket/prefix``), read as a class-folder
tree is read: the first key segment is the class, files in ImageFolder order (by folder, then
name), hidden entries out. Keys are sorted as (class NUL folder NUL name) records in runs on
disk (``spill``), so that a listing of any size is sorted without being held.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tilefeed.preprocess.sources.scanning import BATCH, Scan
from tilefeed.preprocess.sources.source_list import SourceListWriter
from tilefeed.preprocess.sources.spill import SortedRuns
from tilefeed.store.errors import SourceError
from tilefeed.store.object_storage import ObjectStorage


def scan_bucket(url: str, sink: SourceListWriter, scratch: Path) -> Scan:
    """The keys under ``url`` into ``sink``, class after class in ImageFolder order."""
    storage = ObjectStorage(url)
    attempts = 0

    def listing() -> tuple[Scan, SortedRuns]:
        nonlocal attempts
        attempts += 1  # a listing retried from its start begins afresh
        records = SortedRuns(scratch / f"bucket-{attempts}")
        classes: set[str] = set()
        skipped: list[tuple[str, str]] = []
        hidden = 0
        for key in _keys(storage):
            parts = key.split("/")
            if any(p.startswith(".") for p in parts):
                hidden += 1
            elif len(parts) == 1:
                skipped.append((storage.where(key), "outside any class folder"))
            else:
                folder, name = key.rsplit("/", 1)
                classes.add(parts[0])
                records.add(b"\0".join((parts[0].encode(), folder.encode(), name.encode())))
        return Scan(classes=sorted(classes), skipped=skipped, hidden=hidden), records

    # retried whole, as any listing; ObjectStorage's public listing (``sizes``) holds every key
    found, records = storage._call("listing", "", listing)
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
