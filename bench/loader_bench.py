"""Loader-alone throughput: tilefeed's Loader against a memcpy of the decoded tiles (the limit)
and against a torch DataLoader decoding the source JPEGs with PIL, at the same worker count,
batch size, samples, output shape and dtype. Rounds interleave the loaders; medians reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.bench.baseline import jpeg_dataloader
from tilefeed.pipeline import Loader, StoreReader


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
            f"uint8: tilefeed / memcpy limit = {self.ratio(UINT8_TILEFEED, MEMCPY):.0%} (goal >= 30%); "
            f"tilefeed / PIL DataLoader = {self.ratio(UINT8_TILEFEED, UINT8_PIL):.1f}x (goal >= 20x)",
            f"float32 augmented: tilefeed / PIL DataLoader = "
            f"{self.ratio(AUG_TILEFEED, AUG_PIL):.1f}x (goal >= 3x)",
        ]
        return "\n".join(lines)


MEMCPY = "memcpy of decoded tiles into batches (the limit)"
UINT8_TILEFEED = "tilefeed Loader, uint8 NHWC tiles"
UINT8_PIL = "DataLoader + PIL decode, centre crop, uint8"
AUG_TILEFEED = "tilefeed Loader, train: crop+flip+normalise, float32"
AUG_PIL = "DataLoader + PIL decode, train: crop+flip+normalise, float32"


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


def _memcpy(store: Path, batch_size: int) -> Callable[[], int]:
    reader = StoreReader(store)
    tiles = np.stack([reader.read(i) for i in range(len(reader))])
    out = np.empty((batch_size, *tiles.shape[1:]), dtype=np.uint8)
    rng = np.random.default_rng(0)

    def epoch() -> int:
        order = rng.permutation(len(tiles))
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            np.take(tiles, idx, axis=0, out=out[: len(idx)])
        return len(tiles)
    return epoch


def bench_loaders(images: Path, store: Path, *, batch_size: int = 64, workers: int = 2,
                  rounds: int = 5, min_seconds: float = 1.5, log: bool = True) -> LoaderBenchResult:
    reader = StoreReader(store)
    tile = reader.tile
    if log:
        print("building loaders and warming up (a few epochs each)...", flush=True)
    contenders: dict[str, Callable[[], int]] = {
        MEMCPY: _memcpy(store, batch_size),
        UINT8_TILEFEED: _drain(Loader(store, batch_size, train=False, size=tile, dtype=torch.uint8,
                                      layout="NHWC", workers=workers, device="cpu")),
        UINT8_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=False,
                                          size=tile, dtype=torch.uint8)),
        AUG_TILEFEED: _drain(Loader(store, batch_size, train=True, size=tile, workers=workers,
                                    device="cpu")),
        AUG_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=True, size=tile)),
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
