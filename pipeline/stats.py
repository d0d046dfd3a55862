"""Where a running Loader's time goes, per stage, and which stage binds.

Every batch carries a ``Timing``: the reader threads add what they spent reading and checking,
decompressing or decoding, cutting and resizing, and waiting for a bucket's downloads; the
feeding thread adds the graph (the time it waited for DALI beyond waiting for the reads) and
the hand-over copy; the Loader adds the consumer's wait when the batch is handed over. Stages
run on different resources, so each is judged by how busy it kept its own: host stages by the
reader threads' time, the graph and the copy by the feeding thread's. The stage named is the
busiest one measured, and only when the consumer waited at all (else "not input-bound").
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

HOST_STAGES = ("read", "decode", "resize", "download")  # on the reader threads
FEED_STAGES = ("graph", "copy")  # on the feeding thread
STAGES = (*HOST_STAGES, *FEED_STAGES)
INPUT_BOUND = 0.05  # the consumer waited at least this share of its time
_current = threading.local()


@dataclass
class Timing:
    """One batch: seconds per stage (host stages summed over its tiles), bytes read."""

    read: float = 0.0
    decode: float = 0.0
    resize: float = 0.0
    download: float = 0.0
    graph: float = 0.0
    copy: float = 0.0
    nbytes: int = 0
    # samples read and decoded in one pass, whose stored bytes are counted when figures are
    # asked for rather than on the reading thread (``Recorder.stored_nbytes``)
    stored: np.ndarray | None = None


def charge(stage: str, seconds: float) -> None:
    """Add ``seconds`` to ``stage`` of the batch the calling reader thread is reading, if any
    (for code below the source, such as a bucket store's shard downloads)."""
    timing = getattr(_current, "timing", None)
    if timing is not None:
        setattr(timing, stage, getattr(timing, stage) + seconds)


class Reading:
    """``with Reading(timing):`` marks the calling thread as reading that batch."""

    def __init__(self, timing: Timing | None) -> None:
        self.timing = timing

    def __enter__(self) -> None:
        _current.timing = self.timing

    def __exit__(self, *exc: object) -> None:
        _current.timing = None


@dataclass(frozen=True)
class Figures:
    """A stretch of batches: the consumer's time, its wait, and each stage's busy share."""

    batches: int
    seconds: float  # the consumer's time from before the first batch to the last hand-over
    wait: float  # share of it spent waiting for batches
    busy: dict[str, float]  # stage -> share of its resource's time (reader threads, feed thread)
    stage_seconds: dict[str, float]
    bytes_read: int
    ready_ahead: float  # median batches ready beyond the one handed over


@dataclass(frozen=True)
class LoaderStats:
    """``Loader.stats()``: the last batches and the epoch so far, and the stage that binds."""

    last: Figures
    epoch: Figures
    bottleneck: str  # a stage of STAGES, or "step" when the consumer hardly waited
    advice: str
    cache: dict[str, int] | None = None  # a bucket store's shard cache, since the store opened:
    # shards found there ("hits"), shards downloaded and their bytes
    selected: tuple[int, int] | None = None  # Loader(where=...): samples that passed, of the store's

    def __str__(self) -> str:
        rows = ["| figure | last batches | epoch |", "| --- | ---: | ---: |",
                f"| batches | {self.last.batches} | {self.epoch.batches} |",
                f"| consumer waited | {self.last.wait:.1%} | {self.epoch.wait:.1%} |"]
        for stage in STAGES:
            rows.append(f"| {stage} busy | {self.last.busy[stage]:.0%} | {self.epoch.busy[stage]:.0%} |")
        ahead = f"| batches prepared ahead (median) | {self.last.ready_ahead:g} | {self.epoch.ready_ahead:g} |"
        rows += [ahead,
                 f"| MB read | {self.last.bytes_read / 1e6:.1f} | {self.epoch.bytes_read / 1e6:.1f} |"]
        if self.cache is not None:
            c = self.cache
            rows.append(f"| bucket shards: found in the cache / downloaded (MB) | "
                        f"{c['hits']} / {c['downloads']} ({c['downloaded_bytes'] / 1e6:.1f}) | |")
        if self.selected is not None:
            rows.append(f"| samples that passed where= | {self.selected[0]} of {self.selected[1]} | |")
        return "\n".join(rows) + f"\nbottleneck: {self.bottleneck}: {self.advice}"


@dataclass
class _Handed:
    timing: Timing
    wait: float
    interval: float  # the consumer's time since the previous hand-over (or the epoch's start)
    ready: int


KEPT = 1000  # batches a Recorder remembers beyond the epoch's totals


@dataclass
class Recorder:
    """The Loader's side: one entry per batch handed over, the last ``KEPT`` and the epoch."""

    reader_threads: int
    stored_nbytes: Callable[[np.ndarray], int]  # bytes samples occupy in the store
    _last: deque[_Handed] = field(default_factory=lambda: deque(maxlen=KEPT))
    _epoch: list[_Handed] = field(default_factory=list)
    _mark: float = 0.0

    def epoch_begins(self) -> None:
        self._epoch = []
        self._mark = time.perf_counter()

    def handed(self, timing: Timing | None, wait: float, ready: int) -> None:
        now = time.perf_counter()
        entry = _Handed(timing or Timing(), wait, now - self._mark, ready)
        self._mark = now
        self._last.append(entry)
        self._epoch.append(entry)

    def figures(self, entries: list[_Handed]) -> Figures:
        seconds = sum(e.interval for e in entries)
        totals = {s: sum(getattr(e.timing, s) for e in entries) for s in STAGES}
        span = max(seconds, 1e-9)
        busy = {s: totals[s] / (span * (self.reader_threads if s in HOST_STAGES else 1))
                for s in STAGES}
        return Figures(batches=len(entries), seconds=seconds,
                       wait=sum(e.wait for e in entries) / span, busy=busy, stage_seconds=totals,
                       bytes_read=sum(e.timing.nbytes + (0 if e.timing.stored is None else
                                                          self.stored_nbytes(e.timing.stored))
                                      for e in entries),
                       ready_ahead=statistics.median(e.ready for e in entries) if entries else 0.0)

    def report(self, advise: Advice, window: int, cache: dict[str, int] | None = None) -> LoaderStats:
        """The last ``window`` batches (at most ``KEPT``) and the epoch so far."""
        last = self.figures(list(self._last)[-window:])
        epoch = self.figures(self._epoch)
        basis = last if last.batches else epoch
        bottleneck = name_bottleneck(basis)
        return LoaderStats(last, epoch, bottleneck, advise(bottleneck, basis),
                           None if cache is None else dict(cache))


def name_bottleneck(f: Figures) -> str:
    """The busiest stage, when the consumer waited; "step" when it hardly did."""
    if f.batches == 0 or f.wait < INPUT_BOUND:
        return "step"
    return max(STAGES, key=lambda s: f.busy[s])


class Advice:
    """The one change most likely to help, given the Loader's settings.

    The settings come as facts (``global_shuffle``: the order is a global shuffle;
    ``transposes``: the layout is NCHW, transposed in the graph), not as the ``Shuffle`` and
    ``Layout`` members: this module sits below the modules that define them.
    """

    def __init__(self, *, workers: int, cores: int, jpeg: bool, bucket: bool, global_shuffle: bool,
                 transposes: bool, gpu: bool) -> None:
        self.workers, self.cores, self.jpeg, self.bucket = workers, cores, jpeg, bucket
        self.global_shuffle, self.transposes, self.gpu = global_shuffle, transposes, gpu

    def __call__(self, bottleneck: str, f: Figures) -> str:
        more = (f"more workers: num_workers={min(self.cores, 2 * self.workers)} (now "
                f"{self.workers}, {self.cores} cores)" if self.workers < self.cores else "")
        if bottleneck == "step":
            return (f"not input-bound: the consumer waited {f.wait:.1%} of its time; the step "
                    "itself is what to speed up")
        if bottleneck == "download":
            return ('shuffle="shard" (whole shards, read in order)' if self.global_shuffle
                    else "a larger cache (cache_limit) or a faster link to the bucket")
        if bottleneck in ("read", "decode", "resize"):
            if more:
                return more
            if bottleneck == "decode" and self.jpeg and not self.gpu:
                return "a GPU (nvJPEG decodes the JPEG tiles), or a lossless store"
            return ("a JPEG store (less to read)" if bottleneck == "read" and not self.jpeg
                    else "a smaller output size, or a machine with more cores")
        if bottleneck in ("graph", "copy"):
            if self.transposes and not self.gpu:
                return 'layout="channels_last" (no transpose in the graph)'
            return more or "a GPU for the graph's work"
        return more or "nothing measured binds"
