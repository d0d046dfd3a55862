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

This module is the driver only: the tasks that run on workers are in ``tasks``, the output
folder's rules in ``output``, the metadata in ``metadata``. Most of it is ``_Build``, the
scheduler that keeps parts and shards flowing and survives dying workers.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.preprocess import tasks
from tilefeed.store.errors import SourceError, StoreWriteError, TilefeedError
from tilefeed.preprocess.metadata import PartTiles, write_arrays, write_attrs
from tilefeed.preprocess.output import out_inside, prepare_output, scan_folder, writer_lock
from tilefeed.preprocess.settings import StoreSettings, TileSettings, default_workers, describe
from tilefeed.store.host import usable_cores
from tilefeed.preprocess.sourcelist import split_paths
from tilefeed.preprocess.sources import Listing, SourceOptions, check_source, scan_sources
from tilefeed.store.storage import Storage, client_started, open_storage, redacted

PART_SOURCES: Final = 64  # sources per part of a small run; the source list is indexed as often
MAX_PART_SOURCES: Final = 2048
TARGET_PARTS: Final = 128  # parts of PART_SOURCES up to this many; past it, larger parts
PHASES = ("decode", "encode", "write", "copy", "sync")  # where the workers' time goes
# (sync: each finished shard's sha256, taken by its writer, and its fsync on the driver's thread)
DIGEST_THREADS = 4  # shards digested at once where they are read back (a bucket, a cluster's folder)
PLAN_BLOCK: Final = 1 << 12  # sources whose sizes one task takes, for the fingerprint
SHARDS_PER_TASK: Final = 16  # shards one task writes at most
_RECORD: Final = re.compile(r"part-(\d{7})\.json")


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
    notes: list[str] = field(default_factory=list)  # about SRC and OUT, for the summary
    phases: dict[str, float] = field(default_factory=dict)  # seconds: decode, encode, write, copy, sync


ProgressFn = Callable[[int, int], None]  # (sources done in this step, rejects in this step)


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
    """
    try:
        return _preprocess(src, out, tiles, store, workers, overwrite, progress, scheduler,
                           source_options, storage_options)
    except TilefeedError as e:  # no message carries a credential, whoever wrote it
        raise redacted(e, storage_options) from None


def _preprocess(src: str | os.PathLike[str], out: str | os.PathLike[str], tiles: TileSettings | None,
                store: StoreSettings | None, workers: int | None, overwrite: bool,
                progress: Callable[[int], ProgressFn] | None, scheduler: str | None,
                source_options: SourceOptions | None, storage_options: dict[str, Any] | None) -> Summary:
    tiles = tiles or TileSettings()
    store = store or StoreSettings()
    workers = default_workers(tiles.worker_memory) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    started = time.perf_counter()
    target = open_storage(out, storage_options)
    exclude = out_inside(Path(src), target.local) if target.local is not None else None
    check_source(src)
    with writer_lock(target), scan_folder(target) as scratch:
        listing = scan_sources(src, scratch, source_options, exclude, stride=PART_SOURCES)
        notes = list(listing.notes)
        with _Pool(workers, scheduler) as pool:
            try:
                plan = _plan(listing, tiles, store, pool)
                if prepare_output(target, plan, overwrite, notes):
                    summary = _summary_from_attrs(fmt.parse_attrs(target.read("zarr.json")), target)
                else:
                    summary = _build(target, listing, tiles, store, pool, plan, progress)
            except BrokenProcessPool:
                raise StoreWriteError(
                    "a worker process died (out of memory or killed); rerun the same command to resume"
                ) from None
    summary.seconds = time.perf_counter() - started
    summary.hidden, summary.notes = listing.hidden, notes
    return summary


def _build(out: Storage, listing: Listing, tiles: TileSettings, store: StoreSettings, pool: _Pool,
           plan: dict[str, Any], progress: Callable[[int], ProgressFn] | None) -> Summary:
    build = _Build(out, listing, tiles, store, progress(len(listing)) if progress else None, pool)
    try:
        build.run()
        summary = build.finish(plan["fingerprint"])
    except OSError as e:
        raise StoreWriteError(
            f"writing the store {out.name!r} failed: {e.strerror or e}; free space or fix "
            "permissions, then rerun the same command to resume"
        ) from None
    finally:
        build.close()
    summary.resumed_parts = build.resumed
    return summary


def part_sources(count: int) -> int:
    """Sources per part for a run of ``count`` sources: PART_SOURCES for up to TARGET_PARTS
    parts, then larger parts (up to MAX_PART_SOURCES) rather than more of them, as each part
    costs the driver a task, a few files and their records, whatever its size. A function of
    the count only, which the fingerprint fixes: a resumed run cuts the same parts."""
    size = PART_SOURCES
    while size < MAX_PART_SOURCES and size * TARGET_PARTS < count:
        size *= 2
    return size


def _plan(listing: Listing, tiles: TileSettings, store: StoreSettings, pool: _Pool) -> dict[str, Any]:
    """The run's identity: the settings, the classes and every source's path, label and size,
    hashed in order block by block from the list. The sizes are stat()s, taken by the workers
    (a stat costs more than the rest of a source's hashing); the driver hashes."""
    h = hashlib.sha256()
    h.update(json.dumps([fmt.FORMAT_VERSION, tiles.identity(), asdict(store), listing.classes]).encode())
    blocks: deque[tuple[int, bytes, Future[bytes]]] = deque()
    firsts = iter(range(0, len(listing), PLAN_BLOCK))
    while True:
        while len(blocks) < 2 * pool.workers and (first := next(firsts, None)) is not None:
            data = listing.files.read(first, PLAN_BLOCK)
            blocks.append((first, data, pool.submit(tasks.source_sizes, data)))
        if not blocks:
            break
        first, data, sizes = blocks.popleft()
        paths = split_paths(data)
        labels = listing.files.labels(first, len(paths)).tolist()
        h.update(b"".join([b"%s\0%d\0%d\n" % line for line in zip(
            paths, labels, np.frombuffer(sizes.result(), dtype="<i8").tolist(), strict=True)]))
    return {"fingerprint": h.hexdigest(), "sources": len(listing), "settings": describe(tiles, store)}


@dataclass(frozen=True)
class _Task:
    """A submitted part or shard task, kept so that it can run again if its worker dies."""

    kind: str  # "part" (with the shards ready when it was sent) or "shards"
    number: int  # the part, or the first shard
    fn: Callable[..., Any]
    args: tuple[Any, ...]


def _worker_died(fut: Future[Any]) -> bool:
    """The task failed because its process died (a local pool's, or a Dask worker killed repeatedly)."""
    e = fut.exception()
    return isinstance(e, BrokenProcessPool) or type(e).__name__ == "KilledWorker"


class _ClientExecutor:
    """A Dask cluster as the pool: its concurrent.futures view, closed with the run."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.executor = client.get_executor(pure=False)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)

    def __enter__(self) -> _ClientExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.shutdown(wait=exc[0] is None)
        self.client.close()


class _Pool:
    """Where tasks run: a local pool of worker processes (made anew when one died), or the
    workers of a Dask cluster."""

    def __init__(self, workers: int, scheduler: str | None) -> None:
        self.workers, self.scheduler = workers, scheduler
        self.executor = self._start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)  # type: ignore[no-any-return]

    def restart(self) -> None:
        """After a worker died: a local pool is broken for good, so a new one; a cluster
        replaces its workers itself."""
        if self.scheduler is None:
            self.executor.__exit__(None, None, None)
            self.executor = self._start()

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.__exit__(*exc)

    def _start(self) -> Any:
        if self.scheduler is not None:
            from distributed import Client

            # Tasks are idempotent (temporary name, then rename), so a task whose worker died
            # is simply run again elsewhere.
            return _ClientExecutor(Client(self.scheduler))
        # Worker processes even for one worker: a decoder that crashes takes down a worker,
        # never the run. fork where there is one: workers start with the modules already
        # imported (spawn costs about 0.4 s per run here). They only decode images and write
        # files, so nothing of the driver's other threads (zarr's event loop, tqdm's monitor)
        # is touched in a child.
        # A bucket's client (obstore) does not survive fork(): forkserver children never ran it.
        methods = multiprocessing.get_all_start_methods()
        method = "fork" if not client_started() and "fork" in methods else (
            "forkserver" if "forkserver" in methods else "spawn")
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(["tilefeed.preprocess.tasks"])
        # A forked worker starts with the driver's objects, garbage included; frozen, they are
        # never collected there, so no finalizer of the driver's (a DALI pipeline's, which
        # waits for threads a child does not have) ever runs in a worker.
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=gc.freeze)


class _Build:
    """Drives parts and shards: shards are written as soon as the parts they need are done,
    then fsynced (on this machine) and recorded here, and part files are deleted once every
    shard they feed is written.

    What it holds per part is only for the parts between the first not yet consumed by shards
    and the first not yet done (their first tiles and chunk sizes), and the results of parts
    done out of order: a window as wide as the work in flight, whatever the number of sources.
    """

    def __init__(self, out: Storage, listing: Listing, tiles: TileSettings, store: StoreSettings,
                 tick: ProgressFn | None, pool: _Pool) -> None:
        self.pool = pool
        self.out, self.work = out, fmt.WORK_DIR
        self.local = pool.scheduler is None and out.local is not None  # this machine writes OUT's files
        self.listing, self.tiles, self.store, self.tick = listing, tiles, store, tick
        self.per_shard = store.shard_size
        self.part_size = part_sources(len(listing))
        self.parts = fmt.ceil_div(len(listing), self.part_size)
        self.recorded = np.zeros(self.parts, dtype=bool)  # parts with a record before this run
        self.results: dict[int, np.ndarray] = {}  # chunk sizes of parts done past the prefix
        self.redo: list[int] = []  # parts whose earlier record this code cannot use
        self.prefix = 0  # parts 0..prefix-1 are done and their tiles counted
        self.freed = 0  # parts 0..freed-1 have had their chunk file deleted
        self.first_tile = [0]  # first tile of parts freed..prefix-1, then the tiles counted
        self.sizes: list[np.ndarray] = []  # chunk sizes of parts freed..prefix-1
        self.next_shard = 0  # first shard not yet submitted
        self.shards_done = 0  # shards 0..shards_done-1 are written
        self.shard_done: set[int] = set()  # shards written past those
        self.shard_bytes: dict[int, int] = {}
        self.ready: list[tuple[Any, ...]] = []  # shards to write, not yet sent
        self.phases = dict.fromkeys(PHASES, 0.0)  # seconds per phase, for `bench preprocess`
        self.existing: dict[str, int] = {}  # shards in place before this run (key -> size)
        self.resumed = 0  # parts found done on disk
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-fsync")
        # Shards are the workers' to write, so that the driver's work per source stays small;
        # but when the workers leave a core free, a thread here copies a local store's shards
        # (in-kernel copies) on that core, and the workers keep decoding.
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-shards") if (
            self.local and pool.workers < usable_cores()) else None
        self._digester: ThreadPoolExecutor | None = None
        self._syncing: deque[tuple[int, Future[tuple[float, str]]]] = deque()  # (shard, its sync)
        self.shard_sha256: dict[int, str] = {}

    def run(self) -> None:
        self._find_recorded()
        self.existing = self.out.sizes(f"{fmt.IMAGES}/c")
        planned = ~self.recorded  # as found: a record met again later goes to redo, not here
        todo = (p for p in range(self.parts) if planned[p])
        most = 2 * self.pool.workers  # parts in flight
        pending: dict[Future[Any], _Task] = {}
        self._submit_shards(pending)
        self._submit_parts(pending, todo, most)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            if any(_worker_died(f) for f in finished):
                # Every task in flight on a dead worker pool is lost: wait for the pool to
                # fail them all, then run them again on a new pool, parts image by image.
                finished, _ = wait(pending)
            lost = [t for f in finished if _worker_died(f) for t in [pending.pop(f)]]
            for fut in finished:
                task = pending.pop(fut, None)
                if task is not None:
                    self._done(task, fut.result())
            if lost:
                self.pool.restart()
                for task in lost:
                    self._resubmit(task, pending)
            self._submit_shards(pending)
            self._submit_parts(pending, todo, most)

    def _find_recorded(self) -> None:
        """Which parts an interrupted run recorded, from one listing of the work folder (read
        as a stream where it is a folder here)."""
        if self.out.local is not None:
            try:
                with os.scandir(self.out.local / self.work) as entries:
                    self._mark_recorded(e.name for e in entries)
            except FileNotFoundError:
                pass
        else:
            self._mark_recorded(key.rsplit("/", 1)[-1] for key in self.out.sizes(self.work))
        self.resumed = int(self.recorded.sum())

    def _mark_recorded(self, names: Iterator[str]) -> None:
        for name in names:
            found = _RECORD.fullmatch(name)
            if found and int(found[1]) < self.parts:
                self.recorded[int(found[1])] = True

    def _done(self, task: _Task, result: Any) -> None:
        if task.kind == "part":
            self.results[task.number] = np.frombuffer(result["sizes"], dtype="<i8")
            if self.tick:
                self.tick(result["count"], result["rejected"])
        for shard in result["shards"]:
            self.shard_bytes[shard["shard"]] = shard["bytes"]
            self.phases["copy"] += shard["seconds"]
            self.phases["sync"] += shard["digest_seconds"]
            self.shard_done.add(shard["shard"])
            self._sync(shard["shard"], shard["sha256"])
        self._free_parts()

    def _resubmit(self, task: _Task, pending: dict[Future[Any], _Task]) -> None:
        args = task.args
        if task.kind == "part":
            if args[-1]:  # already isolated: the worker died of something other than one image
                raise BrokenProcessPool("a worker process died while decoding images one by one")
            args = (*args[:-1], True)
        pending[self.pool.submit(task.fn, *args)] = _Task(task.kind, task.number, task.fn, args)

    def _submit_parts(self, pending: dict[Future[Any], _Task], todo: Iterator[int], most: int) -> None:
        """Parts in flight up to ``most``, those to do again first, then the next in order, each
        taking along the shards ready to be written; with no part left to send, the shards go
        alone."""
        running = sum(task.kind == "part" for task in pending.values())
        for _ in range(most - running):
            part = self.redo.pop() if self.redo else next(todo, None)
            if part is None:
                break
            first = part * self.part_size
            args = (self.out, self.work, part, first, self.listing.files.read(first, self.part_size),
                    self.tiles, self.store, self._take_ready(), False)
            pending[self.pool.submit(tasks.run_part, *args)] = _Task("part", part, tasks.run_part, args)
        if self.ready:
            shards = self._take_ready()
            alone = (self.out, self.work, shards)
            pending[self.pool.submit(tasks.write_shards, *alone)] = _Task("shards", shards[0][0],
                                                                            tasks.write_shards, alone)

    def _take_ready(self) -> list[tuple[Any, ...]]:
        """The shards ready to be written (the arguments of ``tasks.write_shard`` of each), to
        be sent in one task."""
        ready, self.ready = self.ready[:SHARDS_PER_TASK], self.ready[SHARDS_PER_TASK:]
        return ready

    def _advance(self) -> bool:
        """Take in the part at the prefix if it is done (True); a part recorded by an earlier
        run is read here, and one whose record this code cannot use is done again."""
        part = self.prefix
        if part >= self.parts:
            return False
        if part in self.results:
            sizes = self.results.pop(part)
        elif self.recorded[part]:
            found = self._recorded_sizes(part)
            if found is None:
                self.recorded[part] = False
                self.resumed -= 1
                self.redo.append(part)
                return False
            sizes = found
        else:
            return False
        self.sizes.append(sizes)
        self.first_tile.append(self.first_tile[-1] + len(sizes))
        self.prefix += 1
        return True

    def _recorded_sizes(self, part: int) -> np.ndarray | None:
        """The chunk sizes an earlier run recorded for ``part`` (its progress counted), or None
        when its record is not of this part as this run cuts it, or not of this code's making."""
        first = part * self.part_size
        try:
            record, table = tasks.read_part(self.out, self.work, part)
            if (record["first"], record["count"], record["tiles"]) != (
                    first, min(self.part_size, len(self.listing) - first), len(table)):
                return None
        except (ValueError, KeyError, TypeError, FileNotFoundError):
            return None
        if self.tick:
            self.tick(record["count"], len(record["rejects"]))
        return table["size"]

    def _submit_shards(self, pending: dict[Future[Any], _Task]) -> None:
        """The shards the parts done in order allow, taken in part by part: the parts a resumed
        run finds recorded are freed as the shards in place cover them, never all held at once."""
        self._shards_known(pending)
        while self._advance():
            self._shards_known(pending)

    def _shards_known(self, pending: dict[Future[Any], _Task]) -> None:
        """Every shard whose tiles are all counted, found in place or sent to be written."""
        known = self.first_tile[-1]
        complete = self.prefix == self.parts
        while True:
            lo, hi = self.next_shard * self.per_shard, (self.next_shard + 1) * self.per_shard
            if not (hi <= known or (complete and lo < known)):
                return
            shard = self.next_shard
            self.next_shard += 1
            size = self.existing.get(fmt.shard_relpath(shard))
            if size is not None:  # written before an interruption: atomic, so whole
                self.shard_bytes[shard] = size
                self.shard_done.add(shard)
                self._sync(shard)  # that run may have died before syncing it
                self._free_parts()
                continue
            pieces, sizes = self._pieces(lo, min(hi, known))
            spec = (shard, self.per_shard, pieces, sizes, not self.local)
            if self._copier is None:
                self.ready.append(spec)  # sent with the next part, or alone if none is left
            else:
                args = (self.out, self.work, [spec])
                pending[self._copier.submit(tasks.write_shards, *args)] = _Task(
                    "shards", shard, tasks.write_shards, args)

    def _sync(self, shard: int, digest: str | None = None) -> None:
        """The shard, written or found in place, synced (when this machine wrote it) and, unless
        its writer did, digested, on a background thread."""
        if self.local:
            assert self.out.local is not None
            path = fmt.shard_path(self.out.local, shard)
            self._syncing.append((shard, self._syncer.submit(_sync_and_digest, path, digest)))
        elif digest is not None:
            self.shard_sha256[shard] = digest
        else:
            if self._digester is None:
                self._digester = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="tilefeed-digest")
            self._syncing.append((shard, self._digester.submit(_digest, self.out, fmt.shard_relpath(shard))))
        self._synced()

    def _synced(self, wait: bool = False) -> None:
        """Take in the syncs done (all of them, waiting, with ``wait``): only those in flight
        are held as futures."""
        while self._syncing and (wait or self._syncing[0][1].done()):
            shard, sync = self._syncing.popleft()
            seconds, self.shard_sha256[shard] = sync.result()
            self.phases["sync"] += seconds

    def _pieces(self, lo: int, hi: int) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """Tiles [lo, hi) as (part, byte offset, byte count) runs of the parts' chunk files,
        and the chunk sizes of those tiles."""
        pieces, sizes = [], []
        k = bisect.bisect_right(self.first_tile, lo) - 1
        while lo < hi:
            start = lo - self.first_tile[k]
            stop = min(hi, self.first_tile[k + 1]) - self.first_tile[k]
            if stop > start:
                run = self.sizes[k][start:stop]
                pieces.append((self.freed + k, int(self.sizes[k][:start].sum()), int(run.sum())))
                sizes.append(run)
                lo += stop - start
            k += 1
        return pieces, np.concatenate(sizes)

    def _free_parts(self) -> None:
        while self.shards_done in self.shard_done:
            self.shard_done.remove(self.shards_done)
            self.shards_done += 1
        covered = self.shards_done * self.per_shard
        while self.freed < self.prefix and self.first_tile[1] <= covered:
            self.out.delete([f"{self.work}/{tasks.part_name(self.freed, '.bin')}"])
            del self.first_tile[0], self.sizes[0]
            self.freed += 1

    def close(self) -> None:
        if self._copier is not None:
            self._copier.shutdown(wait=True)
        self._syncer.shutdown(wait=True)
        if self._digester is not None:
            self._digester.shutdown(wait=True, cancel_futures=True)

    def finish(self, fingerprint: str) -> Summary:
        samples = self.first_tile[-1]
        rejects: list[tuple[str, str]] = []
        parts = self._read_parts(rejects)
        inputs = len(self.listing) + len(self.listing.skipped)
        if samples == 0:
            for _ in parts:  # only their rejects, for the message
                pass
            reasons = Counter(_reason_kind(r) for _, r in rejects + self.listing.skipped)
            raise SourceError(
                f"no usable image among {inputs} inputs "
                f"({', '.join(f'{n} {k}' for k, n in reasons.most_common())})"
            )
        shards = fmt.shard_count(samples, self.per_shard)
        shard_bytes = [self.shard_bytes[s] for s in range(shards)]
        self._synced(wait=True)  # every shard on disk and digested before any metadata declares it
        shard_sha256 = [self.shard_sha256[s] for s in range(shards)]

        def write(root: Path) -> None:
            names = write_arrays(root, self.listing, self.tiles, self.store, samples, parts)
            rejects.extend(self.listing.skipped)  # after the parts': the order the store lists them
            write_attrs(root, self.listing, self.tiles, self.store, fingerprint, samples, rejects,
                        inputs - len(rejects), names, shard_bytes, shard_sha256)

        if self.out.local is not None:
            for stray in (self.out.local / fmt.IMAGES).rglob(".*.tmp-*"):
                stray.unlink()  # a shard a killed worker was writing; written again since
            write(self.out.local)
        else:  # written in a scratch folder, then put object by object, the group's last
            with tempfile.TemporaryDirectory(prefix="tilefeed-metadata-") as scratch:
                write(Path(scratch))
                shutil.rmtree(Path(scratch) / fmt.WORK_DIR, ignore_errors=True)
                self.out.upload_tree(Path(scratch), last="zarr.json")
        self.out.remove(self.work)
        reasons = Counter(_reason_kind(r) for _, r in rejects)
        return Summary(
            sources=inputs, accepted=inputs - len(rejects), rejected=len(rejects), tiles=samples,
            shards=shards, bytes=sum(shard_bytes), seconds=0.0,
            rejects_by_reason=dict(reasons.most_common()), phases=self.phases,
        )

    def _read_parts(self, rejects: list[tuple[str, str]]) -> Iterator[PartTiles]:
        """Every part's tile table in order, read from its record; its rejects go to ``rejects``
        and its seconds to the phases as it is read."""
        for part in range(self.parts):
            record, table = tasks.read_part(self.out, self.work, part)
            rejects.extend((path, reason) for _, path, reason in record["rejects"])
            for phase, seconds in record["seconds"].items():
                self.phases[phase] += seconds
            yield PartTiles(part * self.part_size, record["count"], table)


def _sync_and_digest(path: Path, digest: str | None) -> tuple[float, str]:
    """A shard this machine wrote: fsynced, then its sha256 unless its writer read it back
    already (read back while in the page cache); the seconds both took."""
    start = time.perf_counter()
    tasks.fsync(path)
    if digest is None:
        with open(path, "rb") as f:
            digest = fmt.sha256_fd(f.fileno())
    return time.perf_counter() - start, digest


def _digest(out: Storage, key: str) -> tuple[float, str]:
    """A shard written elsewhere (in a bucket, by a cluster's worker): its sha256 read back."""
    start = time.perf_counter()
    digest = out.sha256(key)
    return time.perf_counter() - start, digest


def _reason_kind(reason: str) -> str:
    return reason.split(":", 1)[0]




def _summary_from_attrs(attrs: dict[str, Any] | None, out: Storage) -> Summary:
    assert attrs is not None
    nbytes = sum(out.sizes(f"{fmt.IMAGES}/c").values())
    reasons = Counter(_reason_kind(r["reason"]) for r in attrs["rejects"])
    return Summary(
        sources=attrs["sources"], accepted=attrs["accepted"], rejected=attrs["rejected"],
        tiles=attrs["samples"], shards=attrs["shards"], bytes=nbytes, seconds=0.0,
        rejects_by_reason=dict(reasons.most_common()), up_to_date=True,
    )
