"""``tilefeed bench parts``: the measurements behind the CPU path's design, side by side.

Each pair is measured in one run on this machine, so the README's reasons can be checked here:

- batch memory: filling a fresh batch array, numpy's or torch's (while a few earlier batches
  are still held, as in a training loop), against filling a reused one;
- window resize: cutting and resizing training windows with pillow-simd on one thread against
  DALI's CPU ``fn.resize`` on all cores;
- JPEG decode: DALI's CPU decoder and simplejpeg in reader threads, on the same threads and
  the store's JPEG tiles, with libjpeg-turbo's accurate and fast IDCT (``fast_idct``, FFCV's);
- epoch starts: the uint8 Loader's first batch of an epoch against its other batches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class PartsResult:
    """Each pair's figures (name -> value, the unit in the name), on ``batch_size`` tiles of
    ``store`` with ``threads`` threads."""

    store: str
    batch_size: int
    threads: int
    batch_memory: dict[str, float]
    window_resize: dict[str, float]
    jpeg_decode: dict[str, float]
    epoch_starts: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """One line per part, its figures side by side."""
        lines = [f"{self.store}: batches of {self.batch_size} tiles, {self.threads} threads"]
        for part, figures in self.as_dict().items():
            if isinstance(figures, dict):
                lines.append(f"{part}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))
        return "\n".join(lines)


def _best_per_s(work: Callable[[], int], rounds: int) -> float:
    """Items per second of ``work`` (which returns how many it did), best of ``rounds``."""
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        n = work()
        best = max(best, n / (time.perf_counter() - start))
    return best


def _batch_memory(tiles: np.ndarray, rounds: int) -> dict[str, float]:
    """ms to fill one batch array: a fresh numpy one, a fresh torch one, or a reused one."""
    import torch

    reused = np.empty_like(tiles)
    held: list[Any] = []

    def fresh(make: Callable[[], np.ndarray]) -> Callable[[], int]:
        def fill() -> int:
            for _ in range(20):
                out = make()
                np.copyto(out, tiles)
                held.append(out)
                del held[:-3]  # a loop holds a few batches: their memory cannot simply come back
            return 20
        return fill

    def reuse() -> int:
        for _ in range(20):
            np.copyto(reused, tiles)
        return 20

    return {"fresh_numpy_ms": 1000 / _best_per_s(fresh(lambda: np.empty_like(tiles)), rounds),
            "fresh_torch_ms": 1000 / _best_per_s(
                fresh(lambda: torch.empty(tiles.shape, dtype=torch.uint8).numpy()), rounds),
            "reused_ms": 1000 / _best_per_s(reuse, rounds)}


def _windows(n: int, side: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    start = rng.uniform(0, side / 3, (n, 2)).astype(np.float32)
    return start, start + rng.uniform(side / 3, side / 1.5, (n, 2)).astype(np.float32)


def _resize(tiles: np.ndarray, rounds: int, threads: int) -> dict[str, float]:
    from nvidia.dali import fn, pipeline_def, types
    from PIL import Image

    n, side = len(tiles), tiles.shape[1]
    start, end = _windows(n, side, np.random.default_rng(0))

    def pillow() -> int:
        for k in range(n):
            (y0, x0), (y1, x1) = start[k].tolist(), end[k].tolist()
            picture = Image.frombuffer("RGB", (side, side), tiles[k], "raw", "RGB", 0, 1)
            np.asarray(picture.resize((side, side), Image.Resampling.BILINEAR, box=(x0, y0, x1, y1)))
        return n

    batch = (list(tiles), list(start), list(end))

    @pipeline_def(batch_size=n, num_threads=threads, device_id=None, prefetch_queue_depth=1)
    def graph() -> Any:
        images, lo, hi = fn.external_source(source=lambda: batch, num_outputs=3, batch=True,
                                            layout=["HWC", None, None],
                                            dtype=[types.UINT8, types.FLOAT, types.FLOAT])
        return fn.resize(images, size=[side, side], roi_start=lo, roi_end=hi, roi_relative=False,
                         antialias=True)

    pipe = graph()
    pipe.build()
    pipe.run()

    def dali() -> int:
        pipe.run()
        return n

    return {"pillow_simd_us_per_tile_1_thread": 1e6 / _best_per_s(pillow, rounds),
            f"dali_cpu_tiles_per_s_{threads}_threads": _best_per_s(dali, rounds)}


def _jpeg_decode(tiles: np.ndarray, rounds: int, threads: int) -> dict[str, float]:
    """The store's JPEG tiles (q90, 4:4:4) decoded by DALI's CPU decoder and by simplejpeg
    (straight into a batch array), both on ``threads`` threads, with either IDCT."""
    from nvidia.dali import fn, pipeline_def, types

    from tilefeed.store.codec import TileCodec, decode_jpeg

    codec = TileCodec("jpeg", tiles.shape[1], 90)
    encoded = [np.frombuffer(codec.encode(tile)[:-4], np.uint8) for tile in tiles]
    n, batch = len(encoded), np.empty_like(tiles)
    pool = ThreadPoolExecutor(threads)
    out = {}
    for idct in ("accurate", "fast"):
        fast = idct == "fast"

        @pipeline_def(batch_size=n, num_threads=threads, device_id=None, prefetch_queue_depth=1)
        def graph(fast: bool = fast) -> Any:
            raw = fn.external_source(source=lambda: encoded, batch=True, dtype=types.UINT8)
            return fn.decoders.image(raw, device="cpu", output_type=types.RGB, use_fast_idct=fast)

        pipe = graph()
        pipe.build()
        pipe.run()

        def dali(pipe: Any = pipe) -> int:
            for _ in range(10):
                pipe.run()
            return 10 * n

        def share(t: int, fast: bool = fast) -> None:
            for k in range(t, n, threads):
                decode_jpeg(encoded[k].data, batch[k], fast)

        def simplejpeg() -> int:
            for _ in range(10):
                list(pool.map(share, range(threads)))
            return 10 * n

        out[f"dali_cpu_{idct}_idct_img_per_s"] = _best_per_s(dali, rounds)
        out[f"simplejpeg_{idct}_idct_img_per_s"] = _best_per_s(simplejpeg, rounds)
    pool.shutdown()
    return out


def _epoch_starts(store: Path, batch_size: int, workers: int, epochs: int) -> dict[str, float]:
    import torch

    from tilefeed.pipeline import Loader

    first, rest = [], []
    with Loader(store, batch_size, shuffle=True, dtype=torch.uint8, layout="NHWC", workers=workers,
                device="cpu") as loader:
        for _ in loader:  # warm: maps, buffers
            pass
        for _ in range(epochs):
            start = time.perf_counter()
            batches = iter(loader)
            next(batches)
            first.append(time.perf_counter() - start)
            start, n = time.perf_counter(), sum(1 for _ in batches)
            rest.append((time.perf_counter() - start) / max(1, n))
    return {"first_batch_ms": 1000 * statistics.median(first),
            "other_batches_ms": 1000 * statistics.median(rest)}


def bench_parts(store: Path, *, batch_size: int = 64, workers: int = 2, rounds: int = 5) -> PartsResult:
    """Every measurement above on ``store`` (a lossless store of whole tiles)."""
    from tilefeed.pipeline import StoreReader

    with StoreReader(store) as reader:
        tiles = np.stack([reader.read(i) for i in range(min(batch_size, len(reader)))])
    return PartsResult(store=str(store), batch_size=len(tiles), threads=workers,
                       batch_memory=_batch_memory(tiles, rounds),
                       window_resize=_resize(tiles, rounds, workers),
                       jpeg_decode=_jpeg_decode(tiles, rounds, workers),
                       epoch_starts=_epoch_starts(store, batch_size, workers, epochs=rounds))

