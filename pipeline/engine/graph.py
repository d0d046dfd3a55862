"""A graph: the batch source and the DALI pipeline it feeds, run by a ``Feed``; built here.

Where the output is the stored tiles on the CPU (uint8 NHWC at the tile's size, a size that
cannot change), a graph is the batch source alone, with no DALI pipeline: DALI would only copy
each batch. The device's graph shape (``GraphSettings.device_graph``) never takes that road.
The DALI pipeline's operators are ``engine.graph_ops``', imported when a graph is first built,
so reading a store, planning epochs and the torch-side tools never load DALI. Idle graphs are
kept for the next Loader by ``engine.graph_pool``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.batch_source import BatchSource, Epoch
from tilefeed.pipeline.engine.operations import inputs
from tilefeed.pipeline.engine.feed import Feed, Following
from tilefeed.pipeline.reading.protocol import Reader
from tilefeed.pipeline.recipe import host_ops


@dataclass
class Graph:
    """A DALI pipeline and the batch source feeding it, run by a ``Feed``; or, where DALI would
    only copy (``pipe`` None: see ``take``), the source alone."""

    source: BatchSource
    pipe: Any
    device_id: int | None = None
    feed: Feed = field(init=False)
    closed: bool = field(default=False)

    def __post_init__(self) -> None:
        self.feed = Feed(self.source, self.pipe, self.device_id)

    @property
    def lookahead(self) -> int:
        """Batches the graph holds prepared ahead of the consumer, at most."""
        return self.source.ahead + (self.pipe.prefetch_queue_depth + 2 if self.pipe is not None else 0)

    def arm(self, reader: Reader, epoch: Epoch, first_batch: int, following: Following,
            cast: torch.dtype | None = None, timed: bool = True) -> int:
        """Deliver ``epoch`` from ``first_batch`` on, then ``following``; returns the generation
        to ask ``feed.next`` for."""
        self.source.reader = reader
        return self.feed.arm(epoch, first_batch, following, cast, timed)

    @property
    def alive(self) -> bool:
        """DALI shuts a pipeline down (``_pipe`` None) when the garbage collector finalises it,
        even while something still refers to it, e.g. a Loader dropped inside a reference cycle."""
        if self.closed or self.feed.broken:
            return False
        return self.pipe is None or getattr(self.pipe, "_pipe", None) is not None

    def park(self) -> bool:
        """Stop feeding; True when the graph can serve another Loader."""
        return self.feed.park() and self.alive

    def close(self) -> None:
        self.closed = True
        self.feed.park()
        self.pipe = None  # DALI joins its threads when the pipeline goes
        self.source.close()


@dataclass(frozen=True)
class GraphSettings:
    """Everything beside the augmentation and the tile that shapes a graph."""

    batch_size: int
    threads: int  # the Loader's num_workers: DALI's CPU threads, and the reader threads' share
    prefetch: int
    device_id: int | None
    # the graph a GPU builds, on DALI's CPU backend (``pipeline.device.device_graph``): the
    # reader threads only read, the graph decodes, cuts, resizes and applies the recipe
    device_graph: bool = False

    @property
    def host_resize(self) -> bool:
        """The reader threads cut and resize training windows (pillow-simd: several times DALI's
        CPU resize, `tilefeed bench parts`): on the CPU, unless the device's graph is asked."""
        return self.device_id is None and not self.device_graph


def build(reader: Reader, augment: Augment, settings: GraphSettings, direct: bool = False) -> Graph:
    """A new graph for ``reader``'s tiles, ``augment`` and ``settings``. ``direct``: the output
    is the stored tiles at their size, always (no DALI pipeline; on the CPU only)."""
    s = settings
    if s.host_resize and direct:
        # the output is the stored tiles: a DALI graph would only copy each batch into memory
        # of its own; the reader threads decompress or decode straight into arrays handed to
        # the caller
        return Graph(BatchSource(reader, s.batch_size, s.threads, ahead=s.threads + 2,
                                 dali_depth=0, handed_out=True, fast_idct=augment.fast_idct,
                                 scaled_decode=augment.scaled_decode),
                     pipe=None)
    from tilefeed.pipeline.engine.graph_ops import build_pipeline  # DALI: imported when a graph is first built

    # on the CPU, tiles are decoded, cut and resized by the reader threads; on a GPU (or in the
    # device's shape) the graph does it
    host_resize = s.host_resize and augment.windows
    # one reader thread beside DALI's for lossless tiles (more only contend for the cores;
    # `tilefeed bench sweep --over workers`), one per worker where the readers decode JPEG or
    # apply a recipe's pixel operations (recipe.host_ops: the graph then only normalises;
    # torchvision's ResNet-50 recipe on 2 cores, 1,560 against 1,490 img/s)
    recipe = augment.recipe if augment.train else None
    busy = reader.is_image_coded or host_ops.applies(recipe)
    readers = s.threads if host_resize and busy else max(1, s.threads // 2)
    source = BatchSource(reader, s.batch_size, readers, ahead=readers + 1, dali_depth=s.prefetch,
                         host_resize=host_resize, fast_idct=augment.fast_idct,
                         scaled_decode=augment.scaled_decode, inputs=inputs(augment),
                         recipe=recipe, pinned=s.device_id is not None)
    pipe = build_pipeline(source, augment, batch_size=s.batch_size, threads=s.threads,
                          device_id=s.device_id, prefetch=s.prefetch,
                          jpeg=reader.is_image_coded and not source.decodes)
    pipe.build()
    return Graph(source, pipe, s.device_id)
