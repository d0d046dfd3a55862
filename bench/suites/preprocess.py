"""Preprocessing throughput against the bare cost of decoding and resizing with PIL.

Each round runs, back to back on the same cached images: the bare decode + resize in one
process (storing nothing), ``preprocess`` with one worker, and ``preprocess`` with two workers.
Rounds interleave the three so machine noise hits them alike; the report gives medians, and
where the one-worker run's time goes (the worker times decode, encode and write; the driver's
threads time the copy into shards and the sync, which overlap the worker).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.images import Rejected, load_tiles
from tilefeed.preprocess.sources.finding import find_sources
from tilefeed.store.format import Codec


WORKER_PHASES = ("decode", "encode", "write")  # the rest (copy, sync) overlap them locally


@dataclass(frozen=True)
class PreprocessBenchResult:
    images: int
    codec: str
    size: int
    bare: float  # img/s, medians over rounds
    one_worker: float
    two_workers: float
    overhead: float  # median over rounds of (bare rate / 1-worker rate - 1), from the same round
    scaling: float  # median over rounds of 2-worker rate / 1-worker rate
    phases: dict[str, float]  # 1 worker: median share of the run's time per phase, and "other"

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        rows = [
            ("PIL decode + resize, store nothing (1 process)", self.bare, "1.00x"),
            ("tilefeed preprocess --processes 1", self.one_worker, f"{self.one_worker / self.bare:.2f}x"),
            ("tilefeed preprocess --processes 2", self.two_workers, f"{self.two_workers / self.bare:.2f}x"),
        ]
        lines = [f"{self.images} images -> {self.size}px tiles, codec {self.codec}, medians",
                 f"| {'path':<48} | {'img/s':>7} | {'vs bare':>7} |",
                 f"|{'-' * 50}|{'-' * 9}|{'-' * 9}|"]
        lines += [f"| {name:<48} | {rate:>7.0f} | {ratio:>7} |" for name, rate, ratio in rows]
        lines.append(f"store overhead over bare decode (1 worker): {self.overhead * 100:+.1f}%; "
                     f"2 workers / 1 worker: {self.scaling:.2f}x")
        lines.append("1 worker, share of the run: " + ", ".join(
            f"{phase} {share:.1%}" for phase, share in self.phases.items())
            + " (decode: open, decode, fit; copy into shards and sync run on the driver's "
            "threads, beside the worker; other: the worker's time outside its phases)")
        return "\n".join(lines)


def bench_preprocess(images: Path, *, size: int = 224, codec: Codec = Codec.LZ4, rounds: int = 5,
                     log: bool = True) -> PreprocessBenchResult:
    sources = find_sources(images)
    tiles, store = TileSettings(tile=size), StoreSettings(codec=codec)
    rates: dict[str, list[float]] = {"bare": [], "1": [], "2": []}
    shares: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tilefeed-bench-") as tmp:
        for r in range(rounds):
            start = time.perf_counter()
            for path in sources.paths:
                try:
                    load_tiles(path, tiles)
                except Rejected:
                    pass
            rates["bare"].append(len(sources) / (time.perf_counter() - start))
            for workers in (1, 2):
                out = Path(tmp) / f"store{workers}"
                shutil.rmtree(out, ignore_errors=True)
                summary = preprocess(images, out, tiles, store, workers=workers)
                rates[str(workers)].append(len(sources) / summary.seconds)
                if workers == 1:
                    for phase, seconds in summary.phases.items():
                        shares.setdefault(phase, []).append(seconds / summary.seconds)
                    worker = sum(summary.phases[p] for p in WORKER_PHASES)
                    shares.setdefault("other", []).append(1 - worker / summary.seconds)
            if log:
                print(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{k}: {v[-1]:.0f} img/s" for k, v in rates.items()), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    overhead = statistics.median(b / one - 1 for b, one in zip(rates["bare"], rates["1"], strict=True))
    scaling = statistics.median(two / one for one, two in zip(rates["1"], rates["2"], strict=True))
    return PreprocessBenchResult(len(sources), codec, size, med["bare"], med["1"], med["2"],
                                 overhead, scaling, {k: statistics.median(v) for k, v in shares.items()})
