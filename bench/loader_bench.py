"""Loader-alone throughput: tilefeed's Loader against the fastest copy of the decoded tiles this
machine can do (the limit: all cores) and against a torch DataLoader decoding the source JPEGs
with PIL, at the same worker count, batch size, samples, output shape and dtype. Rounds
interleave the loaders; medians reported."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.bench.baseline import jpeg_dataloader
from tilefeed.pipeline import Loader, StoreReader
from tilefeed.preprocess.settings import usable_cores


@dataclass
class LoaderBenchResult:
    samples: int
    batch_size: int
    workers: int
    tile: int
    codec: str
    rates: dict[str, float] = field(default_factory=dict)  # img/s, medians

    def ratio(self, a: str, b: str) -> float:
        return self.rates[a] / self.rates[b]

    def table(self) -> str:
        lines = [f"{self.samples} samples, batch {self.batch_size}, {self.workers} workers, "
                 f"{self.tile}px tiles ({self.codec}), medians",
                 f"| {'loader':<58} | {'img/s':>8} |", f"|{'-' * 60}|{'-' * 10}|"]
        lines += [f"| {name:<58} | {rate:>8.0f} |" for name, rate in self.rates.items()]
        lines += [
            f"uint8: tilefeed / the limit = {self.ratio(UINT8_TILEFEED, MEMCPY):.0%} (goal >= 30%); "
            f"tilefeed / PIL DataLoader = {self.ratio(UINT8_TILEFEED, UINT8_PIL):.1f}x (goal >= 20x)",
            f"float32 augmented: tilefeed / PIL DataLoader = "
            f"{self.ratio(AUG_TILEFEED, AUG_PIL):.1f}x (goal >= 3x)",
        ]
        return "\n".join(lines)


MEMCPY = "the limit: fastest copy of decoded tiles into batches, all cores"
UINT8_TILEFEED = "tilefeed Loader, uint8 NHWC tiles"
UINT8_PIL = "DataLoader + PIL decode, centre crop, uint8"
AUG_TILEFEED = "tilefeed Loader, train: crop+flip+normalise, float32"
AUG_PIL = "DataLoader + PIL decode, train: crop+flip+normalise, float32"
AUG_TILEFEED_CL = "tilefeed Loader, train: crop+flip+normalise, float32 channels_last"


def _rate(epoch: Callable[[], int], min_seconds: float) -> float:
    """Samples per second over whole epochs, run until at least ``min_seconds`` have passed."""
    samples, start = 0, time.perf_counter()
    while True:
        samples += epoch()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return samples / elapsed


def _drain(loader: Iterable[Any]) -> Callable[[], int]:
    def epoch() -> int:
        return sum(len(batch[0]) for batch in loader)
    return epoch


def _copy_limit(store: Path, batch_size: int, threads: int) -> Callable[[], int]:
    """What this machine can do at best: the decoded tiles, in a store-sized array, copied in a
    random order into batch buffers by one thread per core, each tile with ``np.copyto`` and
    each batch with ``np.take``; an epoch is timed with the faster of the two, measured first."""
    reader = StoreReader(store)
    tiles = np.stack([reader.read(i) for i in range(len(reader))])
    outs = [np.empty((batch_size, *tiles.shape[1:]), dtype=np.uint8) for _ in range(threads)]
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(threads)

    def copyto(out: np.ndarray, idx: np.ndarray) -> None:
        for k, i in enumerate(idx.tolist()):
            np.copyto(out[k], tiles[i])

    def take(out: np.ndarray, idx: np.ndarray) -> None:
        np.take(tiles, idx, axis=0, out=out[: len(idx)])

    def epoch_with(copy: Callable[[np.ndarray, np.ndarray], None]) -> Callable[[], int]:
        def share(t: int, order: np.ndarray) -> None:
            for lo in range(t * batch_size, len(order), threads * batch_size):
                copy(outs[t], order[lo : lo + batch_size])

        def epoch() -> int:
            order = rng.permutation(len(tiles))
            list(pool.map(share, range(threads), [order] * threads))
            return len(tiles)
        return epoch

    candidates = [epoch_with(copyto), epoch_with(take)]
    return max(candidates, key=lambda epoch: _rate(epoch, 0.5))


def bench_loaders(images: Path, store: Path, *, batch_size: int = 64, workers: int = 2,
                  rounds: int = 5, min_seconds: float = 1.5, log: bool = True) -> LoaderBenchResult:
    reader = StoreReader(store)
    tile = reader.tile
    if log:
        print("building loaders and warming up (a few epochs each)...", flush=True)
    contenders: dict[str, Callable[[], int]] = {
        MEMCPY: _copy_limit(store, batch_size, usable_cores()),
        UINT8_TILEFEED: _drain(Loader(store, batch_size, train=False, size=tile, dtype=torch.uint8,
                                      layout="NHWC", workers=workers, device="cpu")),
        UINT8_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=False,
                                          size=tile, dtype=torch.uint8)),
        AUG_TILEFEED: _drain(Loader(store, batch_size, train=True, size=tile, workers=workers,
                                    device="cpu")),
        AUG_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=True, size=tile)),
        AUG_TILEFEED_CL: _drain(Loader(store, batch_size, train=True, size=tile, workers=workers,
                                       layout="channels_last", device="cpu")),
    }
    for epoch in contenders.values():
        _rate(epoch, min_seconds)  # DALI's buffers and the page tables settle over a few epochs
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name, epoch in contenders.items():
            rates[name].append(_rate(epoch, min_seconds))
        if log:
            print(f"round {r + 1}/{rounds}: " + ", ".join(f"{v[-1]:.0f}" for v in rates.values()),
                  flush=True)
    result = LoaderBenchResult(len(reader), batch_size, workers, tile, reader.codec.name)
    result.rates = {name: statistics.median(v) for name, v in rates.items()}
    return result
