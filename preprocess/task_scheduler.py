"""The writer's scheduler: parts and shards kept flowing on the pool, resumed where an earlier
run stopped.

Parts are sent in order, a bounded number in flight; a shard is sent as soon as the parts it
needs are done (with the next part's task, or alone when none is left, or to a thread of the
driver's on a core the workers leave free). A part recorded by an earlier run is read rather
than done again, and a shard in place is kept. A part's chunk file goes once every shard it
feeds is written.

What it holds per part is only for the parts between the first not yet consumed by shards and
the first not yet done (their first tiles and chunk sizes), and the results of parts done out
of order: a window as wide as the work in flight, whatever the number of sources.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import numpy as np

from tilefeed.preprocess import tasks
from tilefeed.preprocess.worker_pool import InFlight, Pool, Task
from tilefeed.preprocess.settings import StoreSettings, TileSettings
from tilefeed.preprocess.shard_sync import ShardSync
from tilefeed.preprocess.sources.finding import Listing
from tilefeed.store import format as fmt
from tilefeed.store.host import usable_cores
from tilefeed.store.storage import Storage

PHASES = ("decode", "encode", "write", "copy", "sync")  # where the workers' time goes
# (sync: each finished shard's sha256, taken by its writer, and its fsync on the driver's thread)
SHARDS_PER_TASK: Final = 16  # shards one task writes at most
_RECORD: Final = re.compile(r"part-(\d{7})\.json")

ProgressFn = Callable[[int, int], None]  # (sources done in this step, rejects in this step)


class Scheduler:
    """Drives parts and shards: shards are written as soon as the parts they need are done,
    then fsynced (on this machine) and digested, and part files are deleted once every shard
    they feed is written. ``run`` does the work; then ``samples``, ``shard_sizes`` and
    ``shard_digests`` describe what is in place."""

    def __init__(self, out: Storage, listing: Listing, tiles: TileSettings, store: StoreSettings,
                 tick: ProgressFn | None, pool: Pool, part_size: int) -> None:
        self.pool = pool
        self.out, self.work = out, fmt.WORK_DIR
        self.listing, self.tiles, self.store, self.tick = listing, tiles, store, tick
        self.per_shard = store.shard_size
        self.part_size = part_size
        self.parts = fmt.ceil_div(len(listing), part_size)
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
        self.ready: list[tasks.ShardSpec] = []  # shards to write, not yet sent
        self.phases = dict.fromkeys(PHASES, 0.0)  # seconds per phase, for `bench preprocess`
        self.existing: dict[str, int] = {}  # shards in place before this run (key -> size)
        self.resumed = 0  # parts found done on disk
        self.inflight = InFlight(pool)
        # This machine writes OUT's files: it fsyncs the shards, which the workers then need not.
        self.writes_here = pool.on_this_machine and out.local is not None
        self.sync = ShardSync(out, out.local if self.writes_here else None)
        # Shards are the workers' to write, so that the driver's work per source stays small;
        # but when the workers leave a core free, a thread here copies a local store's shards
        # (in-kernel copies) on that core, and the workers keep decoding.
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-shards") if (
            self.writes_here and pool.workers < usable_cores()) else None

    @property
    def samples(self) -> int:
        """The tiles counted so far: all of them, once ``run`` returned."""
        return self.first_tile[-1]

    def shard_sizes(self, shards: int) -> list[int]:
        return [self.shard_bytes[s] for s in range(shards)]

    def shard_digests(self, shards: int) -> list[str]:
        """The sha256 of every shard, once each is synced and digested; their seconds go to
        the phases."""
        digests = self.sync.digests(shards)
        self.phases["sync"] += self.sync.seconds
        return digests

    def run(self) -> None:
        self._find_recorded()
        self.existing = self.out.sizes(f"{fmt.IMAGES}/c")
        planned = ~self.recorded  # as found: a record met again later goes to redo, not here
        todo = (p for p in range(self.parts) if planned[p])
        most = 2 * self.pool.workers  # parts in flight
        self._submit_shards()
        self._submit_parts(todo, most)
        while self.inflight:
            done, lost = self.inflight.collect()
            for task, fut in done:
                self._done(task, tasks.TaskDone.from_dict(fut.result()))
            if lost:
                self.inflight.send_again(lost)
            self._submit_shards()
            self._submit_parts(todo, most)

    def close(self) -> None:
        if self._copier is not None:
            self._copier.shutdown(wait=True)
        self.sync.close()

    # -- what an earlier run left ------------------------------------------------------------

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

    def _recorded_sizes(self, part: int) -> np.ndarray | None:
        """The chunk sizes an earlier run recorded for ``part`` (its progress counted), or None
        when its record is not of this part as this run cuts it, or not of this code's making."""
        first = part * self.part_size
        try:
            record, table = tasks.read_part(self.out, self.work, part)
            if (record.first, record.count, record.tiles) != (
                    first, min(self.part_size, len(self.listing) - first), len(table)):
                return None
        except (ValueError, KeyError, TypeError, FileNotFoundError):
            return None
        if self.tick:
            self.tick(record.count, len(record.rejects))
        return table["size"]

    # -- parts -------------------------------------------------------------------------------

    def _done(self, task: Task, result: tasks.TaskDone) -> None:
        if result.part is not None:
            self.results[task.number] = np.frombuffer(result.part.sizes, dtype="<i8")
            if self.tick:
                self.tick(result.part.count, result.part.rejected)
        for shard in result.shards:
            self.shard_bytes[shard.shard] = shard.size
            self.phases["copy"] += shard.seconds
            self.phases["sync"] += shard.digest_seconds
            self.shard_done.add(shard.shard)
            self.sync.add(shard.shard, shard.sha256)
        self._free_parts()

    def _submit_parts(self, todo: Iterator[int], most: int) -> None:
        """Parts in flight up to ``most``, those to do again first, then the next in order, each
        taking along the shards ready to be written; with no part left to send, the shards go
        alone."""
        for _ in range(most - self.inflight.parts()):
            part = self.redo.pop() if self.redo else next(todo, None)
            if part is None:
                break
            first = part * self.part_size
            source = self.listing.targets
            job, records = (None, b"") if source is None else (source.job, source.read(first, self.part_size))
            pairs = self.listing.pairs
            members = b"" if pairs is None else pairs.read(first, self.part_size)
            args = (self.out, self.work, part, first, self.listing.files.read(first, self.part_size),
                    self.tiles, self.store, self._take_ready(), job, records, members, False)
            self.inflight.send(Task("part", part, tasks.run_part, args))
        if self.ready:
            shards = self._take_ready()
            alone = (self.out, self.work, shards)
            self.inflight.send(Task("shards", shards[0].shard, tasks.write_shards, alone))

    def _take_ready(self) -> list[tasks.ShardSpec]:
        """The shards ready to be written, to be sent in one task."""
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

    # -- shards ------------------------------------------------------------------------------

    def _submit_shards(self) -> None:
        """The shards the parts done in order allow, taken in part by part: the parts a resumed
        run finds recorded are freed as the shards in place cover them, never all held at once."""
        self._shards_known()
        while self._advance():
            self._shards_known()

    def _shards_known(self) -> None:
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
                self.sync.add(shard)  # that run may have died before syncing it
                self._free_parts()
                continue
            pieces, sizes = self._pieces(lo, min(hi, known))
            spec = tasks.ShardSpec(shard, self.per_shard, pieces, sizes, not self.writes_here)
            if self._copier is None:
                self.ready.append(spec)  # sent with the next part, or alone if none is left
            else:
                self.inflight.send(Task("shards", shard, tasks.write_shards, (self.out, self.work, [spec])),
                                   self._copier)

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
        """Delete the chunk files of the parts every written shard has consumed."""
        while self.shards_done in self.shard_done:
            self.shard_done.remove(self.shards_done)
            self.shards_done += 1
        covered = self.shards_done * self.per_shard
        while self.freed < self.prefix and self.first_tile[1] <= covered:
            self.out.delete([f"{self.work}/{tasks.part_name(self.freed, '.bin')}"])
            del self.first_tile[0], self.sizes[0]
            self.freed += 1
