"""The hand-over: batches made ready ahead, epoch after epoch, so ``next()`` only takes one.

A DALI pipeline runs on a thread of its own (``Feed``): it turns each output into torch tensors
the caller owns and queues them. On the CPU those are DALI's output buffers themselves, which
DALI's executor never writes again while a reference to them lives (a pass-through check makes
sure none is a ring slot the batch source reuses); on a GPU, one device copy into torch's memory
on a side stream, with the per-batch work there too (``cuda.SideStream``). The
consumer's ``next()`` takes the batch waiting there. The stream of batches does not stop at the end of an
epoch: the epochs expected next follow in the same stream (``BatchSource``), so the first batch
of an epoch is as ready as any other. Arming an epoch the stream does not continue into (another
number, a resumed position, a different order, another output size) starts a new generation, and whatever was
prepared for the old one is dropped by its tag.

Without a DALI pipeline (stored tiles on the CPU), the reader threads' fresh arrays are the
batches and the consumer takes them straight from the source.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.engine.batch_source import BatchSource, Epoch, Tag
from tilefeed.pipeline.engine.cuda import SideStream

Outputs = dict[str, Any]  # images, labels and indices as tensors; a batch's targets
# Woken by a hand-over, the feeding thread waits this long before it runs the graph: DALI's
# run holds the GIL for stretches (feeding its inputs from Python), and begun at once it keeps
# the consumer inside next() for as long (`tilefeed bench`'s hand-over wait shows it).
HANDOVER_GRACE = 0.002
NAMES = ("images", "labels", "indices")
Following = Sequence[Epoch] | Callable[[], Sequence[Epoch]]
_running: weakref.WeakSet[Feed] = weakref.WeakSet()


@dataclass
class _Failure:
    error: BaseException


class SupersededError(RuntimeError):
    """An iterator of an epoch the Loader has since left for another ``iter()``."""


class Feed:
    """Arms epochs on a graph and hands its batches over ready (see the module's docstring)."""

    def __init__(self, source: BatchSource, pipe: Any, device_id: int | None) -> None:
        self.source, self.pipe = source, pipe
        self.device = torch.device("cuda", device_id) if device_id is not None else None
        self.cast: torch.dtype | None = None  # images converted to this dtype before hand-over
        self.generation = 0
        self.broken = False
        self._position: tuple[int, int] | None = None  # (epoch, batch) the consumer gets next
        self._epochs: dict[int, Epoch] = {}  # the current stream's epochs, by number
        self._later: tuple[int, Callable[[], Sequence[Epoch]]] | None = None  # see arm
        self._asked_early = False  # the last next() came before its batch was ready
        # the hand-over: at most one batch waits here; the thread asks DALI for the next only
        # once it is taken, so no finished batch sits in the thread's hands besides DALI's queue
        self._ready: deque[tuple[Tag, Outputs, Any] | _Failure] = deque()
        self._handed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._side: SideStream | None = None  # a GPU's, made on the feeding thread

    def arm(self, epoch: Epoch, first_batch: int, following: Following,
            cast: torch.dtype | None = None, timed: bool = True) -> int:
        """Deliver ``epoch`` from ``first_batch`` on, then ``following``; returns the generation
        whose batches ``next`` hands over. A stream that already continues into exactly this
        is kept (its first batches may be ready); anything else starts a new generation.
        ``following`` may be a function giving them: a kept stream then asks for them on the
        feeding thread, once the epoch's first batch is handed over, so working out the next
        epoch's order is not on the consumer's clock. ``timed``: batches carry their stage
        times (``pipeline.stats``)."""
        self.source.timed = timed
        known = self._epochs.get(epoch.number)
        keep = (self._position == (epoch.number, first_batch) and known is not None
                and known.same(epoch) and cast == self.cast and not self.broken)
        if keep and callable(following) and self.pipe is not None:
            self._epochs = {n: e for n, e in self._epochs.items() if n >= epoch.number}
            with self.source.lock:
                self._later = (self.generation, following)
                self.source.lock.notify_all()
            following = ()
        elif keep:
            following = following() if callable(following) else following
            self._epochs = {n: e for n, e in self._epochs.items() if n >= epoch.number}
            self.source.extend(following)
        else:
            following = following() if callable(following) else following
            self.cast = cast
            self._epochs = {}
            self.generation = self.source.restart(epoch, first_batch, following)
            self._position = (epoch.number, first_batch)
            self._clear()
        self._epochs.update({e.number: e for e in (epoch, *following)})
        if self.pipe is not None and (self._thread is None or not self._thread.is_alive()):
            self._closing = False
            self._thread = threading.Thread(target=self._drive, name="tilefeed-feed", daemon=True)
            self._thread.start()
            _running.add(self)
        return self.generation

    def next(self, generation: int) -> tuple[Tag, Outputs]:
        """The next batch of ``generation`` and its tag, on the consumer's thread."""
        if generation != self.generation:
            raise SupersededError("this iterator's epoch was left: the Loader was iterated again "
                                  "(iter()) before it ended; use one iterator at a time")
        if self.pipe is None:
            try:
                tag, (images, labels, indices, *_) = self.source.take()
            except BaseException:
                self._fail()
                raise
            out = {"images": torch.from_numpy(images), "labels": torch.from_numpy(labels),
                   "indices": torch.from_numpy(indices.copy())}
            for work in tag.per_batch:
                work(out, tag.batch, tag.inputs)
            out.update(tag.carried)
        else:
            tag, out, ready = self._take()
            if ready is not None:  # a GPU batch: the consumer's stream starts after its work
                assert self._side is not None
                self._side.handed(out, ready, _tensors)  # images, labels, the targets' tensors
        self._position = (tag.epoch + 1, 0) if tag.last else (tag.epoch, tag.batch + 1)
        return tag, out

    def ready(self) -> int:
        """Batches ready beyond the one being handed over (the graph's own queue aside)."""
        return len(self._ready) + self.source.ready()

    def _take(self) -> tuple[Tag, Outputs, Any]:
        while True:
            with self._handed:
                self._asked_early = not self._ready
                while not self._ready:
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the Loader's feeding thread ended")
                    self._handed.wait(1.0)
                item = self._ready.popleft()
                self._handed.notify_all()
            if isinstance(item, _Failure):
                raise item.error
            if item[0].generation == self.generation:
                return item

    def _clear(self) -> None:
        with self._handed:  # a failure stays: the next take raises it
            kept = [item for item in self._ready if isinstance(item, _Failure)]
            self._ready = deque(kept[:1])
            self._handed.notify_all()

    # -- the feeding thread --------------------------------------------------------------------
    def _drive(self) -> None:
        pipe, source = self.pipe, self.source
        try:
            if self.device is not None:
                self._side = SideStream(self.device)
            elif _threads_are_per_thread():
                # the per-batch work here (casts, erasing, mixing) runs while the reader threads
                # hold the cores: fanned out over torch's intra-op threads it contends with them
                # and costs about a quarter more CPU an image (recipe bench, 2 cores). Under
                # OpenMP the setting is this thread's own; the caller's threads keep theirs.
                torch.set_num_threads(1)
            while True:
                with source.lock:
                    while not (source.has_work or self._later or self._closing):
                        source.lock.wait()
                with self._handed:
                    waited = bool(self._ready)
                    while self._ready and not self._closing:
                        self._handed.wait(0.1)
                if self._closing:
                    return
                if waited and not self._asked_early:
                    # the consumer just took a batch that was waiting for it, so the graph is
                    # ahead: let it leave next() first (when it waited, the graph is behind)
                    time.sleep(HANDOVER_GRACE)
                self._extend_later()
                if not source.has_work:
                    continue
                called, began = source.callback_seconds, time.perf_counter()
                try:
                    outputs = self._side.run(pipe) if self._side is not None else pipe.run()
                except StopIteration:  # the stream ran out: ready for the next one
                    pipe.reset()
                    continue
                ran = time.perf_counter()
                tag = source.fed.popleft()
                if tag.generation == source.generation:
                    item = (tag, *self._hand_over(outputs, tag))
                    if tag.timing is not None:  # the graph: DALI's time beyond the reads'
                        tag.timing.graph += ran - began - (source.callback_seconds - called)
                        tag.timing.copy += time.perf_counter() - ran
                    self._put(item)
                del outputs
                source.release(tag)  # its pixels were read in place until now
        except BaseException as error:  # noqa: BLE001 - every failure reaches the consumer
            self._fail()
            self._put(_Failure(error))

    def _extend_later(self) -> None:
        """The following epochs ``arm`` left for this thread, added to the stream it was for."""
        with self.source.lock:
            later, self._later = self._later, None
        if later is None:
            return
        generation, following = later
        epochs = following()
        # a newer arm may have restarted the stream meanwhile: then they are not its epochs
        if self.source.extend(epochs, generation):
            self._epochs.update({e.number: e for e in epochs})

    def _fail(self) -> None:
        """A read or the graph failed: nothing more is read (reads under way end first, so no
        thread still reads a store its caller may be about to mend or remove)."""
        self.broken = True
        self.source.stop()

    def _put(self, item: tuple[Tag, Outputs, Any] | _Failure) -> None:
        with self._handed:
            self._ready.append(item)
            self._handed.notify_all()

    def _hand_over(self, outputs: Sequence[Any], tag: Tag) -> tuple[Outputs, Any]:
        """The batch out of DALI as torch tensors, cast, with its epoch's per-batch operations
        applied (here, so that they overlap the consumer's step rather than add to its wait)."""

        def finish(out: Outputs) -> None:
            if self.cast is not None:
                out["images"] = out["images"].to(self.cast)
            for work in tag.per_batch:
                work(out, tag.batch, tag.inputs)
            out.update(tag.carried)

        if self._side is not None:
            return self._side.hand_over(outputs, self._host_tensor, finish, cast=self.cast is not None)
        out = {name: self._host_tensor(tl) for name, tl in zip(NAMES, outputs, strict=True)}
        finish(out)
        return out, None

    def _host_tensor(self, tl: Any) -> torch.Tensor:
        if tl.is_dense_tensor():
            array = np.asarray(tl.as_tensor())  # holds DALI's buffer for as long as it lives
            if array.size == 0 or not self.source.owns(array.ctypes.data):
                return torch.from_numpy(array)
        return torch.from_numpy(np.stack([np.array(tl[i]) for i in range(len(tl))]))

    # -- lifetime ------------------------------------------------------------------------------
    def park(self) -> bool:
        """End the stream and the feeding thread; True when the graph can serve again."""
        self.source.stop()
        thread, self._thread = self._thread, None
        self._position, self._epochs, self._later = None, {}, None
        if thread is not None:
            if thread is threading.current_thread():  # finalised on its own thread: cannot wait
                self._closing = True
                return False
            with self.source.lock:
                self._closing = True
                self.source.lock.notify_all()
            with self._handed:
                self._handed.notify_all()
            thread.join(timeout=60)
            if thread.is_alive():
                return False
        self._clear()
        return not self.broken


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a hand-over's entries: tensors, and dicts and lists of them (targets)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@atexit.register
def _stop_all() -> None:
    """A Loader never closed leaves its thread inside DALI at exit otherwise."""
    for feed in list(_running):
        feed.park()


@functools.cache
def _threads_are_per_thread() -> bool:
    """Whether torch's intra-op thread count is set per thread (its OpenMP backend); under the
    native backend ``set_num_threads`` would reach the whole process."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()
