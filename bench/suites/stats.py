"""``tilefeed bench stats``: what ``Loader.stats()`` costs, and whether its advice helps.

Two measurements, each side by side in one run:

- overhead: a training Loader's samples/s with its per-stage clocks on and off, in interleaved
  rounds (medians and ranges), so the cost of ``stats=True`` is a measured figure;
- advice: a Loader made decode-bound on purpose (a JPEG store, one worker, training on the
  CPU) against a step; its stats name the stage that binds and the change to make; the run
  is repeated with that change applied (``num_workers``), and both stalls are reported.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tilefeed.bench.harness.sides import Figure, range_text
from tilefeed.bench.harness.watch import measure
from tilefeed.bench.harness.steps import EmulatedStep
from tilefeed.pipeline import Loader

EPOCHS = 3  # timed per round, after a warm-up epoch: long enough to rise above the timer noise


@dataclass
class StatsOverhead:
    """samples/s and CPU microseconds per sample per round, with the stats clocks on and off."""

    on: list[float]
    off: list[float]
    cpu_us_on: list[float]
    cpu_us_off: list[float]
    cost: float  # 1 - median samples/s on / off
    cpu_cost: float  # median CPU per sample on / off - 1
    paired: list[float]  # each round's 1 - on / off


@dataclass
class StatsResult:
    """Both measurements: ``overhead``, and ``advice``'s runs (``before`` and, when the advice
    named a worker count, ``after``: each its ``workers``, ``stall``, ``bottleneck``, ``advice``
    and the stats' text)."""

    overhead: StatsOverhead
    advice: dict[str, dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """The overhead's table, the decode-bound Loader's stats and the runs before and after."""
        o = self.overhead
        lines = ["stats overhead (training Loader, medians of "
                 f"{len(o.on)} interleaved rounds):",
                 "| stats | samples/s | range | CPU us/sample | range |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        for name, v, c in (("on", o.on, o.cpu_us_on), ("off", o.off, o.cpu_us_off)):
            lines.append(f"| {name} | {Figure(v).cells('.0f')} | {Figure(c).cells('.1f')} |")
        paired = range_text(Figure(o.paired).bounds, "+.1%", " to ")
        lines.append(f"cost: {o.cost:+.2%} of samples/s (paired rounds {paired}), "
                     f"{o.cpu_cost:+.2%} of CPU per sample")
        a = self.advice
        lines += ["", "decode-bound on purpose (JPEG store, one worker, train, CPU):",
                  a["before"]["stats"], "", "| run | workers | stall | bottleneck |",
                  "| --- | ---: | ---: | --- |"]
        for name in ("before", "after"):
            if name in a:
                r = a[name]
                lines.append(f"| {name} | {r['workers']} | {r['stall']:.1%} | {r['bottleneck']} |")
        if "after" not in a:
            lines.append("the advice names no worker count to apply: " + a["before"]["advice"])
        return "\n".join(lines)


def _rates(store: Path, batch_size: int, workers: int, stats: bool) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample over all the process's threads)."""
    with Loader(store, batch_size, train=True, num_workers=workers, stats=stats) as loader:
        for _batch in loader:  # warm-up epoch: the graph, the page cache, the allocator
            pass
        began, cpu, samples = time.perf_counter(), time.process_time(), 0
        for _ in range(EPOCHS):
            for images, _labels in loader:
                samples += len(images)
        return (samples / (time.perf_counter() - began),
                1e6 * (time.process_time() - cpu) / samples)


def overhead(store: Path, *, batch_size: int, workers: int, rounds: int) -> StatsOverhead:
    """samples/s and CPU per sample with stats on and off, alternating round by round; the
    CPU time is the steadier figure on a shared machine (other tenants slow the wall clock)."""
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for _ in range(rounds):
        on.append(_rates(store, batch_size, workers, True))
        off.append(_rates(store, batch_size, workers, False))

    rate_on, rate_off = Figure([r[0] for r in on]), Figure([r[0] for r in off])
    cpu_on, cpu_off = Figure([r[1] for r in on]), Figure([r[1] for r in off])
    return StatsOverhead(on=rate_on.rounds, off=rate_off.rounds, cpu_us_on=cpu_on.rounds,
                         cpu_us_off=cpu_off.rounds, cost=1 - rate_on.median / rate_off.median,
                         cpu_cost=cpu_on.median / cpu_off.median - 1,
                         paired=[1 - a[0] / b[0] for a, b in zip(on, off, strict=True)])


def advice(jpeg_store: Path, *, batch_size: int, step_ms: float, steps: int) -> dict[str, dict[str, Any]]:
    """A decode-bound Loader's stats, and the stall before and after its advice is applied."""
    step = EmulatedStep(step_ms, torch.device("cpu"))
    runs: dict[str, dict[str, Any]] = {}
    workers = 1
    with Loader(jpeg_store, batch_size, train=True, num_workers=workers, device="cpu") as loader:
        before = measure(loader, step, steps=steps, name="one worker", device="cpu")
        stats = loader.stats()
    runs["before"] = {"workers": workers, "stall": before.stall_fraction,
                      "bottleneck": stats.bottleneck, "advice": stats.advice, "stats": str(stats)}
    asked = re.search(r"num_workers=(\d+)", stats.advice)
    if asked:
        workers = int(asked.group(1))
        with Loader(jpeg_store, batch_size, train=True, num_workers=workers, device="cpu") as loader:
            after = measure(loader, step, steps=steps, name="as advised", device="cpu")
            stats = loader.stats()
        runs["after"] = {"workers": workers, "stall": after.stall_fraction,
                         "bottleneck": stats.bottleneck, "advice": stats.advice, "stats": str(stats)}
    return runs



def bench_stats(store: Path, jpeg_store: Path, *, batch_size: int, workers: int, rounds: int,
                step_ms: float, steps: int) -> StatsResult:
    """Both measurements: the overhead on ``store``, the advice on ``jpeg_store`` (the same
    pictures as JPEG tiles)."""
    return StatsResult(overhead=overhead(store, batch_size=batch_size, workers=workers, rounds=rounds),
                       advice=advice(jpeg_store, batch_size=batch_size, step_ms=step_ms, steps=steps))
