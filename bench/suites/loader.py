"""Loader-alone throughput: tilefeed's Loader against the fastest copy of the decoded tiles this
machine can do (the limit: all cores) and against a torch DataLoader decoding the source JPEGs
with PIL, at the same worker count, batch size, samples, output shape and dtype; and, given two
halves of the store (``mixture_halves``), the same Loader over a 50/50 ``Mix`` of them, the
store's very samples, its epochs taken in turn with the store's. Rounds interleave the loaders;
medians and ranges reported.
``bench_sizes`` (``--sizes``): training throughput at several output sizes from one store, each
Loader changing size between measurements, with JPEG decoding at reduced DCT scale on and off,
and the decode alone at each scale."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.bench.harness.sides import Figure, range_text
from tilefeed.bench.peers.baseline import jpeg_dataloader
from tilefeed.bench.peers.ffcv import FfcvPeer
from tilefeed.bench.fixtures.halves import HALVES, check_halves
from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.mixing.mix import Mix
from tilefeed.store.errors import ConfigError
from tilefeed.store.host import usable_cores


@dataclass
class LoaderBenchResult:
    samples: int
    batch_size: int
    workers: int
    tile: int
    codec: str
    rates: dict[str, float] = field(default_factory=dict)  # img/s, medians
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # img/s, over rounds
    # the mixture row: its epoch's samples (the store's), each round's mixture / store (uint8)
    mixture_samples: int | None = None
    mixture_ratios: list[float] = field(default_factory=list)
    # FFCV beside tilefeed, figure -> (FFCV median, tilefeed median, FFCV range, tilefeed range)
    peer: dict[str, tuple[float, float, tuple[float, float], tuple[float, float]]] = field(
        default_factory=dict)

    def ratio(self, a: str, b: str) -> float:
        return self.rates[a] / self.rates[b]

    @property
    def mixture_ratio(self) -> tuple[float, float, float] | None:
        """The rounds' mixture / single store: median, least, most (None without the row)."""
        if not self.mixture_ratios:
            return None
        ratios = Figure(self.mixture_ratios)
        return ratios.median, *ratios.bounds

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        wide = max(map(len, ["loader", *self.rates]))
        lines = [f"{self.samples} samples, batch {self.batch_size}, {self.workers} workers, "
                 f"{self.tile}px tiles ({self.codec}), medians and ranges over rounds",
                 f"| {'loader':<{wide}} | {'img/s':>8} | {'range':>13} |",
                 f"|{'-' * (wide + 2)}|{'-' * 10}|{'-' * 15}|"]
        lines += [f"| {name:<{wide}} | {rate:>8.0f} | {self._range(name):>13} |"
                  for name, rate in self.rates.items()]
        lines += [
            f"uint8: tilefeed / the limit = {self.ratio(UINT8_TILEFEED, MEMCPY):.0%}; "
            f"tilefeed / PIL DataLoader = {self.ratio(UINT8_TILEFEED, UINT8_PIL):.1f}x",
            f"float32 augmented: tilefeed / PIL DataLoader = {self.ratio(AUG_TILEFEED, AUG_PIL):.1f}x",
        ]
        if self.mixture_ratio is not None:
            ratio, low, high = self.mixture_ratio
            lines.append(f"uint8: 50/50 mixture of two halves / the single store = {ratio:.3f}, median "
                         f"of rounds {range_text((low, high), '.3f')} (their epochs in turn; same "
                         f"{self.mixture_samples} samples an epoch)")
        if self.peer:
            lines += ["", "| figure (img/s) | FFCV | tilefeed | tilefeed / FFCV | FFCV range "
                      "| tilefeed range |",
                      "| --- | ---: | ---: | ---: | ---: | ---: |"]
            for name, (theirs, ours, their_range, our_range) in self.peer.items():
                lines.append(f"| {name} | {theirs:.0f} | {ours:.0f} | {ours / theirs:.2f} | "
                             f"{range_text(their_range, '.0f')} | {range_text(our_range, '.0f')} |")
        return "\n".join(lines)

    def _range(self, name: str) -> str:
        return range_text(self.ranges.get(name, (float("nan"), float("nan"))), ".0f")


MEMCPY = "the limit: fastest copy of decoded tiles into batches, all cores"
UINT8_TILEFEED = "tilefeed Loader, uint8 NHWC tiles"
UINT8_PIL = "DataLoader + PIL decode, centre crop, uint8"
AUG_TILEFEED = "tilefeed Loader, train: crop+flip+normalise, float32"
AUG_PIL = "DataLoader + PIL decode, train: crop+flip+normalise, float32"
AUG_TILEFEED_CL = "tilefeed Loader, train: crop+flip+normalise, float32 channels_last"
MIX_TILEFEED = "tilefeed Loader, 50/50 Mix of the store's halves, uint8 NHWC"


def _rate(epoch: Callable[[], int], min_seconds: float) -> float:
    """Samples per second over whole epochs, run until at least ``min_seconds`` have passed."""
    samples, start = 0, time.perf_counter()
    while True:
        samples += epoch()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return samples / elapsed


def _paired_rates(first: Callable[[], int], second: Callable[[], int],
                  min_seconds: float) -> tuple[float, float]:
    """Two loaders' rates from their epochs taken in turn, the lead changing every pair: a busy
    moment of the machine falls on both, so their ratio holds. (Each reads its next epoch ahead
    while the other's is timed: alike for both, but such rates run a little above one alone.)"""
    samples, seconds, turn = [0, 0], [0.0, 0.0], 0
    while min(seconds) < min_seconds:
        for k in (turn % 2, 1 - turn % 2):
            began = time.perf_counter()
            samples[k] += (first, second)[k]()
            seconds[k] += time.perf_counter() - began
        turn += 1
    return samples[0] / seconds[0], samples[1] / seconds[1]


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


# Long on purpose: the rows of one side-by-side table, each measured in turn in the same rounds.
def bench_loaders(images: Path, store: Path, *, batch_size: int = 64, workers: int = 2,
                  rounds: int = 5, min_seconds: float = 1.5, log: bool = True,
                  peer_python: str | None = None, jpeg_store: Path | None = None,
                  halves: tuple[Path, Path] | None = None) -> LoaderBenchResult:
    """``halves``: two stores that together hold exactly ``store``'s samples
    (``mixture_halves.split_store``; refused otherwise); a Loader over their 50/50 ``Mix``, with
    the uint8 row's options, is then measured right after that row in every round.
    ``peer_python``: the Python of an environment with FFCV; its loaders then run on the same
    tiles in rounds interleaved with tilefeed's: raw, and ``jpeg_store``'s JPEG files (the same
    pictures, ``--codec jpeg``), which FFCV stores as they are. Both decode those with
    libjpeg-turbo's fast IDCT, the only one FFCV has."""
    reader = StoreReader(store)
    tile = reader.tile
    if halves is not None:
        check_halves(reader, halves)
    if log:
        print("building loaders and warming up (a few epochs each)...", flush=True)
    contenders: dict[str, Callable[[], int]] = {
        MEMCPY: _copy_limit(store, batch_size, usable_cores()),
        UINT8_TILEFEED: _drain(Loader(store, batch_size, train=False, size=tile, dtype=torch.uint8,
                                      layout="NHWC", workers=workers, device="cpu")),
    }
    mixture_samples = None
    if halves is not None:
        mix = Mix(dict(zip(HALVES, halves, strict=True)), weights={name: 0.5 for name in HALVES})
        contenders[MIX_TILEFEED] = _drain(Loader(mix, batch_size, train=False, size=tile,
                                                 dtype=torch.uint8, layout="NHWC", workers=workers,
                                                 device="cpu"))
        single, mixture_samples = contenders[UINT8_TILEFEED](), contenders[MIX_TILEFEED]()
        if mixture_samples != single:
            raise ConfigError(f"an epoch of the mixture of {halves[0]} and {halves[1]} delivered "
                             f"{mixture_samples} samples, one of {store} {single}")
    contenders |= {
        UINT8_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=False,
                                          size=tile, dtype=torch.uint8)),
        AUG_TILEFEED: _drain(Loader(store, batch_size, train=True, size=tile, workers=workers,
                                    device="cpu")),
        AUG_PIL: _drain(jpeg_dataloader(images, batch_size, workers=workers, train=True, size=tile)),
        AUG_TILEFEED_CL: _drain(Loader(store, batch_size, train=True, size=tile, workers=workers,
                                       layout="channels_last", device="cpu")),
    }
    figures = {"raw, uint8": UINT8_TILEFEED, "raw, train float32 NCHW": AUG_TILEFEED,
               "raw, train float32 channels_last": AUG_TILEFEED_CL}
    peer = None
    if peer_python is not None:
        if jpeg_store is None:
            raise ValueError("a peer comparison needs the JPEG store of the same pictures")
        for layout, name in (("NHWC", "jpeg, uint8"), ("NCHW", "jpeg, train float32 NCHW"),
                             ("channels_last", "jpeg, train float32 channels_last")):
            train = name != "jpeg, uint8"
            contenders[f"tilefeed {name}, fast IDCT"] = _drain(Loader(  # FFCV's IDCT too
                jpeg_store, batch_size, train=train, size=tile, workers=workers, layout=layout,
                dtype=torch.float32 if train else torch.uint8, device="cpu", fast_idct=True))
            figures[name] = f"tilefeed {name}, fast IDCT"
        peer = FfcvPeer(peer_python, reader, StoreReader(jpeg_store), batch_size=batch_size,
                        workers=workers, min_seconds=min_seconds, log=log)
    for epoch in contenders.values():
        _rate(epoch, min_seconds)  # DALI's buffers and the page tables settle over a few epochs
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    ratios: list[float] = []  # the mixture's against the store's, their epochs in turn
    peer_rates: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            for name, epoch in contenders.items():
                if name == MIX_TILEFEED:
                    alone, mixed = _paired_rates(contenders[UINT8_TILEFEED], epoch, min_seconds)
                    rates[MIX_TILEFEED].append(mixed)
                    ratios.append(mixed / alone)
                else:
                    rates[name].append(_rate(epoch, min_seconds))
            if peer is not None:
                for name, value in peer.round().items():
                    peer_rates.setdefault(name, []).append(value)
            if log:
                print(f"round {r + 1}/{rounds}: " + ", ".join(f"{v[-1]:.0f}" for v in rates.values())
                      + (" | FFCV: " + ", ".join(f"{v[-1]:.0f}" for v in peer_rates.values())
                         if peer_rates else ""), flush=True)
    finally:
        if peer is not None:
            peer.close()
    result = LoaderBenchResult(len(reader), batch_size, workers, tile, reader.codec.name)
    measured = {name: Figure(v) for name, v in rates.items()}
    result.rates = {name: f.median for name, f in measured.items()}
    result.ranges = {name: f.bounds for name, f in measured.items()}
    if mixture_samples is not None:
        result.mixture_samples = mixture_samples
        result.mixture_ratios = ratios
    for figure, ours in figures.items():
        if figure in peer_rates:
            theirs = Figure(peer_rates[figure])
            result.peer[figure] = (theirs.median, result.rates[ours], theirs.bounds, measured[ours].bounds)
    return result


@dataclass
class SizesBenchResult:
    """Training throughput at several output sizes from one store, and JPEG decode speed at
    each DCT scale: what progressive resizing gains on the CPU."""

    samples: int
    batch_size: int
    workers: int
    tile: int
    sizes: list[int]
    rates: dict[str, dict[int, float]] = field(default_factory=dict)  # store -> size -> img/s
    decode: dict[int, float] = field(default_factory=dict)  # DCT scale 1/f -> tiles/s, one thread
    reduced: dict[int, float] = field(default_factory=dict)  # size -> share of tiles decoded below full
    builds: int = 0  # DALI pipelines built over every size change of the run

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        names = list(self.rates)
        lines = [f"{self.samples} samples, batch {self.batch_size}, {self.workers} workers, "
                 f"{self.tile}px tiles, train crop+flip+normalise float32 channels_last, one Loader "
                 f"per column, set_size() between measurements, medians (img/s)",
                 "| size | " + " | ".join(names) + " | JPEG scaled / full decode | tiles decoded "
                 "below full size |",
                 "| ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: |"]
        for size in self.sizes:
            row = [f"{self.rates[name][size]:.0f}" for name in names]
            gain = self.rates[JPEG_SCALED][size] / self.rates[JPEG_FULL][size]
            lines.append(f"| {size} | " + " | ".join(row) + f" | {gain:.2f}x | {self.reduced[size]:.1%} |")
        lines += ["", f"DALI pipelines built, three Loaders, every size change included: {self.builds}",
                  "", f"JPEG decode of {self.tile}px tiles, one thread, medians:",
                  "| scale | tiles/s | vs full size |", "| --- | ---: | ---: |"]
        lines += [f"| 1/{f} | {rate:.0f} | {rate / self.decode[1]:.2f}x |" for f, rate in self.decode.items()]
        return "\n".join(lines)


LOSSLESS = "lossless"
JPEG_SCALED = "JPEG, scaled decode"
JPEG_FULL = "JPEG, full decode"


def _decode_rates(jpeg: StoreReader, rounds: int, min_seconds: float) -> dict[int, float]:
    """Tiles/s of the source's own decode calls at full size and at each DCT scale, on one
    thread, rounds interleaved: the decode alone, apart from cutting and resizing."""
    from tilefeed.pipeline.engine.batch_source import DCT_SCALES, decode_scaled
    from tilefeed.store.codec import decode_jpeg

    payloads = [bytes(p) for p in jpeg.payloads(range(min(len(jpeg), 512)))]
    height, width = jpeg.codec.shape[:2]
    outs = {f: np.empty((-(-height // f), -(-width // f), 4), dtype=np.uint8) for f in (1, *DCT_SCALES)}

    def at(factor: int) -> Callable[[], int]:
        def epoch() -> int:
            for p in payloads:
                if factor == 1:
                    decode_jpeg(p, outs[1], pixels="RGBX")
                else:
                    decode_scaled(p, outs[factor])
            return len(payloads)
        return epoch

    runs: dict[int, list[float]] = {f: [] for f in (1, 2, 4, 8)}
    for _ in range(rounds):
        for f in runs:
            runs[f].append(_rate(at(f), min_seconds / 2))
    return {f: statistics.median(v) for f, v in runs.items()}


def bench_sizes(store: Path, jpeg_store: Path, sizes: list[int], *, batch_size: int = 64,
                workers: int = 2, rounds: int = 3, min_seconds: float = 1.5,
                log: bool = True) -> SizesBenchResult:
    """Each of ``sizes`` from the same stores (lossless; JPEG with reduced-scale decoding on and
    off), one Loader each whose size changes between measurements, rounds interleaved."""
    from tilefeed.pipeline.engine import graph_ops as graph
    from tilefeed.pipeline.engine import graph_pool as pool

    reader = StoreReader(store)
    pool.clear()  # no idle graph of this process's to reuse: every pipeline these Loaders use is counted
    built = [0]
    real = graph.build_pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        built[0] += 1
        return real(*args, **kwargs)

    graph.build_pipeline = counted  # type: ignore[assignment]  # counts rebuilds: there must be none
    try:
        loaders = {name: Loader(path, batch_size, train=True, size=max(sizes), workers=workers,
                                layout="channels_last", device="cpu", scaled_decode=scaled)
                   for name, path, scaled in ((LOSSLESS, store, True), (JPEG_SCALED, jpeg_store, True),
                                              (JPEG_FULL, jpeg_store, False))}
        if log:
            print("warming up every loader at every size...", flush=True)

        def measure(name: str, size: int, seconds: float) -> float:
            loaders[name].set_size(size)
            _drain(loaders[name])()  # the epoch where the size changes: the stream restarts
            return _rate(_drain(loaders[name]), seconds)

        for name in loaders:
            for size in sizes:
                measure(name, size, 0.1)
        runs: dict[str, dict[int, list[float]]] = {n: {s: [] for s in sizes} for n in loaders}
        for r in range(rounds):
            for size in sizes:
                for name in loaders:
                    runs[name][size].append(measure(name, size, min_seconds))
            if log:
                print(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{s}px {'/'.join(f'{runs[n][s][-1]:.0f}' for n in loaders)}" for s in sizes), flush=True)
        for loader in loaders.values():
            loader.close()
    finally:
        graph.build_pipeline = real  # type: ignore[assignment]
    result = SizesBenchResult(len(reader), batch_size, workers, reader.tile, sizes, builds=built[0])
    result.rates = {n: {s: statistics.median(v) for s, v in by.items()} for n, by in runs.items()}
    result.decode = _decode_rates(StoreReader(jpeg_store), rounds, min_seconds)
    result.reduced = {size: _reduced_share(jpeg_store, size) for size in sizes}
    return result


def _reduced_share(jpeg_store: Path, size: int) -> float:
    """The share of an epoch's training windows at ``size`` whose tiles decode below full
    size: a window must span ``size`` decoded pixels each way, so only windows of at least
    twice the output side gain."""
    from tilefeed.pipeline.engine.batch_source import decode_scale

    with Loader(jpeg_store, 64, train=True, size=size, device="cpu") as loader:
        samples = np.arange(len(loader.reader))
        start, end, _ = loader.windows(0, samples)
        height, width = loader.reader.codec.shape[:2]
    spans = (end - start).tolist()
    return sum(decode_scale(h, w, size, height, width) > 1 for h, w in spans) / len(spans)
