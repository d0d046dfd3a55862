"""Built DALI graphs, kept for reuse by the next Loader with the same settings.

Building, running and dropping a DALI pipeline leaves native memory behind (measured here at
30-70 KB per pipeline on the CPU, steadily, while Python objects, threads and files stay flat),
so a process that creates a Loader per epoch, per evaluation or per trial grows until it dies.
A graph is therefore never dropped while it can serve again: an epoch left early is drained
(the source stops, DALI finishes the few batches it has in flight) and the graph goes back to
a small pool keyed by everything that shapes it. A few idle graphs (``MAX_IDLE``) bound the
threads and memory the pool holds.

Where the output is the stored tiles on the CPU (uint8 NHWC at the tile's size), a graph is the
batch source alone, with no DALI pipeline: DALI would only copy each batch.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from tilefeed.pipeline.augment import Augment
from tilefeed.pipeline.reader import StoreReader
from tilefeed.pipeline.source import BatchSource, Epoch

MAX_IDLE = 4
_idle: dict[Hashable, list[Graph]] = {}
_lock = threading.Lock()


@dataclass
class Graph:
    """A DALI pipeline, the batch source feeding it and the torch iterator over it; or, where
    DALI would only copy (``pipe`` None: see ``take``), the source alone."""

    source: BatchSource
    pipe: Any
    iterator: Any = None
    clean: bool = field(default=False)  # ended its last epoch: arm() may reset it
    closed: bool = field(default=False)

    def arm(self, reader: StoreReader, epoch: Epoch, first_batch: int, then: Epoch | None) -> Any:
        """Start ``epoch`` (``then``: the one expected after it); returns the iterator to draw
        batches from."""
        self.source.reader = reader
        self.source.start(epoch, first_batch, then)
        if self.iterator is None:  # the iterator prefetches as it is made: after start()
            if self.pipe is None:
                self.iterator = HostBatches(self.source)
            else:
                from nvidia.dali.plugin.pytorch import DALIGenericIterator

                self.iterator = DALIGenericIterator([self.pipe], ["images", "labels", "indices"],
                                                    size=-1, auto_reset=False)
        else:
            self.iterator.reset()
        self.clean = False
        return self.iterator

    @property
    def alive(self) -> bool:
        """DALI shuts a pipeline down (``_pipe`` None) when the garbage collector finalises it,
        even while something still refers to it, e.g. a Loader dropped inside a reference cycle."""
        if self.closed:
            return False
        return self.pipe is None or getattr(self.pipe, "_pipe", None) is not None

    def drain(self) -> bool:
        """Stop mid-epoch and let DALI finish what it has in flight; True when reusable."""
        try:
            self.source.cancel()  # no further reads: the next call ends the epoch
            for _ in self.iterator:
                pass
        except Exception:  # noqa: BLE001 - a graph that cannot drain is closed, not reused
            return False
        self.clean = True
        return True

    def close(self) -> None:
        self.closed = True
        self.iterator = None
        self.pipe = None  # DALI joins its threads when the pipeline goes
        self.source.close()


@dataclass(frozen=True)
class Settings:
    """Everything beside the augmentation and the tile that shapes a graph."""

    batch_size: int
    threads: int  # the Loader's num_workers: DALI's CPU threads, and the reader threads' share
    prefetch: int
    device_id: int | None


def key(reader: StoreReader, augment: Augment, settings: Settings) -> Hashable:
    return (augment, reader.codec.shape, reader.is_image_coded, settings)


def take(reader: StoreReader, augment: Augment, settings: Settings) -> Graph:
    """An idle graph with these settings, or a new one."""
    with _lock:
        idle = _idle.get(key(reader, augment, settings))
        while idle:
            graph = idle.pop()
            if graph.alive:
                return graph
    s = settings
    if s.device_id is None and augment.stored_tiles:
        # the output is the stored tiles: a DALI graph would only copy each batch into memory
        # of its own; the reader threads decompress or decode straight into arrays handed to
        # the caller
        return Graph(BatchSource(reader, s.batch_size, s.threads, ahead=s.threads + 2,
                                 dali_depth=0, handed_out=True, fast_idct=augment.fast_idct),
                     pipe=None)
    from tilefeed.pipeline.graph import build_pipeline  # DALI: imported when a graph is first needed

    # on the CPU, tiles are decoded, cut and resized by the reader threads (pillow-simd: several
    # times DALI's CPU resize, `tilefeed bench parts`); on a GPU the graph does it on the device
    host_resize = s.device_id is None and augment.windows
    # measured on 2 cores: one reader thread beside DALI's for lossless tiles (more only
    # contend), one per worker where the readers decode JPEG
    readers = s.threads if host_resize and reader.is_image_coded else max(1, s.threads // 2)
    source = BatchSource(reader, s.batch_size, readers, ahead=readers + 1, dali_depth=s.prefetch,
                         resize_to=augment.size if host_resize else None,
                         fast_idct=augment.fast_idct)
    pipe = build_pipeline(source, augment, batch_size=s.batch_size, threads=s.threads,
                          device_id=s.device_id, prefetch=s.prefetch,
                          jpeg=reader.is_image_coded and not source.decodes)
    pipe.build()
    return Graph(source, pipe)


class HostBatches:
    """For a graph without DALI: the batch source's batches as the DALI iterator gives them."""

    def __init__(self, source: BatchSource) -> None:
        self.source = source

    def __iter__(self) -> HostBatches:
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        images, labels, indices, *_ = self.source()  # StopIteration ends the epoch
        return [{"images": torch.from_numpy(images), "labels": torch.from_numpy(labels),
                 "indices": torch.from_numpy(indices.copy())}]

    def reset(self) -> None:
        """Nothing to reset: the source's ``start()`` arms the next epoch."""


def give(graph_key: Hashable, graph: Graph) -> None:
    """Return a graph after use: kept when it is clean and the pool has room, else closed.

    A kept graph ends its reader threads (``start()`` makes new ones) and forgets the store;
    only DALI's own worker threads stay parked with it."""
    if graph.alive and (graph.iterator is None or graph.clean or graph.drain()):
        graph.source.close()
        graph.source.reader = None  # type: ignore[assignment]  # the store is the Loader's, not the pool's
        with _lock:
            if sum(len(v) for v in _idle.values()) < MAX_IDLE:
                _idle.setdefault(graph_key, []).append(graph)
                return
    graph.close()


def clear() -> None:
    """Close every idle graph (their threads go with them)."""
    with _lock:
        graphs = [g for v in _idle.values() for g in v]
        _idle.clear()
    for g in graphs:
        g.close()
