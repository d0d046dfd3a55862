"""Sources -> a sharded Zarr v3 store, in parallel, resumable after a crash at any moment.

Work is cut into *parts* of PART_SOURCES consecutive sources, independent of the worker count.
A worker decodes its part's images and writes their encoded chunks to the work folder
(``OUT/.tilefeed-partial``), bytes first and a small JSON record last, each under a temporary
name then renamed. As soon as the parts a shard needs are recorded, a worker copies their chunk
bytes into the shard file (temporary name, then rename) and the consumed part files go; the
driver fsyncs each shard on a background thread, so the disk write overlaps decoding, and
takes each shard's sha256 there from the finished file (from the bucket, for a store in one;
from the shared folder, for shards a cluster wrote; also for shards a resumed run finds in
place), so the digest the store records is of the bytes that are there. When every shard is in
place, synced and digested the driver writes the small arrays and the array metadata, and the
group's tilefeed attributes last: that write marks the store complete. A rerun of the same
command skips the parts and shards already there, so a killed run resumes and ends in the very
bytes of an uninterrupted one.

This module is the driver only: the tasks that run on workers are in ``tasks``, the output
folder's rules in ``output``, the metadata in ``metadata``. Most of it is ``_Build``, the
scheduler that keeps parts and shards flowing and survives dying workers.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess import tasks
from tilefeed.preprocess.errors import SourceError, StoreWriteError, TilefeedError
from tilefeed.preprocess.metadata import write_metadata
from tilefeed.preprocess.output import out_inside, prepare_output, writer_lock
from tilefeed.preprocess.storage import redacted
from tilefeed.preprocess.settings import StoreSettings, TileSettings, default_workers, describe
from tilefeed.preprocess.sources import SourceOptions, Sources, find_sources
from tilefeed.preprocess.storage import Storage, client_started, is_url, open_storage

PART_SOURCES = 64
PHASES = ("decode", "encode", "write", "copy", "sync")  # where the workers' time goes
# (sync: each finished shard's fsync and sha256, on the driver's threads)
DIGEST_THREADS = 4  # shards digested at once where they are read back (a bucket, a cluster's folder)


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
    sources = find_sources(src, source_options, exclude=exclude)
    plan = _plan(sources, tiles, store)
    with writer_lock(target):
        notes = list(sources.notes)
        if prepare_output(target, plan, overwrite, notes):
            summary = _summary_from_attrs(fmt.parse_attrs(target.read("zarr.json")), target)
        else:
            summary = _build(target, sources, tiles, store, workers, plan, progress, scheduler)
    summary.seconds = time.perf_counter() - started
    summary.hidden, summary.notes = sources.hidden, notes
    return summary


def _build(out: Storage, sources: Sources, tiles: TileSettings, store: StoreSettings, workers: int,
           plan: dict[str, Any], progress: Callable[[int], ProgressFn] | None,
           scheduler: str | None) -> Summary:
    build = _Build(out, sources, tiles, store, progress(len(sources)) if progress else None,
                   scheduler)
    try:
        build.run(workers)
        summary = build.finish(plan["fingerprint"])
    except BrokenProcessPool:
        raise StoreWriteError(
            "a worker process died (out of memory or killed); rerun the same command to resume"
        ) from None
    except OSError as e:
        raise StoreWriteError(
            f"writing the store {out.name!r} failed: {e.strerror or e}; free space or fix "
            "permissions, then rerun the same command to resume"
        ) from None
    finally:
        build.close()
    summary.resumed_parts = build.resumed
    return summary


def _plan(sources: Sources, tiles: TileSettings, store: StoreSettings) -> dict[str, Any]:
    h = hashlib.sha256()
    h.update(json.dumps([fmt.FORMAT_VERSION, tiles.identity(), asdict(store), sources.classes]).encode())
    for path, label in zip(sources.paths, sources.labels, strict=True):
        try:
            size = os.stat(path).st_size if not is_url(path) else -1
        except (OSError, ValueError):
            size = -1
        h.update(f"{path}\0{label}\0{size}\n".encode("utf-8", "surrogateescape"))
    return {"fingerprint": h.hexdigest(), "sources": len(sources), "settings": describe(tiles, store)}


@dataclass(frozen=True)
class _Task:
    """A submitted part or shard task, kept so that it can run again if its worker dies."""

    kind: str  # "part" or "shard"
    number: int
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


class _Build:
    """Drives parts and shards: shards are written as soon as the parts they need are done (by
    a thread here for a local store, whose shards are in-kernel copies; by the workers for a
    cluster or a bucket), and part files are deleted once every shard they feed is written."""

    def __init__(self, out: Storage, sources: Sources, tiles: TileSettings, store: StoreSettings,
                 tick: ProgressFn | None, scheduler: str | None = None) -> None:
        self.scheduler = scheduler
        self.out, self.work = out, fmt.WORK_DIR
        self.local = scheduler is None and out.local is not None  # this machine writes OUT's files
        self.sources, self.tiles, self.store, self.tick = sources, tiles, store, tick
        self.per_shard = store.shard_size
        n_parts = fmt.ceil_div(len(sources), PART_SOURCES)
        self.records: list[dict[str, Any] | None] = [None] * n_parts
        self.prefix = 0  # parts 0..prefix-1 have records
        self.first_tile = [0]  # first tile of each part in the prefix, then the total
        self.next_shard = 0  # first shard not yet submitted
        self.shard_done: set[int] = set()
        self.shard_bytes: dict[int, int] = {}
        self.phases = dict.fromkeys(PHASES, 0.0)  # seconds per phase, for `bench preprocess`
        self.existing: dict[str, int] = {}  # shards in place before this run (key -> size)
        self.freed = 0  # parts 0..freed-1 have had their chunk file deleted
        self.resumed = 0  # parts found done on disk
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-fsync")
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-shards")
        self._digester: ThreadPoolExecutor | None = None
        self._finished: dict[int, Future[tuple[float, str]]] = {}  # shard -> (fsync seconds, sha256)

    def run(self, workers: int) -> None:
        done = self.out.sizes(self.work)  # one listing: parts recorded before an interruption
        self.existing = self.out.sizes(f"{fmt.IMAGES}/c")
        for p in range(len(self.records)):
            key = f"{self.work}/{tasks.part_name(p, '.json')}"
            if key in done:
                record = self.records[p] = json.loads(self.out.read(key))
                self.resumed += 1
                if self.tick:
                    self.tick(record["count"], len(record["rejects"]))
        todo = iter([p for p, r in enumerate(self.records) if r is None])
        pool = self._executor(workers)
        pending: dict[Future[Any], _Task] = {}
        try:
            for _ in range(2 * workers):
                self._submit_part(pool, pending, todo)
            self._submit_shards(pool, pending)
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
                        self._done(task, fut.result(), pool, pending, todo)
                if lost:
                    if self.scheduler is None:
                        pool.__exit__(None, None, None)
                        pool = self._executor(workers)
                    for task in lost:
                        self._resubmit(task, pool, pending)
                self._submit_shards(pool, pending)
        finally:
            pool.__exit__(None, None, None)

    def _done(self, task: _Task, result: Any, pool: Any, pending: dict[Future[Any], _Task],
              todo: Iterator[int]) -> None:
        if task.kind == "part":
            self.records[task.number] = result
            if self.tick:
                self.tick(result["count"], len(result["rejects"]))
            self._submit_part(pool, pending, todo)
        else:
            self.shard_bytes[task.number] = result["bytes"]
            self.phases["copy"] += result["seconds"]
            self.shard_done.add(task.number)
            self._sync(task.number)
            self._free_parts()

    def _resubmit(self, task: _Task, pool: Any, pending: dict[Future[Any], _Task]) -> None:
        args = task.args
        if task.kind == "part":
            if args[-1]:  # already isolated: the worker died of something other than one image
                raise BrokenProcessPool("a worker process died while decoding images one by one")
            args = (*args[:-1], True)
        pending[pool.submit(task.fn, *args)] = _Task(task.kind, task.number, task.fn, args)

    def _executor(self, workers: int) -> Any:
        if self.scheduler is not None:
            from distributed import Client

            # Tasks are idempotent (temporary name, then rename), so a task whose worker died
            # is simply run again elsewhere.
            client = Client(self.scheduler)
            return _ClientExecutor(client)
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
        return ProcessPoolExecutor(workers, mp_context=context)

    def _submit_part(self, pool: Any, pending: dict[Future[Any], _Task], todo: Iterator[int]) -> None:
        part = next(todo, None)
        if part is not None:
            first = part * PART_SOURCES
            args = (self.out, self.work, part, first, self.sources.paths[first : first + PART_SOURCES],
                    self.tiles, self.store, False)
            pending[pool.submit(tasks.write_part, *args)] = _Task("part", part, tasks.write_part, args)

    def _submit_shards(self, pool: Any, pending: dict[Future[Any], _Task]) -> None:
        while self.prefix < len(self.records):
            record = self.records[self.prefix]
            if record is None:
                break
            self.first_tile.append(self.first_tile[-1] + len(record["sizes"]))
            self.prefix += 1
        known = self.first_tile[-1]
        complete = self.prefix == len(self.records)
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
                continue
            pieces, sizes = self._pieces(lo, min(hi, known))
            args = (self.out, self.work, shard, self.per_shard, pieces, sizes,
                    self.scheduler is not None)
            # a local shard is in-kernel copies (copy_file_range): a thread here does them, and
            # the workers keep decoding; elsewhere the workers read the parts and write it
            runner = self._copier if self.local else pool
            pending[runner.submit(tasks.write_shard, *args)] = _Task("shard", shard, tasks.write_shard, args)

    def _sync(self, shard: int) -> None:
        """The shard, written or found in place, synced (when this machine wrote it) and digested,
        on a background thread."""
        if self.local:
            assert self.out.local is not None
            self._finished[shard] = self._syncer.submit(_sync_and_digest, fmt.shard_path(self.out.local, shard))
            return
        if self._digester is None:
            self._digester = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="tilefeed-digest")
        self._finished[shard] = self._digester.submit(_digest, self.out, fmt.shard_relpath(shard))

    def _pieces(self, lo: int, hi: int) -> tuple[list[tuple[int, int, int]], list[int]]:
        pieces, sizes = [], []
        part = bisect.bisect_right(self.first_tile, lo) - 1
        while lo < hi:
            record = self.records[part]
            assert record is not None
            start = lo - self.first_tile[part]
            stop = min(hi, self.first_tile[part + 1]) - self.first_tile[part]
            if stop > start:
                chunk_sizes = record["sizes"]
                offset = sum(chunk_sizes[:start])
                run = chunk_sizes[start:stop]
                pieces.append((part, offset, sum(run)))
                sizes += run
                lo += stop - start
            part += 1
        return pieces, sizes

    def _free_parts(self) -> None:
        done = 0
        while done in self.shard_done:
            done += 1
        covered = done * self.per_shard
        while self.freed < self.prefix and self.first_tile[self.freed + 1] <= covered:
            self.out.delete([f"{self.work}/{tasks.part_name(self.freed, '.bin')}"])
            self.freed += 1

    def close(self) -> None:
        self._copier.shutdown(wait=True)
        self._syncer.shutdown(wait=True)
        if self._digester is not None:
            self._digester.shutdown(wait=True, cancel_futures=True)

    def finish(self, fingerprint: str) -> Summary:
        records = [r for r in self.records if r is not None]
        owners = np.array([s for r in records for s in r["sources"]], dtype=np.int64)
        rejects = [(self.sources.paths[i], reason) for r in records for i, reason in r["rejects"]]
        rejects += self.sources.skipped
        inputs = len(self.sources) + len(self.sources.skipped)
        reasons = Counter(_reason_kind(r) for _, r in rejects)
        if len(owners) == 0:
            raise SourceError(
                f"no usable image among {inputs} inputs "
                f"({', '.join(f'{n} {k}' for k, n in reasons.most_common())})"
            )
        accepted = inputs - len(rejects)
        for r in records:
            for phase, seconds in r.get("seconds", {}).items():
                self.phases[phase] += seconds
        shards = fmt.shard_count(len(owners), self.per_shard)
        shard_bytes = [self.shard_bytes[s] for s in range(shards)]
        shard_sha256 = []
        for s in range(shards):  # every shard on disk and digested before any metadata declares it
            seconds, digest = self._finished[s].result()
            self.phases["sync"] += seconds
            shard_sha256.append(digest)
        args = (self.sources, self.tiles, self.store, fingerprint, records, owners, rejects,
                accepted, shard_bytes, shard_sha256)
        if self.out.local is not None:
            for stray in (self.out.local / fmt.IMAGES).rglob(".*.tmp-*"):
                stray.unlink()  # a shard a killed worker was writing; written again since
            write_metadata(self.out.local, *args)
        else:  # written in a scratch folder, then put object by object, the group's last
            with tempfile.TemporaryDirectory(prefix="tilefeed-metadata-") as scratch:
                write_metadata(Path(scratch), *args)
                shutil.rmtree(Path(scratch) / fmt.WORK_DIR, ignore_errors=True)
                self.out.upload_tree(Path(scratch), last="zarr.json")
        self.out.remove(self.work)
        return Summary(
            sources=inputs, accepted=accepted, rejected=len(rejects), tiles=len(owners),
            shards=shards, bytes=sum(shard_bytes), seconds=0.0,
            rejects_by_reason=dict(reasons.most_common()), phases=self.phases,
        )


def _sync_and_digest(path: Path) -> tuple[float, str]:
    """A shard this machine wrote: fsynced, then its sha256 (read back while in the page cache);
    the seconds both took."""
    start = time.perf_counter()
    tasks.fsync(path)
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
