"""``tilefeed bench soak STORE``: memory and resources over the loader patterns of long jobs.

Runs each pattern for a share of the time: one Loader over many epochs; a new Loader per epoch;
leaving an epoch early; an exception inside the loop; a train and a validation Loader alive at
once; one Loader whose output size changes every epoch (progressive resizing, at least
``SIZE_EPOCHS`` epochs). It samples RSS, threads, open files, shared-memory segments and (on a
GPU) device memory after every unit (an epoch or a Loader; threads apart from a pool zarr grows
on demand, see ``_threads``), and judges the RSS growth after warm-up two ways: the fitted slope
over the units, and the median of the last third of the samples against the median of the
first third. A pattern passes when either stays under ``limit_kb`` per unit (plus 2 MB of
allocator jitter, which only matters in short runs): a leak lifts both, while one sample caught
at a peak on a loaded machine tilts a fit but not a median. Threads, files and segments must
not grow (their floor over the second half of the run is no higher than over the first half: a
thread or file that leaks stays and lifts the floor, while one that ends a moment late only
lifts a peak).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

LIMIT_KB = 10.0  # RSS growth per unit that still passes: 1,000 loaders under 10 MB
NOISE_KB = 2048.0  # allocator jitter a short run cannot tell from growth: allowed on top
SIZE_PATTERN = "size changes every epoch"
SIZE_EPOCHS = 50  # that pattern runs at least this many epochs


@dataclass
class PatternResult:
    pattern: str
    unit: str
    units: int
    seconds: float
    rss_start_mb: float
    rss_end_mb: float
    rss_slope_kb: float  # per unit, after warm-up
    rss_growth_kb: float  # the fitted growth over the units after warm-up
    rss_median_growth_kb: float  # median of the last third of those units less that of the first
    threads: tuple[int, int]  # (min, max) after warm-up
    open_files: tuple[int, int]
    shm_segments: tuple[int, int]
    gpu_slope_kb: float | None
    ok: bool


def _shm_segments(proc: psutil.Process) -> int:
    """Shared-memory segments this process maps or holds open (not the machine's: other
    processes come and go there)."""
    paths = {m.path for m in proc.memory_maps() if m.path.startswith("/dev/shm/")}
    paths |= {f.path for f in proc.open_files() if f.path.startswith("/dev/shm/")}
    return len(paths)


def _threads(proc: psutil.Process) -> int:
    """This process's threads, but the workers of asyncio's default executor: zarr's event
    loop, which the reader uses for the store's small arrays, starts them on demand up to a
    fixed bound (``min(32, cores + 4)``), so one may first appear at any unit of a run."""
    pool = sum(t.name.startswith("asyncio_") for t in threading.enumerate())
    return proc.num_threads() - pool


def _floor_flat(counts: tuple[float, ...]) -> bool:
    """Counts that do not grow: the second half's minimum is no higher than the first half's.
    A sample taken while a closed loader's thread is still ending reads one more; that peak can
    fall anywhere, but only what stays behind raises every later sample."""
    half = len(counts) // 2
    return min(counts[half:]) <= min(counts[:half])


def _median_growth(values: list[float]) -> float:
    """The median of the last third less the median of the first: growth that a single sample
    taken at a peak (a collection, a late-ending thread) cannot fake."""
    third = max(1, len(values) // 3)
    return float(np.median(values[-third:]) - np.median(values[:third]))


def _slope(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    x = np.arange(len(values), dtype=np.float64)
    return float(np.polyfit(x, np.asarray(values, dtype=np.float64), 1)[0])


def _patterns(store: str, batch_size: int, workers: int) -> dict[str, tuple[str, Callable[[Any], Any]]]:
    """name -> (unit, one unit of work given the long-lived state)."""
    from tilefeed.pipeline import Loader

    def make(**kw: Any) -> Loader:
        return Loader(store, batch_size, train=True, num_workers=workers, **kw)

    def one_loader_many_epochs(state: dict[str, Any]) -> None:
        if "loader" not in state:
            state["loader"] = make()
        for _batch in state["loader"]:
            pass

    def loader_per_epoch(state: dict[str, Any]) -> None:
        with make() as loader:
            for _batch in loader:
                pass

    def break_early(state: dict[str, Any]) -> None:
        with make() as loader:
            for n, _batch in enumerate(loader):
                if n == 1:
                    break

    def exception_inside(state: dict[str, Any]) -> None:
        try:
            with make() as loader:
                for _batch in loader:
                    raise RuntimeError("inside the loop")
        except RuntimeError:
            pass

    def size_every_epoch(state: dict[str, Any]) -> None:
        if "loader" not in state:
            state["loader"], state["epoch"] = make(), 0
        loader = state["loader"]
        tile = loader.reader.tile  # four sizes around the tile's, as a progressive schedule visits
        loader.set_size(max(8, tile * (2, 3, 4, 5)[state["epoch"] % 4] // 4))
        state["epoch"] += 1
        for _batch in loader:
            pass

    def train_and_val(state: dict[str, Any]) -> None:
        with make() as train, Loader(store, batch_size, shuffle=False, num_workers=workers) as val:
            for _batch in train:
                pass
            for _batch in val:
                pass

    return {
        "one loader, many epochs": ("epoch", one_loader_many_epochs),
        "new loader per epoch": ("loader", loader_per_epoch),
        "break out early": ("loader", break_early),
        "exception in the loop": ("loader", exception_inside),
        "train + val alive at once": ("loader pair", train_and_val),
        SIZE_PATTERN: ("epoch", size_every_epoch),
    }


def soak(store: str | Path, *, seconds: float = 60.0, batch_size: int = 16, workers: int = 2,
         limit_kb: float = LIMIT_KB, warmup: float = 0.3,
         on_result: Callable[[PatternResult], None] | None = None,
         only: list[str] | None = None) -> list[PatternResult]:
    """Run every pattern (or those named in ``only``) for an equal share of ``seconds``; growth is
    judged over all but the first ``warmup``."""
    proc = psutil.Process()
    gpu = torch.cuda.is_available()
    results = []
    patterns = _patterns(str(store), batch_size, workers)
    if only is not None:
        unknown = [name for name in only if name not in patterns]
        if unknown:
            raise ValueError(f"no soak pattern {unknown[0]!r}; the patterns: {', '.join(patterns)}")
        patterns = {name: patterns[name] for name in only}
    for _unit, work in patterns.values():  # one-time costs (imports, DALI's first graphs, arenas)
        warm: dict[str, Any] = {}
        for _ in range(3):
            work(warm)
        if "loader" in warm:
            warm["loader"].close()
    for name, (unit, work) in patterns.items():
        state: dict[str, Any] = {}
        samples: list[tuple[float, int, int, int, float]] = []
        started = time.perf_counter()
        least = SIZE_EPOCHS if name == SIZE_PATTERN else 30
        while time.perf_counter() - started < seconds / len(patterns) or len(samples) < least:
            work(state)
            gc.collect()
            samples.append((proc.memory_info().rss / 1024, _threads(proc), proc.num_fds(),
                            _shm_segments(proc), _device_used_kib() if gpu else 0.0))
        if "loader" in state:
            state["loader"].close()
        steady = samples[int(len(samples) * warmup):]
        rss = [s[0] for s in steady]
        columns = list(zip(*steady, strict=True))
        flat = all(_floor_flat(c) for c in columns[1:4])
        slope = _slope(rss)
        growth = slope * len(steady)
        median_growth = _median_growth(rss)
        gpu_slope = _slope([s[4] for s in steady]) if gpu else None
        allowed = limit_kb * len(steady) + NOISE_KB
        result = PatternResult(
            pattern=name, unit=unit, units=len(samples), seconds=time.perf_counter() - started,
            rss_start_mb=samples[0][0] / 1024, rss_end_mb=samples[-1][0] / 1024, rss_slope_kb=slope,
            rss_growth_kb=growth, rss_median_growth_kb=median_growth,
            threads=(min(columns[1]), max(columns[1])), open_files=(min(columns[2]), max(columns[2])),
            shm_segments=(min(columns[3]), max(columns[3])), gpu_slope_kb=gpu_slope,
            ok=(min(growth, median_growth) < allowed and flat
                and (gpu_slope is None or gpu_slope * len(steady) < allowed)),
        )
        results.append(result)
        if on_result:
            on_result(result)
    return results


@dataclass
class SoakResult:
    """Every pattern's result, and the RSS growth per unit they were held to."""

    patterns: list[PatternResult]
    limit_kb: float

    @property
    def ok(self) -> bool:
        """Whether every pattern passed."""
        return all(r.ok for r in self.patterns)

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data: each pattern's figures, the limit and the verdict."""
        return {"patterns": [asdict(r) for r in self.patterns], "limit_kb": self.limit_kb, "ok": self.ok}

    def table(self) -> str:
        """A Markdown table, one row per pattern, and the verdict."""
        failed = [r.pattern for r in self.patterns if not r.ok]
        gpu = any(r.gpu_slope_kb is not None for r in self.patterns)
        return "\n".join([header(gpu), *map(format_row, self.patterns), "",
                          f"soak: {'FAIL: ' + ', '.join(failed) if failed else 'pass'}: RSS growth per unit "
                          f"under {self.limit_kb:g} KB and threads, open files and shared memory flat after "
                          "warm-up"])


def format_row(r: PatternResult) -> str:
    """One pattern's row of the table."""
    def span(v: tuple[int, int]) -> str:
        return str(v[0]) if v[0] == v[1] else f"{v[0]}-{v[1]}"

    gpu = "" if r.gpu_slope_kb is None else f" | {r.gpu_slope_kb:+.1f}"
    return (f"| {r.pattern} | {r.units} {r.unit}s | {r.rss_start_mb:.0f} -> {r.rss_end_mb:.0f} | "
            f"{r.rss_slope_kb:+.1f} | {r.rss_median_growth_kb:+.0f} | {span(r.threads)} | "
            f"{span(r.open_files)} | "
            f"{span(r.shm_segments)}{gpu} | {'pass' if r.ok else 'FAIL'} |")


def header(gpu: bool) -> str:
    """The table's head; ``gpu``: with a column for device memory."""
    cols = ["pattern", "units", "RSS MB", "RSS KB/unit after warm-up", "RSS KB, median last third "
            "- first", "threads", "open files", "shm segments", *(["GPU KB/unit"] if gpu else []), "verdict"]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", *(["---:"] if gpu else []),
             "---"]
    return "| " + " | ".join(cols) + " |\n| " + " | ".join(align) + " |"



def _device_used_kib() -> float:
    """Device memory in use, in KiB, by every allocator on the device (DALI's as well as
    torch's: torch's ``memory_reserved`` sees only its own)."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 1024
