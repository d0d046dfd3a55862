"""Sources -> a sharded Zarr v3 store, in parallel, resumable after a crash at any moment.

Work is cut into *parts* of consecutive sources (``part_sources``: a number fixed by the
source count, independent of the worker count). A worker decodes its part's images and writes
their encoded chunks to the work folder (``OUT/.tilefeed-partial``), bytes first, then the
table of its tiles, and a small JSON record last, each under a temporary name then renamed.
As soon as the parts a shard needs are recorded, a worker (or a thread of the driver, on a
core the workers leave free) copies their chunk bytes into the shard file (temporary name,
then rename) and reads the finished file back for its sha256 (from the bucket, for a store in
one; from the shared folder, for a cluster's), so the digest the store records is of the bytes
that are there; the consumed part files go. The driver fsyncs each shard of its own machine on
a background thread, so the disk write overlaps decoding, and digests the shards a resumed run
finds in place. When every shard is in place, synced and digested the driver writes the small
arrays and the array metadata, and the group's tilefeed attributes last: that write marks the
store complete. A rerun of the same command skips the parts and shards already there, so a
killed run resumes and ends in the very bytes of an uninterrupted one.

The driver's memory does not grow with the number of sources, and its work per source is a
few bytes moved: the scan writes the sources to a list on disk (``sources``, ``sourcelist``);
the fingerprint's stat()s are the workers'; a part task is sent its slice of the list as one
bytes object and sends back counts and its chunk sizes, writing its tile table to a file;
the driver keeps per part only what the parts not yet consumed by shards need; and the small
arrays are written at the end by streaming the records and the list, a chunk at a time.

This module is the driver's entry point: it scans, plans and summarises. The tasks that run on
workers are in ``tasks``, the pool they run on and the recovery from dying workers in ``pool``,
the scheduler that keeps parts and shards flowing (and resumes) in ``schedule``, the shards'
fsyncs and digests in ``shard_sync``, the finishing of the store in ``publish``, the output
folder's rules in ``output``, the metadata in ``metadata``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.preprocess import tasks
from tilefeed.store.documents import parse_attrs
from tilefeed.store.errors import StoreWriteError, TilefeedError
from tilefeed.preprocess.output import RunPlan, out_inside, prepare_output, scan_folder, writer_lock
from tilefeed.preprocess.worker_pool import Pool
from tilefeed.preprocess.publish import publish, reason_counts
from tilefeed.preprocess.task_scheduler import ProgressFn, Scheduler
from tilefeed.preprocess.settings import StoreSettings, TargetOptions, TileSettings, default_workers, describe
from tilefeed.preprocess.sources.source_list import split_paths
from tilefeed.preprocess.sources.scanning import PairOptions, SourceOptions
from tilefeed.preprocess.sources.finding import Listing, check_source, scan_sources
from tilefeed.store.location import open_storage
from tilefeed.store.storage import Storage, redacted

PART_SOURCES: Final = 64  # sources per part of a small run; the source list is indexed as often
MAX_PART_SOURCES: Final = 2048
TARGET_PARTS: Final = 128  # parts of PART_SOURCES up to this many; past it, larger parts
PLAN_BLOCK: Final = 1 << 12  # sources whose sizes one task takes, for the fingerprint


@dataclass
class Summary:
    sources: int
    accepted: int
    rejected: int
    tiles: int
    shards: int
    bytes: int
    seconds: float
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    resumed_parts: int = 0
    up_to_date: bool = False
    hidden: int = 0  # hidden files and folders a class-folder scan left out
    objects: int = 0  # a store with targets: the objects stored
    outside: int = 0  # and those not stored, no part of their box in any tile (crop fit, grid gaps)
    notes: list[str] = field(default_factory=list)  # about SRC and OUT, for the summary
    phases: dict[str, float] = field(default_factory=dict)  # seconds: decode, encode, write, copy, sync


def preprocess(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    tiles: TileSettings | None = None,
    store: StoreSettings | None = None,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int], ProgressFn] | None = None,
    scheduler: str | None = None,
    source_options: SourceOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    targets: TargetOptions | None = None,
    pairs: PairOptions | None = None,
    announce: Callable[[str], None] | None = None,
) -> Summary:
    """Convert the images under ``src`` into a tilefeed store at ``out``; see the module docstring.

    ``progress``, when given, is called once with the number of sources and returns a callback
    invoked as parts complete. ``scheduler`` is a Dask distributed scheduler address: the same
    part and shard tasks then run on that cluster's workers (which must see the same paths),
    and this process still plans the work and writes the metadata last. ``source_options`` set
    the rules for reading SRC (label types, duplicates, paths outside a manifest's folder, empty
    classes). OUT inside a SRC folder is left out of the scan; one writer at a time per OUT.

    ``out`` may be an object-store URL (``s3://bucket/prefix``, ``gs://``, ``az://``): parts,
    shards and metadata then go to the bucket, each object put whole and the group metadata
    last; ``storage_options`` add to the cloud's standard configuration (see ``storage``).

    Parameters
    ----------
    src : str or path-like
        A folder with one subfolder per class, a manifest (``.csv`` or ``.jsonl``), or a bucket
        prefix.
    out : str or path-like
        The store to write: a folder or a bucket URL.
    tiles : TileSettings, optional
        How each image becomes tiles (size, mode, fit, resampling, background, colour profiles);
        default ``TileSettings()``.
    store : StoreSettings, optional
        How tiles are stored (codec, quality, shard size); default ``StoreSettings()``.
    workers : int, optional
        Worker processes; default: the cores, lowered until each worker's memory fits.
    overwrite : bool, default False
        Replace a tilefeed store at ``out`` (only what tilefeed wrote there).
    progress : callable, optional
        Called with the number of sources; returns a callback invoked as parts complete.
    scheduler : str, optional
        A Dask distributed scheduler address.
    source_options : SourceOptions, optional
        The rules for reading ``src``.
    storage_options : dict, optional
        Settings added to the cloud's standard configuration, for bucket URLs.
    targets : TargetOptions, optional
        Boxes and masks read beside the images (a COCO file, a YOLO folder, semantic masks):
        mapped into each tile with its pixels and stored with them (resize or grid mode; OUT a
        folder or a bucket URL).
    pairs : PairOptions, optional
        How an image-text SRC is read (WebDataset shards, parquet files, a caption table): its
        kind, or ``auto``, and where each sample's image, captions and fields are.
    announce : callable, optional
        Called with each note about SRC (how it was read, what was left out) as soon as the
        scan has found it, before any image is decoded; the summary holds them too.

    Returns
    -------
    Summary
        Counts of sources, accepted and rejected inputs, tiles, shards and bytes.

    Raises
    ------
    TilefeedError
        A bad source, option or output (``SourceError``, ``ConfigError``, ``StoreExistsError``,
        ``StoreWriteError``), with a one-line message that carries no credential.
    """
    try:
        return _preprocess(src, out, tiles, store, workers, overwrite, progress, scheduler,
                           source_options, storage_options, targets, pairs, announce)
    except TilefeedError as e:  # no message carries a credential, whoever wrote it
        raise redacted(e, storage_options) from None


def _preprocess(src: str | os.PathLike[str], out: str | os.PathLike[str], tiles: TileSettings | None,
                store: StoreSettings | None, workers: int | None, overwrite: bool,
                progress: Callable[[int], ProgressFn] | None, scheduler: str | None,
                source_options: SourceOptions | None, storage_options: dict[str, Any] | None,
                targets: TargetOptions | None = None, pairs: PairOptions | None = None,
                announce: Callable[[str], None] | None = None) -> Summary:
    tiles = tiles or TileSettings()
    store = store or StoreSettings()
    workers = default_workers(tiles.worker_memory) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    started = time.perf_counter()
    target = open_storage(out, storage_options)
    exclude = out_inside(Path(src), target.local) if target.local is not None else None
    check_source(src, pairs)
    with writer_lock(target), scan_folder(target) as scratch:
        listing = scan_sources(src, scratch, source_options, exclude, stride=PART_SOURCES, targets=targets,
                                pairs=pairs)
        notes = list(listing.notes)
        if announce is not None:
            for note in notes:
                announce(note)
        with Pool(workers, scheduler) as pool:
            try:
                plan = _plan(listing, tiles, store, pool)
                if prepare_output(target, plan, overwrite, notes):
                    summary = _summary_from_attrs(parse_attrs(target.read("zarr.json")), target)
                else:
                    summary = _build(target, listing, tiles, store, pool, plan, progress)
            except BrokenProcessPool:
                raise StoreWriteError(
                    "a worker process died (out of memory or killed); rerun the same command to resume"
                ) from None
    summary.seconds = time.perf_counter() - started
    summary.hidden, summary.notes = listing.hidden, notes
    return summary


def _build(out: Storage, listing: Listing, tiles: TileSettings, store: StoreSettings, pool: Pool,
           plan: RunPlan, progress: Callable[[int], ProgressFn] | None) -> Summary:
    tick = progress(len(listing)) if progress else None
    build = Scheduler(out, listing, tiles, store, tick, pool, part_sources(len(listing)))
    try:
        build.run()
        done = publish(build, plan.fingerprint)
    except OSError as e:
        raise StoreWriteError(
            f"writing the store {out.name!r} failed: {e.strerror or e}; free space or fix "
            "permissions, then rerun the same command to resume"
        ) from None
    finally:
        build.close()
    return Summary(
        sources=done.inputs, accepted=done.inputs - len(done.rejects), rejected=len(done.rejects),
        tiles=done.samples, shards=done.shards, bytes=done.bytes, seconds=0.0,
        rejects_by_reason=reason_counts(reason for _, reason in done.rejects), resumed_parts=build.resumed,
        phases=build.phases, objects=done.objects, outside=done.outside,
    )


def part_sources(count: int) -> int:
    """Sources per part for a run of ``count`` sources: PART_SOURCES for up to TARGET_PARTS
    parts, then larger parts (up to MAX_PART_SOURCES) rather than more of them, as each part
    costs the driver a task, a few files and their records, whatever its size. A function of
    the count only, which the fingerprint fixes: a resumed run cuts the same parts."""
    size = PART_SOURCES
    while size < MAX_PART_SOURCES and size * TARGET_PARTS < count:
        size *= 2
    return size


def _plan(listing: Listing, tiles: TileSettings, store: StoreSettings, pool: Pool) -> RunPlan:
    """The run's identity: the settings, the classes and every source's path, label and size,
    hashed in order block by block from the list (and the targets: the annotation file's bytes,
    or the size of each source's label file or mask). The sizes are stat()s, taken by the
    workers (a stat costs more than the rest of a source's hashing); the driver hashes."""
    h = hashlib.sha256()
    version = fmt.TILES_VERSION if listing.pairs is None else fmt.PAIRS_VERSION
    h.update(json.dumps([version, tiles.identity(), store.identity(), listing.classes]).encode())
    if listing.targets is not None:  # the annotations (COCO: the file's bytes) and the category table
        h.update(json.dumps(["targets", listing.targets.identity, listing.targets.categories]).encode())
    if listing.pairs is not None:  # every source's captions, fields and where its bytes lie
        table = listing.pairs
        h.update(json.dumps(["pairs", table.digest, table.texts, table.fields]).encode())
    job = listing.targets.job if listing.targets is not None else None
    blocks: deque[tuple[int, bytes, Future[bytes]]] = deque()
    firsts = iter(range(0, len(listing), PLAN_BLOCK))
    while True:
        while len(blocks) < 2 * pool.workers and (first := next(firsts, None)) is not None:
            data = listing.files.read(first, PLAN_BLOCK)
            blocks.append((first, data, pool.submit(tasks.source_sizes, data, job)))
        if not blocks:
            break
        first, data, sizes = blocks.popleft()
        paths = split_paths(data)
        labels = listing.files.labels(first, len(paths)).tolist()
        found = np.frombuffer(sizes.result(), dtype="<i8")
        h.update(b"".join([b"%s\0%d\0%d\n" % line for line in zip(
            paths, labels, found[: len(paths)].tolist(), strict=True)]))
        if len(found) > len(paths):  # each source's label file or mask
            h.update(found[len(paths):].tobytes())
    return RunPlan(fingerprint=h.hexdigest(), sources=len(listing), settings=describe(tiles, store))


def _summary_from_attrs(attrs: dict[str, Any] | None, out: Storage) -> Summary:
    assert attrs is not None
    nbytes = sum(out.sizes(f"{fmt.IMAGES}/c").values())
    return Summary(
        sources=attrs["sources"], accepted=attrs["accepted"], rejected=attrs["rejected"],
        tiles=attrs["samples"], shards=attrs["shards"], bytes=nbytes, seconds=0.0,
        rejects_by_reason=reason_counts(r["reason"] for r in attrs["rejects"]), up_to_date=True,
        objects=(attrs.get("targets") or {}).get("objects", 0),
    )
