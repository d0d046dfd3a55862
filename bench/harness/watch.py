"""Data-loader wait against step time: ``watch`` any loop, or ``measure`` a loader and a step.

Per iteration the harness records the wait (time blocked getting the next batch), the
host-to-device copy when the loader yields host tensors, and the step. The first batch of each
epoch is reported apart from the rest (``epoch_start_wait_ms`` against ``handover_median_ms``):
a loader that starts every epoch cold hides a long wait there among many short ones. On a GPU the step is
timed with CUDA events recorded around it and read once at the end (no synchronisation inside
the loop); the device-side wait is then the idle gap between one step's end and the next one's
start. Warm-up iterations are excluded from every figure and reported separately.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tilefeed.pipeline.device import default_device
from tilefeed.bench.harness.memory import MemorySampler, steady_growth

Step = Callable[[torch.Tensor, torch.Tensor], Any]


@dataclass
class RunResult:
    """The figures of one measured run, from ``watch(...).result()`` or ``measure``.

    Attributes
    ----------
    loader : str
        The name the run was measured under.
    batch_size, samples, steps, warmup : int
        The batch size, samples and steps measured, and the warm-up steps left out.
    wait_s, step_s, wall_s : float
        Seconds waiting for batches, in the step, and in all (warm-up excluded).
    stall_fraction : float
        ``wait_s / wall_s``: the share of the time the step waited for its batch.
    samples_per_s, busy_fraction : float
        Samples per second of wall-clock, and the share of it the step ran.
    wait_median_ms, wait_p95_ms, handover_median_ms : float
        The wait per batch, and the median wait for batches other than an epoch's first.
    epoch_start_wait_ms : list of float
        The wait for the first batch of each epoch measured.
    peak_rss_mb, gpu_max_allocated_mb, gpu_max_reserved_mb : float
        Peak memory of the process tree, and of the GPU (None without one).
    extra : dict
        More per run; a tilefeed Loader's ``stats()`` under ``"stages"``.
    """

    loader: str
    batch_size: int
    samples: int
    steps: int
    warmup: int
    wait_s: float
    step_s: float
    wall_s: float
    stall_fraction: float
    samples_per_s: float
    busy_fraction: float
    h2d_s: float
    wait_median_ms: float
    wait_p95_ms: float
    handover_median_ms: float  # the wait for batches other than an epoch's first
    epoch_start_wait_ms: list[float]  # the wait for the first batch of each epoch measured
    step_median_ms: float
    step_p95_ms: float
    warmup_s: float
    peak_rss_mb: float
    gpu_max_allocated_mb: float | None
    gpu_max_reserved_mb: float | None
    memory_growth: bool
    memory_note: str
    output: dict[str, Any] = field(default_factory=dict)  # shape, dtype, device of the images
    timeline: dict[str, list[float]] = field(default_factory=dict)  # per step: wait, step, memory
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def note(self) -> str:
        """A word on what the stall means, or ``""``: a step too short to overlap the loading
        with (an empty loop, say) makes the stall the loader's own pace, not training's."""
        if not self.steps or self.step_median_ms >= SHORT_STEP_MS:
            return ""
        return (f"the step took a median {self.step_median_ms:.3f} ms, too short for the stall to mean "
                f"anything (the {self.stall_fraction:.0%} is the loader's own pace, with no work to overlap "
                "it with): time a real training step, a model's forward and backward")

    def as_dict(self) -> dict[str, Any]:
        """Every figure as JSON-ready data (what ``tilefeed bench --json`` writes per run).

        Returns
        -------
        dict
            Field name -> value.
        """
        return asdict(self)


# A step shorter than this overlaps nothing: the stall then measures the loader alone.
SHORT_STEP_MS = 1.0


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


class Watch:
    """``for batch in bench.watch(loader): ...``: times the wait for each batch and the loop body
    (the step) between batches; ``result()`` gives the figures at any moment, and ``report=True``
    prints them when the loop ends."""

    def __init__(self, iterable: Iterable[Any], *, name: str = "loader", warmup: int = 2,
                 device: torch.device | str | None = None, report: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """``clock``: seconds, monotonic; tests pass a fake one to assert exact figures."""
        self.iterable, self.name, self.warmup, self.report = iterable, name, warmup, report
        # positions of the batches that began an epoch: the first, or what the iterable says
        self.epoch_starts: list[int] = getattr(iterable, "epoch_starts", [0])
        self.clock = clock
        self.device = torch.device(device) if device is not None else default_device()
        self.cuda = self.device.type == "cuda"
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.h2d: list[float] = []
        self.rss: list[float] = []
        self.batch_sizes: list[int] = []
        self.output: dict[str, Any] = {}
        self._warned = False  # a too-short step said once (``RunResult.note``)
        self._events: list[tuple[Any, Any]] = []
        self._sampler: MemorySampler | None = None
        self._t_begin = self._t_first = self._t_end = 0.0
        self._step_start: float | None = None

    def __iter__(self) -> Iterator[Any]:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        with MemorySampler() as sampler:
            self._sampler = sampler
            self._t_begin = self.clock()
            it = iter(self.iterable)
            while True:
                t0 = self.clock()
                self._end_step(t0)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t1 = self.clock()
                batch = self._to_device(batch)
                t2 = self.clock()
                self.waits.append(t1 - t0)
                self.h2d.append(t2 - t1)
                self._note(batch)
                if self.cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    self._events.append((start, None))
                if len(self.waits) == self.warmup + 1:
                    self._t_first = t0
                self._step_start = self.clock()
                yield batch
            self._t_end = self.clock()
        if self.report:
            result = self.result()
            print(format_table([result]))
            if result.note:
                print(f"note: {result.note}")
            stages = loader_stats(self.iterable)
            if stages is not None:
                print(stages)

    def _end_step(self, now: float) -> None:
        """Close the step that began when the last batch was handed out, if one is open."""
        if self._step_start is None:
            return
        self.steps.append(now - self._step_start)
        self._step_start = None
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[-1] = (self._events[-1][0], end)
        assert self._sampler is not None
        self.rss.append(self._sampler.latest / 2**20)
        self._t_end = now

    def _to_device(self, batch: Any) -> Any:
        if not self.cuda or not isinstance(batch, (tuple, list)):
            return batch
        return type(batch)(t.to(self.device, non_blocking=True)
                           if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t
                           for t in batch)

    def _note(self, batch: Any) -> None:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(images, torch.Tensor):
            self.batch_sizes.append(int(images.shape[0]))
            if not self.output:
                self.output = {"shape": list(images.shape[1:]), "dtype": str(images.dtype).replace(
                    "torch.", ""), "device": images.device.type}
        else:
            self.batch_sizes.append(len(images))

    def result(self) -> RunResult:
        """The figures over the steps measured so far (warm-up excluded); a loop left with
        ``break`` counts its last step as ending now. A step too short for the stall to mean
        anything is said once, as a warning (``RunResult.note``)."""
        result = self._result()
        if result.note and not self._warned:
            self._warned = True
            warnings.warn(result.note, stacklevel=2)
        return result

    def _result(self) -> RunResult:
        self._end_step(self.clock())
        w = self.warmup
        n = len(self.steps)
        waits, h2d = self.waits[w:n], self.h2d[w:n]
        starts = {k - w for k in self.epoch_starts if w <= k < n}
        if self.cuda and n:
            torch.cuda.synchronize(self.device)
            pairs = self._events[:n]
            steps = [s.elapsed_time(e) / 1000 for s, e in pairs][w:]
            # device-side wait: the idle gap between the previous step's end and this start
            gaps = [max(0.0, pairs[k - 1][1].elapsed_time(pairs[k][0]) / 1000)
                    for k in range(max(1, w), n)]
            waits = gaps if w > 0 else [waits[0]] + gaps
        else:
            steps = self.steps[w:n]
        handover = [v for k, v in enumerate(waits) if k not in starts]
        measured = len(steps)
        wall = (self._t_end - self._t_first) if measured else 0.0
        samples = sum(self.batch_sizes[w:n])
        growth = steady_growth(self.rss[w:n])
        peak = self._sampler.peak / 2**20 if self._sampler else 0.0
        gpu_alloc = gpu_res = None
        if self.cuda:
            gpu_alloc = torch.cuda.max_memory_allocated(self.device) / 2**20
            gpu_res = torch.cuda.max_memory_reserved(self.device) / 2**20
        return RunResult(
            loader=self.name, batch_size=max(self.batch_sizes, default=0), samples=samples,
            steps=measured, warmup=min(w, n), wait_s=sum(waits), step_s=sum(steps), wall_s=wall,
            stall_fraction=sum(waits) / wall if wall else 0.0,
            samples_per_s=samples / wall if wall else 0.0,
            busy_fraction=min(1.0, sum(steps) / wall) if wall else 0.0, h2d_s=sum(h2d),
            wait_median_ms=1000 * statistics.median(waits) if waits else 0.0,
            wait_p95_ms=1000 * _p95(waits),
            handover_median_ms=1000 * statistics.median(handover) if handover else 0.0,
            epoch_start_wait_ms=[1000 * waits[k] for k in sorted(starts)],
            step_median_ms=1000 * statistics.median(steps) if steps else 0.0,
            step_p95_ms=1000 * _p95(steps),
            warmup_s=(self._t_first - self._t_begin) if measured else 0.0,
            peak_rss_mb=peak, gpu_max_allocated_mb=gpu_alloc, gpu_max_reserved_mb=gpu_res,
            memory_growth=growth.steady, memory_note=growth.detail, output=dict(self.output),
            timeline={"wait_ms": [1000 * v for v in waits], "step_ms": [1000 * v for v in steps],
                      "anon_mb": self.rss[w:n],
                      # the warm-up, left out of every figure but drawn: stalls hide there
                      "warmup_wait_ms": [1000 * v for v in self.waits[:min(w, n)]],
                      "warmup_step_ms": [1000 * v for v in self.steps[:min(w, n)]]},
        )


def watch(iterable: Iterable[Any], *, name: str = "loader", warmup: int = 2,
          device: torch.device | str | None = None, report: bool = False,
          clock: Callable[[], float] = time.perf_counter) -> Watch:
    """``for batch in watch(loader): train_step(batch)``: wait and step times of a loop you own.

    Parameters
    ----------
    iterable : iterable
        The loader (a tilefeed ``Loader``, a torch ``DataLoader``, any iterable of batches).
    name : str, default "loader"
        The name the figures are reported under.
    warmup : int, default 2
        Batches at the start left out of the figures.
    device : torch.device or str, optional
        On a CUDA device, steps are timed with CUDA events and the wait is the device's idle gap
        between steps; default: the host clock.
    report : bool, default False
        Print the figures when the loop ends (a tilefeed ``Loader``'s ``stats()`` too).
    clock : callable, default time.perf_counter
        Seconds, monotonic; tests pass a fake one.

    Returns
    -------
    Watch
        Iterates as ``iterable`` does; its ``result()`` gives a ``RunResult`` at any moment.
    """
    return Watch(iterable, name=name, warmup=warmup, device=device, report=report, clock=clock)


def measure(loader: Iterable[Any], step: Step, *, steps: int, warmup: int = 2,
            name: str = "loader", device: torch.device | str | None = None,
            clock: Callable[[], float] = time.perf_counter) -> RunResult:
    """Run ``step(images, labels)`` on ``warmup + steps`` batches (epochs restart as needed).

    Parameters
    ----------
    loader : iterable
        Yields ``(images, labels, ...)`` batches; iterated again when an epoch ends.
    step : callable
        ``step(images, labels)``: the training step (or an emulated one).
    steps : int
        Steps measured, at least 1.
    warmup : int, default 2
        Steps run first and left out of the figures.
    name : str, default "loader"
        The name the figures are reported under.
    device : torch.device or str, optional
        As for ``watch``.
    clock : callable, default time.perf_counter
        Seconds, monotonic.

    Returns
    -------
    RunResult
        Wait, step and stall figures of the measured steps (and a tilefeed Loader's stages).

    Raises
    ------
    ValueError
        When ``steps < 1`` or ``warmup < 0``.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    watcher = Watch(_Forever(loader), name=name, warmup=warmup, device=device, clock=clock)
    for k, batch in enumerate(watcher):
        step(batch[0], batch[1])
        if k + 1 == warmup + steps:
            break
    result = watcher.result()
    stages = loader_stats(loader)
    if stages is not None:  # where a tilefeed Loader's time went, per stage
        last = stages.last
        result.extra["stages"] = {
            "busy": last.busy, "wait": last.wait, "bottleneck": stages.bottleneck,
            "advice": stages.advice,
            "ms_per_batch": {k: 1000 * v / max(1, last.batches) for k, v in last.stage_seconds.items()}}
    if result.memory_growth:
        warnings.warn(f"{name}: {result.memory_note} (a leak or a retained graph?)", stacklevel=2)
    return result


def loader_stats(iterable: Any) -> Any:
    """A Loader's ``stats()`` of its last batches, when it is one and has figures; else None."""
    stats = getattr(getattr(iterable, "loader", iterable), "stats", None)
    if stats is None:
        return None
    try:
        return stats()
    except ValueError:  # no batch handed over, or stats=False
        return None


class _Forever:
    """Epoch after epoch of ``loader``, noting at which batch each epoch began."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.epoch_starts: list[int] = []

    def __iter__(self) -> Iterator[Any]:
        count = 0
        while True:
            self.epoch_starts.append(count)
            for batch in self.loader:
                count += 1
                yield batch
            if self.epoch_starts[-1] == count:
                raise ValueError("the loader yielded no batch in a whole epoch")


def _starts(waits_ms: list[float]) -> str:
    """The epoch-start waits measured: each of a few, else the median and the largest."""
    if not waits_ms:
        return "-"
    if len(waits_ms) <= 2:
        return "/".join(f"{v:.1f}" for v in waits_ms)
    return f"{statistics.median(waits_ms):.1f} (max {max(waits_ms):.1f})"


def format_table(runs: list[RunResult]) -> str:
    head = (f"| {'loader':<18} | {'stall':>6} | {'img/s':>7} | {'busy':>5} | {'wait med/p95 ms':>15} "
            f"| {'mid-epoch wait ms':>17} | {'epoch start ms':>14} "
            f"| {'step med/p95 ms':>15} | {'peak RSS MB':>11} | {'GPU alloc/res MB':>16} |")
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for r in runs:
        gpu = (f"{r.gpu_max_allocated_mb:.0f}/{r.gpu_max_reserved_mb:.0f}"
               if r.gpu_max_allocated_mb is not None else "-")
        lines.append(
            f"| {r.loader:<18} | {r.stall_fraction:>6.1%} | {r.samples_per_s:>7.0f} | "
            f"{r.busy_fraction:>5.0%} | {r.wait_median_ms:>7.1f}/{r.wait_p95_ms:<7.1f} | "
            f"{r.handover_median_ms:>17.2f} | {_starts(r.epoch_start_wait_ms):>14} | "
            f"{r.step_median_ms:>7.1f}/{r.step_p95_ms:<7.1f} | {r.peak_rss_mb:>11.0f} | {gpu:>16} |")
    return "\n".join(lines)
