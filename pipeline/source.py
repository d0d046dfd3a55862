"""The batch source DALI's ``external_source`` calls: this rank's samples, read ahead in threads.

Reading a tile is a crc32c check and a copy or lz4 decompression: short, memory-bound work.
Threads reading whole batches ahead overlap it with DALI's own threads, with no worker
processes, no pickling and no shared-memory segments to leak. On the CPU the threads also do
what DALI's CPU operators do slowly: decoding JPEG tiles (simplejpeg) and cutting and resizing
training windows (pillow-simd, ``resize_to``); how many threads each path gets is
``pool.take``'s choice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefeed.pipeline.reader import StoreReader
from tilefeed.pipeline.stats import Reading, Timing
from tilefeed.preprocess.format import ceil_div, decode_jpeg

Batch = tuple[Any, ...]  # images (array or list of byte arrays), labels, indices, per-sample extras
Extras = Callable[[np.ndarray], tuple[np.ndarray, ...]]  # sample indices -> per-sample graph inputs


@dataclass(frozen=True)
class Epoch:
    """An epoch to read: its number, this rank's samples in order, and the per-sample extras."""

    number: int
    indices: np.ndarray
    extras: Extras | None = None

    def same(self, other: Epoch) -> bool:
        return self.number == other.number and np.array_equal(self.indices, other.indices)


@dataclass(frozen=True)
class Tag:
    """Which batch of the stream a batch is: ``generation`` changes whenever the stream is
    restarted, so a batch prepared for a stream since dropped is recognised and discarded."""

    generation: int
    epoch: int
    batch: int
    last: bool  # the epoch's last batch
    slot: int = -1  # the ring slot its pixels occupy (-1: none), free again once DALI is done
    timing: Timing | None = field(default=None, compare=False)  # where its time went (stats)


def _cancel(futures: deque[tuple[Tag, Future[Batch]]]) -> list[Tag]:
    for _tag, fut in futures:
        fut.cancel()
    for _tag, fut in futures:
        if not fut.cancelled():
            fut.exception()  # wait: no thread may still be reading for a dropped stream
    tags = [tag for tag, _fut in futures]
    futures.clear()
    return tags


class BatchSource:
    """Callable for ``fn.external_source(batch=True)``: one batch per call, StopIteration at the
    end of the stream.

    A stream is an epoch from some batch on, then the epochs expected after it: epochs follow
    one another with no gap, so the first batch of the next epoch is read (and enters the
    graph) while the current one drains. ``restart`` begins a new stream (a new generation),
    ``extend`` appends epochs to the current one, ``stop`` ends it. The source reads ``ahead``
    batches in advance on ``threads`` threads; every batch handed on is tagged (``Tag``), in
    order, in ``fed``. Lossless batches decode into a ring of preallocated arrays that DALI
    reads in place (``no_copy``): a slot is reused only after ``release`` says DALI is done with
    it. JPEG batches are lists of fresh byte arrays, which DALI copies in (``dali_copies``).
    ``handed_out``: no DALI graph; batches go to the caller as they are, each in its own array.
    ``resize_to``: tiles are cut to their crop windows (the first two extras) and resized to
    this side here, with pillow-simd, rather than in the graph. Either way the threads here
    decode JPEG tiles too (``decodes``; ``fast_idct``: see ``format.decode_jpeg``).
    """

    def __init__(self, reader: StoreReader, batch_size: int, threads: int, ahead: int,
                 dali_depth: int, handed_out: bool = False, resize_to: int | None = None,
                 fast_idct: bool = False) -> None:
        self.reader = reader
        self.fast_idct = fast_idct
        self.batch_size = batch_size
        self.ahead = max(1, ahead)
        self.threads = max(1, threads)
        self.handed_out = handed_out
        self.resize_to = resize_to
        self.timed = True  # each batch carries a Timing (Loader(stats=False) turns it off)
        self.callback_seconds = 0.0  # spent in __call__, DALI's callback (the feeding thread's)
        self.lock = threading.Condition()  # guards everything below; tells waiters of new work
        self.generation = 0
        self.fed: deque[Tag] = deque()  # batches handed to DALI whose outputs are not out yet
        self._pool: ThreadPoolExecutor | None = None  # made by restart(), ended by close()
        self._pending: deque[tuple[Tag, Future[Batch]]] = deque()
        self._epochs: deque[tuple[Epoch, int]] = deque()  # still to submit: (epoch, from batch)
        self._last_epoch = -1  # the number of the stream's last epoch
        self._next = 0  # next batch of _epochs[0] to submit
        self._ring: list[np.ndarray] = []
        self._free: list[int] = []
        self._ring_size = self.ahead + dali_depth + 2

    @property
    def decodes(self) -> bool:
        """Batches leave here as pixels, not as JPEG bytes for the graph's decoder."""
        return not self.reader.is_image_coded or self.handed_out or self.resize_to is not None

    @property
    def dali_copies(self) -> bool:
        """DALI must copy the batches in: JPEG batches are fresh byte arrays, not ring slots."""
        return not self.decodes

    def restart(self, epoch: Epoch, first_batch: int = 0, following: Sequence[Epoch] = ()) -> int:
        """A new stream: ``epoch`` (this rank's samples, and ``extras``: per-sample inputs such
        as crop windows and flips, computed from each batch's indices) from batch
        ``first_batch`` on, then ``following``. What was read for the old stream is dropped.
        Returns the new generation."""
        with self.lock:
            self._drop()
            self.generation += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tilefeed-read")
            self._epochs.clear()
            self._last_epoch = epoch.number - 1
            self._append(epoch, first_batch)
            self._extend(following)
            self._fill()
            self.lock.notify_all()
            return self.generation

    def extend(self, following: Sequence[Epoch]) -> None:
        """Append the epochs of ``following`` that come after the stream's last one."""
        with self.lock:
            self._extend(following)
            self._fill()
            self.lock.notify_all()

    def _extend(self, following: Sequence[Epoch]) -> None:
        for epoch in following:
            if epoch.number == self._last_epoch + 1:
                self._append(epoch, 0)

    def _append(self, epoch: Epoch, first_batch: int) -> None:
        self._last_epoch = epoch.number
        if first_batch < ceil_div(len(epoch.indices), self.batch_size):
            if not self._epochs:
                self._next = first_batch
                self.reader.will_read(epoch.indices[first_batch * self.batch_size :])
            self._epochs.append((epoch, first_batch))

    def stop(self) -> None:
        """End the stream: nothing more is read; the next call raises StopIteration."""
        with self.lock:
            self._drop()
            self._epochs.clear()
            self.lock.notify_all()

    @property
    def has_work(self) -> bool:
        """The stream has batches not yet handed on."""
        return bool(self._pending or self._epochs)

    def _fill(self) -> None:
        while len(self._pending) < self.ahead and self._epochs:
            epoch, _ = self._epochs[0]
            batches = ceil_div(len(epoch.indices), self.batch_size)
            self._pending.append(self._submit(epoch, self._next, batches))
            self._next += 1
            if self._next == batches:  # on to the next epoch: a bucket store fetches its shards
                self._epochs.popleft()
                if self._epochs:
                    self._next = self._epochs[0][1]
                    self.reader.will_read(self._epochs[0][0].indices[self._next * self.batch_size :])

    def _submit(self, epoch: Epoch, batch: int, batches: int) -> tuple[Tag, Future[Batch]]:
        assert self._pool is not None
        chunk = epoch.indices[batch * self.batch_size : (batch + 1) * self.batch_size]
        slot, images = self._buffer(len(chunk))
        timing = Timing() if self.timed else None
        tag = Tag(self.generation, epoch.number, batch, batch == batches - 1, slot, timing)
        return tag, self._pool.submit(self._read, chunk, images, epoch.extras, timing)

    def _buffer(self, n: int) -> tuple[int, np.ndarray | None]:
        if not self.decodes:
            return -1, None
        side = self.resize_to
        shape = (self.batch_size, *((side, side, 3) if side else self.reader.codec.shape))
        if self.handed_out:  # the caller keeps it (fresh memory measured about as fast as reused)
            return -1, np.empty((n, *shape[1:]), dtype=np.uint8)
        if not self._ring:
            self._ring = [np.empty(shape, dtype=np.uint8) for _ in range(self._ring_size)]
            self._free = list(range(self._ring_size))
        if not self._free:  # not while the ring holds all a graph can have in flight; but safe
            self._ring.append(np.empty(shape, dtype=np.uint8))
            self._free.append(len(self._ring) - 1)
        slot = self._free.pop()
        return slot, self._ring[slot][:n]

    def release(self, tag: Tag) -> None:
        """DALI is done with ``tag``'s batch: its ring slot may be written again."""
        if tag.slot >= 0:
            with self.lock:
                self._free.append(tag.slot)

    def owns(self, pointer: int) -> bool:
        """``pointer`` lies in the ring DALI reads in place: output there must be copied out."""
        return any(a.ctypes.data <= pointer < a.ctypes.data + a.nbytes for a in self._ring)

    def take(self) -> tuple[Tag, Batch]:
        """The next batch of the stream and its tag (StopIteration: the stream has ended)."""
        with self.lock:
            if not self._pending:
                raise StopIteration
            tag, fut = self._pending.popleft()
            self._fill()
        return tag, fut.result()

    def __call__(self) -> Batch:
        began = time.perf_counter()
        try:
            tag, batch = self.take()  # DALI calls this on one thread, in order: the tags follow
        finally:
            self.callback_seconds += time.perf_counter() - began
        self.fed.append(tag)
        return batch

    def ready(self) -> int:
        """Batches read and waiting to be taken."""
        with self.lock:
            return sum(fut.done() for _tag, fut in self._pending)

    def _read(self, indices: np.ndarray, images: Any, extras_of: Extras | None,
              timing: Timing | None) -> Batch:
        with Reading(timing):
            reader = self.reader
            labels = reader.labels[indices]
            extras = extras_of(indices) if extras_of is not None else ()
            began = time.perf_counter()
            if images is None:
                # bytes() copies out of the map: DALI may hold inputs past this call
                images = [np.frombuffer(bytes(p), np.uint8) for p in reader.payloads(indices.tolist())]
                if timing is not None:
                    timing.read += time.perf_counter() - began - timing.download
                    timing.nbytes += sum(len(p) for p in images)
            elif self.resize_to:
                self._cut_and_resize(indices, extras[0], extras[1], images, timing)
                extras = extras[2:]  # the flips: the graph has no window left to cut
            else:
                reader.read_batch_into(indices.tolist(), images, self.fast_idct)
                if timing is not None:  # one pass reads, checks and decodes each tile
                    timing.decode += time.perf_counter() - began - timing.download
                    timing.stored = indices
        return (images, labels, indices, *extras)

    def _cut_and_resize(self, indices: np.ndarray, start: np.ndarray, end: np.ndarray,
                        out: np.ndarray, timing: Timing | None = None) -> None:
        """Each tile's window (start, end: [y, x] in tile pixels) resized into ``out[k]``:
        bilinear, antialiased when shrinking, as torchvision's PIL path does (several times as
        fast as DALI's CPU resize: ``tilefeed bench parts``)."""
        from PIL import Image

        reader, side = self.reader, out.shape[1]
        jpeg = reader.is_image_coded
        # JPEG tiles decode as RGBX, PIL's own layout for RGB, which it reads in place rather
        # than converting (the same pixels, sooner); lossless tiles are RGB as stored
        tile = np.empty((*reader.codec.shape[:2], 4 if jpeg else 3), dtype=np.uint8)
        mode = "RGBX" if jpeg else "RGB"
        size = (tile.shape[1], tile.shape[0])
        clock = time.perf_counter
        t0 = clock()
        payloads = reader.payloads(indices.tolist())
        t1 = clock()
        decoding = resizing = 0.0
        for k, payload in enumerate(payloads):
            if jpeg:
                decode_jpeg(payload, tile, self.fast_idct, pixels="RGBX")
            else:
                reader.codec.decode(payload, tile)
            t2 = clock()
            picture = Image.frombuffer(mode, size, tile, "raw", mode, 0, 1)
            (y0, x0), (y1, x1) = start[k].tolist(), end[k].tolist()
            resized = picture.resize((side, side), Image.Resampling.BILINEAR, box=(x0, y0, x1, y1))
            out[k] = np.frombuffer(resized.tobytes("raw", "RGB"), np.uint8).reshape(out.shape[1:])
            t3 = clock()
            decoding += t2 - t1
            resizing += t3 - t2
            t1 = t3
        if timing is not None:
            timing.read += (t1 - t0) - decoding - resizing - timing.download
            timing.decode += decoding
            timing.resize += resizing
            timing.nbytes += sum(len(p) for p in payloads)

    def _drop(self) -> None:
        for tag in _cancel(self._pending):
            if tag.slot >= 0:
                self._free.append(tag.slot)

    def close(self) -> None:
        """End the stream and the reader threads; ``restart()`` makes new ones."""
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
