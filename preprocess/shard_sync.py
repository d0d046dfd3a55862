"""Each written shard made durable and digested off the scheduling thread.

A shard this machine wrote is fsynced on a background thread, so that the disk write overlaps
decoding, and read back for its sha256 there unless its writer read it back already. A shard
written elsewhere (in a bucket, by a cluster's worker) comes with its digest, or is read back
where it lies when a resumed run finds it in place.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tilefeed.preprocess import tasks
from tilefeed.store import format as fmt
from tilefeed.store.shard import sha256_fd
from tilefeed.store.storage import Storage

DIGEST_THREADS = 4  # shards digested at once where they are read back (a bucket, a cluster's folder)


class ShardSync:
    """The shards' digests as they come in, and the seconds their syncs and digests took here.

    ``synced_here`` is OUT's folder when this machine wrote its shards (they are fsynced here),
    else None. Only the syncs in flight are held as futures.
    """

    def __init__(self, out: Storage, synced_here: Path | None) -> None:
        self.out, self.synced_here = out, synced_here
        self.sha256: dict[int, str] = {}
        self.seconds = 0.0
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="tilefeed-fsync")
        self._digester: ThreadPoolExecutor | None = None
        self._syncing: deque[tuple[int, Future[tuple[float, str]]]] = deque()  # (shard, its sync)

    def add(self, shard: int, digest: str | None = None) -> None:
        """The shard, written or found in place, synced (when this machine wrote it) and, unless
        its writer did, digested, on a background thread."""
        if self.synced_here is not None:
            path = fmt.shard_path(self.synced_here, shard)
            self._syncing.append((shard, self._syncer.submit(_sync_and_digest, path, digest)))
        elif digest is not None:
            self.sha256[shard] = digest
        else:
            if self._digester is None:
                self._digester = ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="tilefeed-digest")
            self._syncing.append((shard, self._digester.submit(_digest, self.out, fmt.shard_relpath(shard))))
        self._take_done()

    def digests(self, shards: int) -> list[str]:
        """The sha256 of shards 0..shards-1, once every sync and digest in flight is done."""
        self._take_done(wait=True)
        return [self.sha256[s] for s in range(shards)]

    def close(self) -> None:
        self._syncer.shutdown(wait=True)
        if self._digester is not None:
            self._digester.shutdown(wait=True, cancel_futures=True)

    def _take_done(self, wait: bool = False) -> None:
        """Take in the syncs done (all of them, waiting, with ``wait``)."""
        while self._syncing and (wait or self._syncing[0][1].done()):
            shard, sync = self._syncing.popleft()
            seconds, self.sha256[shard] = sync.result()
            self.seconds += seconds


def _sync_and_digest(path: Path, digest: str | None) -> tuple[float, str]:
    """A shard this machine wrote: fsynced, then its sha256 unless its writer read it back
    already (read back while in the page cache); the seconds both took."""
    start = time.perf_counter()
    tasks.fsync(path)
    if digest is None:
        with open(path, "rb") as f:
            digest = sha256_fd(f.fileno())
    return time.perf_counter() - start, digest


def _digest(out: Storage, key: str) -> tuple[float, str]:
    """A shard written elsewhere (in a bucket, by a cluster's worker): its sha256 read back."""
    start = time.perf_counter()
    digest = out.sha256(key)
    return time.perf_counter() - start, digest
