"""The batch source DALI's ``external_source`` calls: this rank's samples, read ahead in threads.

Reading a tile is a crc32c check and a copy or lz4 decompression: short, memory-bound work.
Threads reading whole batches ahead overlap it with DALI's own threads, with no worker
processes, no pickling and no shared-memory segments to leak. On the CPU the threads also do
what DALI's CPU operators do slowly: decoding JPEG tiles (simplejpeg) and cutting and resizing
training windows (pillow-simd, ``host_resize``), a JPEG tile at the smallest DCT scale that
still covers its window at the epoch's output size, then applying a training recipe's pixel
operations (``recipe.host_ops``); how many threads each path gets is ``pool.take``'s choice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefeed.pipeline.engine.cuda import host_buffer
from tilefeed.pipeline.engine.operations import Input
from tilefeed.pipeline.reading.protocol import Reader
from tilefeed.pipeline.recipe import host_ops
from tilefeed.pipeline.stats import Reading, Timing
from tilefeed.store.format import ceil_div
from tilefeed.store.codec import decode_jpeg

if TYPE_CHECKING:
    from tilefeed.pipeline.recipe.recipe import Recipe

Batch = tuple[Any, ...]  # images (array or list of byte arrays), labels, indices, the graph's inputs
# (sample indices, the keys their crops and flips are drawn from) -> the operations' inputs by
# name (``operations.graph_inputs``): per sample, but for what only the host reads (``Input``)
Extras = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]
# What runs on a batch as it is handed over, given its outputs by name, its batch number in the
# epoch's stretch and the inputs its operations drew for the graph (``operations.graph_inputs``,
# by name: the targets frame the boxes and masks with them), e.g. the recipe's erasing and
# mixing, a batch's boxes and masks: it may replace entries or add its own. Each is a plain
# record of settings, compared for ``same``.
PerBatch = Callable[[dict[str, Any], int, Mapping[str, np.ndarray]], None]


def graph_names(inputs: Mapping[str, Input], host_resize: bool) -> tuple[str, ...]:
    """Of the ``inputs`` the operations send (``operations.inputs``, in order), those the graph
    reads, as their operations declare them: all but what only the host reads
    (``Input.host_only``: a policy's drawn filter, an IoU crop's keep, the whole window of a
    crop that pads) and, on the host-resize path, what the batch source applies itself
    (``Input.host_applied``: the cut, the output side, the filter, the recipe's pixel
    operations; the horizontal flip stays with the graph). DALI is fed only what it reads."""
    return tuple(name for name, spec in inputs.items()
                 if not spec.host_only and not (host_resize and spec.host_applied))


# DALI's interp codes (``recipe.INTERP_CODES``) as PIL's filters: torchvision's PIL path
PIL_FILTERS = {0: 0, 1: 2, 2: 3, 3: 1}  # NEAREST, BILINEAR, BICUBIC, LANCZOS in PIL's numbering

# JPEG scales libjpeg-turbo decodes in the DCT domain, skipping most of the IDCT's work
DCT_SCALES = (8, 4, 2)


@dataclass(frozen=True)
class Epoch:
    """An epoch to read: its number, this rank's samples in order, their positions in the
    epoch (what their crops and flips are drawn from: of one store, the samples themselves; of
    a mixture, its positions, so a repeated sample is cut anew), the per-sample extras, its
    output side (0: the tiles as stored) and the samples' labels (None: each batch gathers its
    own from the reader)."""

    number: int
    indices: np.ndarray
    positions: np.ndarray
    extras: Extras | None = None
    size: int = 0
    labels: np.ndarray | None = None
    per_batch: tuple[PerBatch, ...] = ()  # applied in order as each batch is handed over
    # (ids, positions) -> what a batch carries besides its tensors out of the graph (captions,
    # tokens, fields: ``loader.pairs``), made on the reader thread
    carry: Callable[[np.ndarray, np.ndarray], dict[str, Any]] | None = None

    def same(self, other: Epoch) -> bool:
        return (self.number == other.number and self.size == other.size and self.per_batch == other.per_batch
                and np.array_equal(self.indices, other.indices))


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
    per_batch: tuple[PerBatch, ...] = field(default=(), compare=False)  # its epoch's, for the hand-over
    # what its operations drew, by name: drawn once, by the reader thread, and carried to the hand-over
    inputs: dict[str, np.ndarray] = field(default_factory=dict, compare=False)
    # what it carries past the graph to the consumer (``Epoch.carry``), made by the reader thread
    carried: dict[str, Any] = field(default_factory=dict, compare=False)


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
    ``host_resize``: tiles are cut to their crop windows (the first two extras) and resized to
    their epoch's size here, with pillow-simd, rather than in the graph; the ring's slots then
    hold a batch at the largest size asked so far (``reserve`` sizes them up front), so sizes
    that change between epochs reuse them; ``inputs`` are what the operations send (the window's
    ``start`` and ``end``, a recipe's per-sample filter ``interp``, else bilinear); a training
    ``recipe``'s pixel operations are then applied here too (``recipe.host_ops``, with the
    sample's drawn inputs): the inputs declared ``host_applied`` stay here, the rest go on to
    the graph (``graph_names``). Either way the threads here decode JPEG tiles too
    (``decodes``; ``fast_idct``: see ``codec.decode_jpeg``; ``scaled_decode``: see
    ``decode_scale``).
    """

    def __init__(self, reader: Reader, batch_size: int, threads: int, ahead: int,
                 dali_depth: int, handed_out: bool = False, host_resize: bool = False,
                 fast_idct: bool = False, scaled_decode: bool = True,
                 inputs: Mapping[str, Input] | None = None,
                 recipe: Recipe | None = None, pinned: bool = False) -> None:
        self.reader = reader
        self.pinned = pinned  # the ring in page-locked memory: the graph copies it to a GPU
        # a training recipe whose pixel operations the host-resize path applies (None: none)
        self.recipe = recipe if host_ops.applies(recipe) else None
        # the colour of output pixels past the picture, for a crop that pads (``Crop.pads``)
        self.fill = np.asarray(recipe.fill if recipe is not None else (0, 0, 0), np.uint8)
        self.fast_idct = fast_idct
        self.scaled_decode = scaled_decode
        self.reserve = 0  # the side ring slots are made for at least (the schedule's largest)
        self.batch_size = batch_size
        self.ahead = max(1, ahead)
        self.threads = max(1, threads)
        self.handed_out = handed_out
        self.host_resize = host_resize
        # the inputs the graph is fed, in order (``graph_names``)
        self.graph_names = graph_names(inputs or {}, host_resize)
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
        return not self.reader.is_image_coded or self.handed_out or self.host_resize

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

    def extend(self, following: Sequence[Epoch], generation: int | None = None) -> bool:
        """Append the epochs of ``following`` that come after the stream's last one; nothing
        (False) when ``generation`` is given and the stream is another by now."""
        with self.lock:
            if generation is not None and generation != self.generation:
                return False
            self._extend(following)
            self._fill()
            self.lock.notify_all()
            return True

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
        batch_of = slice(batch * self.batch_size, (batch + 1) * self.batch_size)
        chunk = epoch.indices[batch_of]
        keys = epoch.positions[batch_of]
        labels = None if epoch.labels is None else epoch.labels[batch_of]
        side = epoch.size or self.reader.tile
        slot, images = self._buffer(len(chunk), side)
        timing = Timing() if self.timed else None
        tag = Tag(self.generation, epoch.number, batch, batch == batches - 1, slot, timing, epoch.per_batch)
        return tag, self._pool.submit(self._read, tag, chunk, keys, labels, images, epoch.extras, epoch.carry)

    def _buffer(self, n: int, side: int) -> tuple[int, np.ndarray | None]:
        """A slot of the ring (or, handed out, fresh memory) for ``n`` tiles at ``side``."""
        if not self.decodes:
            return -1, None
        shape = (side, side, 3) if self.host_resize else self.reader.codec.shape
        if self.handed_out:  # the caller keeps it (fresh memory measured about as fast as reused)
            return -1, np.empty((n, *shape), dtype=np.uint8)
        # slots are flat bytes sized for a whole batch at the largest side asked for so far: a
        # batch at any smaller side is a contiguous view of the front, so a size that changes
        # every epoch allocates nothing once the largest has been seen
        largest = max(side, self.reserve) if self.host_resize else side
        need = self.batch_size * (largest * largest * 3 if self.host_resize else int(np.prod(shape)))
        if not self._ring:
            self._ring = [host_buffer(need, self.pinned) for _ in range(self._ring_size)]
            self._free = list(range(self._ring_size))
        if not self._free:  # not while the ring holds all a graph can have in flight; but safe
            self._ring.append(host_buffer(need, self.pinned))
            self._free.append(len(self._ring) - 1)
        slot = self._free.pop()
        if self._ring[slot].nbytes < need:  # free, so DALI no longer reads it: safe to replace
            self._ring[slot] = host_buffer(need, self.pinned)
        count = n * int(np.prod(shape))
        return slot, self._ring[slot][:count].reshape(n, *shape)

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

    def _read(self, tag: Tag, indices: np.ndarray, keys: np.ndarray, labels: np.ndarray | None, images: Any,
              extras_of: Extras | None, carry: Callable[[np.ndarray, np.ndarray], dict[str, Any]] | None = None,
              ) -> Batch:
        timing = tag.timing
        with Reading(timing):
            reader = self.reader
            if labels is None:
                labels = reader.labels[indices]
            extras = extras_of(indices, keys) if extras_of is not None else {}
            tag.inputs.update(extras)  # read at the hand-over, after this batch has left here
            if carry is not None:  # captions and their tokens: here, off the training loop's thread
                tag.carried.update(carry(indices, keys))
            began = time.perf_counter()
            if images is None:
                # bytes() copies out of the map: DALI may hold inputs past this call
                images = [np.frombuffer(bytes(p), np.uint8) for p in reader.payloads(indices.tolist())]
                if timing is not None:
                    timing.read += time.perf_counter() - began - timing.download
                    timing.nbytes += sum(len(p) for p in images)
            elif self.host_resize:
                self._cut_and_resize(indices, extras["start"], extras["end"], images, timing,
                                     extras.get("interp"), extras)
            else:
                reader.read_batch_into(indices.tolist(), images, self.fast_idct)
                if timing is not None:  # one pass reads, checks and decodes each tile
                    timing.decode += time.perf_counter() - began - timing.download
                    timing.stored = indices
        # the graph is fed only what it reads (``graph_names``); handed out, nothing
        return (images, labels, indices, *(extras[n] for n in self.graph_names))

    def _cut_and_resize(self, indices: np.ndarray, start: np.ndarray, end: np.ndarray,
                        out: np.ndarray, timing: Timing | None = None,
                        interp: np.ndarray | None = None,
                        inputs: dict[str, np.ndarray] | None = None) -> None:
        """Each tile's window (start, end: [y, x] in tile pixels) resized into ``out[k]``:
        bilinear (else each sample's filter in ``interp``, DALI's codes), antialiased when
        shrinking, as torchvision's PIL path does (several times as fast as DALI's CPU resize:
        ``tilefeed bench parts``); then, with a recipe, its pixel operations with each sample's
        drawn values of ``inputs`` (``host_ops.apply``). A JPEG tile is decoded at the
        smallest DCT scale its window allows (``decode_scale``), the window scaled with it.
        A window that reaches past the picture (``inputs`` holds ``PASTE_NAMES``) has its part
        inside the picture resized to its share of the output, put through the recipe's
        operations and pasted in place on the fill (``crops.frame_inputs``), as the graph does."""
        from PIL import Image

        reader, side = self.reader, out.shape[1]
        jpeg = reader.is_image_coded
        height, width = reader.codec.shape[:2]
        # JPEG tiles decode as RGBX, PIL's own layout for RGB, which it reads in place rather
        # than converting (the same pixels, sooner); lossless tiles are RGB as stored
        tiles = {f: np.empty((-(-height // f), -(-width // f), 4 if jpeg else 3), dtype=np.uint8)
                 for f in ((1, *DCT_SCALES) if jpeg and self.scaled_decode else (1,))}
        mode = "RGBX" if jpeg else "RGB"
        recipe = self.recipe
        clock = time.perf_counter
        t0 = clock()
        payloads = reader.payloads(indices.tolist())
        t1 = clock()
        decoding = resizing = 0.0
        filters = ([Image.Resampling(PIL_FILTERS[int(c)]) for c in interp] if interp is not None
                   else [Image.Resampling.BILINEAR] * len(indices))
        paste = inputs is not None and "cut_start" in inputs
        for k, payload in enumerate(payloads):
            (y0, x0), (y1, x1) = start[k].tolist(), end[k].tolist()
            cut_h = cut_w = side
            if paste:
                assert inputs is not None
                (y0, x0), (y1, x1) = inputs["cut_start"][k].tolist(), inputs["cut_end"][k].tolist()
                cut_h, cut_w = (int(v) for v in inputs["cut_size"][k])
            most = max(cut_h, cut_w)
            factor = decode_scale(y1 - y0, x1 - x0, most, height, width) if len(tiles) > 1 else 1
            tile = tiles[factor]
            if factor > 1:
                decode_scaled(payload, tile, self.fast_idct)
            elif jpeg:
                decode_jpeg(payload, tile, self.fast_idct, pixels="RGBX")
            else:
                reader.codec.decode(payload, tile)
            t2 = clock()
            picture = Image.frombuffer(mode, (tile.shape[1], tile.shape[0]), tile, "raw", mode, 0, 1)
            sy, sx = tile.shape[0] / height, tile.shape[1] / width  # the window, in decoded pixels
            resized = picture.resize((cut_w, cut_h), filters[k],
                                     box=(x0 * sx, y0 * sy, x1 * sx, y1 * sy))
            if recipe is not None:  # timed with the resize: the same threads' pixel work
                resized = host_ops.apply(resized, host_ops.sample(inputs or {}, k), recipe)
            pixels = np.frombuffer(resized.tobytes("raw", "RGB"), np.uint8).reshape(cut_h, cut_w, 3)
            if paste:
                assert inputs is not None
                py, px = (int(-v) for v in inputs["paste_anchor"][k])
                out[k] = self.fill
                fit_h, fit_w = max(0, min(cut_h, side - py)), max(0, min(cut_w, side - px))
                out[k, py : py + fit_h, px : px + fit_w] = pixels[:fit_h, :fit_w]
            else:
                out[k] = pixels
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


def decode_scale(window_h: float, window_w: float, side: int, height: int, width: int) -> int:
    """The largest of 8, 4, 2 (else 1) by which a ``height`` x ``width`` JPEG can be scaled
    down in decoding while a window of ``window_h`` x ``window_w`` tile pixels still spans at
    least ``side`` decoded pixels each way: the resize after it then never enlarges, so the
    pixels stay close to those of a full decode resized (``tilefeed bench loader --sizes``)."""
    for factor in DCT_SCALES:
        scaled_h, scaled_w = -(-height // factor), -(-width // factor)  # libjpeg rounds up
        if window_h * scaled_h / height >= side and window_w * scaled_w / width >= side:
            return factor
    return 1


def decode_scaled(payload: Any, out: np.ndarray, fast_idct: bool = False) -> np.ndarray:
    """A JPEG tile decoded as RGBX straight into ``out``, whose shape picks the DCT scale
    (ceil(tile / factor) a side, what libjpeg-turbo makes at 1/factor); GIL released."""
    import simplejpeg

    decoded = simplejpeg.decode_jpeg(payload, "RGBX", fastdct=fast_idct, min_height=out.shape[0],
                                     min_width=out.shape[1], buffer=out)
    if decoded.shape != out.shape:
        raise ValueError(f"a JPEG tile decoded to {decoded.shape} at reduced scale, expected {out.shape}")
    return decoded  # type: ignore[no-any-return]
