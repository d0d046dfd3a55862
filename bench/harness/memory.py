"""Host and GPU memory: peaks of the whole process tree, per-step samples, steady-growth test."""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

import psutil


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(resident, anonymous) bytes of ``proc`` and all its descendants (loader workers included).

    Anonymous = resident minus file-backed and shared pages: mapped shards and page cache count
    as resident when touched, but they are not what a leak or a retained graph grows.
    """
    rss = anon = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                m = p.memory_info()
            except psutil.Error:
                continue  # a worker that just exited
            rss += m.rss
            anon += m.rss - getattr(m, "shared", 0)
    except psutil.Error:
        pass
    return rss, anon


class MemorySampler:
    """Samples the process tree's RSS on a background thread, so the loop pays nothing per step."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak = 0  # resident bytes
        self.latest = 0  # anonymous bytes, the series a growth test reads
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tilefeed-memory", daemon=True)

    def _run(self) -> None:
        while True:
            rss, self.latest = tree_rss(self._proc)
            self.peak = max(self.peak, rss)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> MemorySampler:
        self.peak, self.latest = tree_rss(self._proc)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Growth:
    steady: bool
    growth_mb: float
    detail: str


def steady_growth(samples_mb: list[float], min_growth_mb: float = 64.0) -> Growth:
    """Steady growth (a leak, a retained graph) rather than warm-up or one peak: each quarter of
    the run sits higher than the one before, the last half still rises at least half as fast as
    the first, and the total rise is at least ``min_growth_mb`` and 10% (allocator arenas of
    DALI's threads and pools filling up move by less than that in a run and then level off)."""
    if len(samples_mb) < 8:
        return Growth(False, 0.0, "too few steps to judge memory growth")
    q = len(samples_mb) // 4
    quarters = [statistics.median(samples_mb[i * q : (i + 1) * q]) for i in range(4)]
    rise = quarters[-1] - quarters[0]
    rising = all(b > a for a, b in zip(quarters, quarters[1:], strict=False))
    sustained = quarters[3] - quarters[2] >= 0.5 * (quarters[1] - quarters[0])
    steady = rising and sustained and rise >= max(min_growth_mb, 0.10 * quarters[0])
    detail = ("anonymous host memory grows steadily: quarter medians " +
              " -> ".join(f"{v:.0f}" for v in quarters) + " MB")
    return Growth(steady, rise, detail if steady else "no steady host-memory growth")
