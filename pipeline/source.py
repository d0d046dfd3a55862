"""The batch source DALI's ``external_source`` calls: this rank's samples, read ahead in threads.

Reading a tile is a crc32c check and a copy or lz4 decompression: short, memory-bound work.
Threads reading whole batches ahead overlap it with DALI's own threads, with no worker
processes, no pickling and no shared-memory segments to leak. On the CPU the threads also do
what DALI's CPU operators do slowly: decoding JPEG tiles (simplejpeg) and cutting and resizing
training windows (pillow-simd, ``resize_to``); how many threads each path gets is
``pool.take``'s choice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefeed.pipeline.reader import StoreReader
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


def _cancel(futures: deque[Future[Batch]]) -> None:
    for fut in futures:
        fut.cancel()
    for fut in futures:
        if not fut.cancelled():
            fut.exception()  # wait: no thread may still be reading for a dropped epoch
    futures.clear()


class BatchSource:
    """Callable for ``fn.external_source(batch=True)``: one batch per call, StopIteration at the end.

    ``start(epoch, first_batch, then)`` arms an epoch; the source then reads ``ahead`` batches in
    advance on ``threads`` threads. Lossless batches decode into a ring of preallocated arrays
    that DALI reads in place (``no_copy``): DALI is done with a batch ``dali_depth`` iterations
    after taking it, so a ring of ``ahead + dali_depth + 2`` slots is never overwritten early.
    JPEG batches are lists of fresh byte arrays, which DALI copies in (``dali_copies``).
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
        self._pool: ThreadPoolExecutor | None = None  # made by start(), ended by close()
        self._pending: deque[Future[Batch]] = deque()
        self._early: deque[Future[Batch]] = deque()  # the next epoch's first batches
        self._epoch = Epoch(-1, np.zeros(0, dtype=np.int64))
        self._then: Epoch | None = None
        self._next = 0  # next batch to submit
        self._batches = 0
        self._ring: list[np.ndarray] = []
        self._ring_size = self.ahead + dali_depth + 2
        self._slot = 0

    @property
    def decodes(self) -> bool:
        """Batches leave here as pixels, not as JPEG bytes for the graph's decoder."""
        return not self.reader.is_image_coded or self.handed_out or self.resize_to is not None

    @property
    def dali_copies(self) -> bool:
        """DALI must copy the batches in: JPEG batches are fresh byte arrays, not ring slots."""
        return not self.decodes

    def start(self, epoch: Epoch, first_batch: int = 0, then: Epoch | None = None) -> None:
        """Arm ``epoch`` (this rank's samples, and ``extras``: per-sample inputs such as crop
        windows and flips, computed from each batch's indices) from batch ``first_batch`` on.
        ``then``: the epoch expected next, whose first batches are read once this one's are all
        under way, so that no epoch starts cold; the next ``start()`` keeps them when it arms
        that very epoch from its first batch, and drops them otherwise."""
        early, self._early = self._early, deque()
        expected, self._then = self._then, then
        self.cancel()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tilefeed-read")
        self._epoch = epoch
        self._batches = ceil_div(len(epoch.indices), self.batch_size)
        self._next = first_batch
        if early and expected is not None and expected.same(epoch) and first_batch == 0:
            self._pending, self._next = early, len(early)
        else:
            _cancel(early)
        self.reader.will_read(epoch.indices[first_batch * self.batch_size :])
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) + len(self._early) < self.ahead:
            if self._next < self._batches:
                self._pending.append(self._submit(self._epoch, self._next))
                self._next += 1
            elif self._then is not None and len(self._early) < ceil_div(len(self._then.indices),
                                                                         self.batch_size):
                self._early.append(self._submit(self._then, len(self._early)))
            else:
                return

    def _submit(self, epoch: Epoch, batch: int) -> Future[Batch]:
        assert self._pool is not None
        chunk = epoch.indices[batch * self.batch_size : (batch + 1) * self.batch_size]
        return self._pool.submit(self._read, chunk, self._buffer(len(chunk)), epoch.extras)

    def _buffer(self, n: int) -> np.ndarray | None:
        if not self.decodes:
            return None
        side = self.resize_to
        shape = (self.batch_size, *((side, side, 3) if side else self.reader.codec.shape))
        if self.handed_out:  # the caller keeps it (fresh memory measured about as fast as reused)
            return np.empty((n, *shape[1:]), dtype=np.uint8)
        if not self._ring:
            self._ring = [np.empty(shape, dtype=np.uint8) for _ in range(self._ring_size)]
        self._slot = (self._slot + 1) % len(self._ring)
        return self._ring[self._slot][:n]

    def _read(self, indices: np.ndarray, images: Any, extras_of: Extras | None) -> Batch:
        reader = self.reader
        labels = reader.labels[indices]
        extras = extras_of(indices) if extras_of is not None else ()
        if images is None:
            # bytes() copies out of the map: DALI may hold inputs past this call
            images = [np.frombuffer(bytes(p), np.uint8) for p in reader.payloads(indices.tolist())]
        elif self.resize_to:
            self._cut_and_resize(indices, extras[0], extras[1], images)
            extras = extras[2:]  # the flips: the graph has no window left to cut
        else:
            reader.read_batch_into(indices.tolist(), images, self.fast_idct)
        return (images, labels, indices, *extras)

    def _cut_and_resize(self, indices: np.ndarray, start: np.ndarray, end: np.ndarray,
                        out: np.ndarray) -> None:
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
        for k, payload in enumerate(reader.payloads(indices.tolist())):
            if jpeg:
                decode_jpeg(payload, tile, self.fast_idct, pixels="RGBX")
            else:
                reader.codec.decode(payload, tile)
            picture = Image.frombuffer(mode, size, tile, "raw", mode, 0, 1)
            (y0, x0), (y1, x1) = start[k].tolist(), end[k].tolist()
            resized = picture.resize((side, side), Image.Resampling.BILINEAR, box=(x0, y0, x1, y1))
            out[k] = np.frombuffer(resized.tobytes("raw", "RGB"), np.uint8).reshape(out.shape[1:])

    def __call__(self) -> Batch:
        if not self._pending:
            raise StopIteration
        batch = self._pending.popleft().result()
        self._fill()
        return batch

    def cancel(self) -> None:
        """Drop every read not yet taken, this epoch's and the next one's."""
        _cancel(self._pending)
        _cancel(self._early)

    def close(self) -> None:
        """Cancel the reads and end the reader threads; ``start()`` makes new ones."""
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
