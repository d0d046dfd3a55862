"""A store in a bucket against the same store on local disk, behind an emulated far network.

The store is put into a local S3 server (moto) object by object; a proxy in its own process adds
``latency`` to every request and caps each connection at ``rate`` bytes/s. Each round runs two
epochs of the local store, then two of the bucket store on a fresh (cold) cache folder: epoch 1
fetches every shard through the proxy, epoch 2 reads the cache the first one filled. Rounds are
interleaved; medians and ranges are reported. Every figure counts the whole epoch (no warm-up
steps left out), so the cold epoch's first wait is in it. "Loader() ms" is the constructor's time
before epoch 1: opening the store (for the bucket: one listing and the small objects); the DALI
graph itself is built once and reused by later Loaders with the same settings.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from tilefeed.bench.harness.sides import Figure, spread_text
from tilefeed.bench.harness.watch import RunResult, Watch
from tilefeed.bench.fixtures.netem import local_s3, proxy_process, s3_options
from tilefeed.bench.harness.steps import EmulatedStep
from tilefeed.pipeline.loader.loader import Loader
from tilefeed.store.object_storage import ObjectStorage

FIGURES = ("local, epoch 1", "local, epoch 2", "bucket, cold cache", "bucket, warm cache")


@dataclass
class CloudResult:
    """The settings of a cloud run and, per epoch kind (``FIGURES``), the spread over rounds of
    each figure: ``figures`` maps the epoch to ``stall_percent``, ``open_ms`` (None but for an
    epoch 1), ``images_per_s``, ``wait_p95_ms``, ``first_wait_ms``, ``epoch_s``, ``server_cpu_s``
    and, for the bucket's epochs, ``stall_minus_local_pp``; each a ``median``, ``min``, ``max``
    (``Figure.spread``)."""

    store: str
    batch_size: int
    step_ms: float
    latency_ms: float
    rate_mb_per_s_per_connection: float
    shuffle: str
    shuffle_window: int
    rounds: int
    samples: int
    figures: dict[str, dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """The figures as a Markdown table, one row per epoch kind."""
        lines = ["| epoch | stall % (median, range) | stall - local, pp | img/s | Loader() ms | "
                 "first wait ms | wait p95 ms | server+proxy CPU s / epoch s |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, f in self.figures.items():
            stall, rate = f["stall_percent"], f["images_per_s"]
            diff = f.get("stall_minus_local_pp")
            lines.append(
                f"| {name} | {spread_text(stall, '.1f')} | "
                + (spread_text(diff, "+.1f", " to ") if diff else "-")
                + f" | {spread_text(rate, '.0f')} | "
                + (f"{f['open_ms']['median']:.0f}" if f["open_ms"] else "-")
                + f" | {f['first_wait_ms']['median']:.0f} | {f['wait_p95_ms']['median']:.1f} | "
                f"{f['server_cpu_s']['median']:.2f} / {f['epoch_s']['median']:.1f} |")
        return "\n".join(lines)


def _server_cpu_s() -> float:
    """CPU seconds used so far by this process's children: the S3 server and the proxy, which
    share this machine's cores with the loader here (a real bucket's server does not)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _epochs(loader: Loader, opened_s: float, step: EmulatedStep, names: tuple[str, str]) -> list[RunResult]:
    """Two epochs; the first carries ``opened_s``, how long ``Loader()`` took."""
    runs: list[RunResult] = []
    for name in names:
        watch = Watch(loader, name=name, warmup=0, device="cpu")
        before = _server_cpu_s()
        for images, labels in watch:
            step(images, labels)
        run = watch.result()
        run.extra["server_cpu_s"] = _server_cpu_s() - before
        run.extra["open_ms"] = 1000 * opened_s if not runs else None
        runs.append(run)
    return runs


def bench_cloud(store: Path, *, batch_size: int = 64, step_ms: float = 50.0, latency_ms: float = 20.0,
                rate_mb: float = 100.0, workers: int = 2, rounds: int = 3,
                shuffle_window: int = 4) -> CloudResult:
    step = EmulatedStep(step_ms, torch.device("cpu"))
    settings = dict(batch_size=batch_size, shuffle="shard", shuffle_window=shuffle_window, train=True,
                    workers=workers, device="cpu")
    url = "s3://tilefeed/bench"
    results: dict[str, list[RunResult]] = {name: [] for name in FIGURES}
    with local_s3() as endpoint:
        ObjectStorage(url, s3_options(endpoint)).upload_tree(store, last="zarr.json")
        with proxy_process(endpoint, latency=latency_ms / 1000, rate=rate_mb * 1e6) as far:
            for r in range(rounds):
                t = time.perf_counter()
                local = Loader(store, seed=r, **settings)  # type: ignore[arg-type]
                for run in _epochs(local, time.perf_counter() - t, step, FIGURES[:2]):
                    results[run.loader].append(run)
                local.close()
                with tempfile.TemporaryDirectory(prefix="tilefeed-cloud-cache-") as cache:
                    t = time.perf_counter()
                    remote = Loader(url, seed=r, storage_options=s3_options(far),
                                    cache_dir=cache, **settings)  # type: ignore[arg-type]
                    for run in _epochs(remote, time.perf_counter() - t, step, FIGURES[2:]):
                        results[run.loader].append(run)
                    remote.close()
                print(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{name} {runs[-1].stall_fraction:.1%}" for name, runs in results.items()), flush=True)
    table = {name: _summary(runs) for name, runs in results.items()}
    for cache_state, local_name in (("bucket, cold cache", "local, epoch 1"),
                                    ("bucket, warm cache", "local, epoch 2")):
        pairs = zip(results[cache_state], results[local_name], strict=True)
        diffs = [100 * (a.stall_fraction - b.stall_fraction) for a, b in pairs]
        table[cache_state]["stall_minus_local_pp"] = Figure(diffs).spread()
    return CloudResult(store=str(store), batch_size=batch_size, step_ms=step_ms, latency_ms=latency_ms,
                       rate_mb_per_s_per_connection=rate_mb, shuffle="shard", shuffle_window=shuffle_window,
                       rounds=rounds, samples=len(local.reader), figures=table)


def _summary(runs: list[RunResult]) -> dict[str, Any]:
    opened = [r.extra["open_ms"] for r in runs if r.extra["open_ms"] is not None]
    return {"stall_percent": Figure([100 * r.stall_fraction for r in runs]).spread(),
            "open_ms": Figure(opened).spread() if opened else None,
            "images_per_s": Figure([r.samples_per_s for r in runs]).spread(),
            "wait_p95_ms": Figure([r.wait_p95_ms for r in runs]).spread(),
            "first_wait_ms": Figure([r.timeline["wait_ms"][0] for r in runs]).spread(),
            "epoch_s": Figure([r.wall_s for r in runs]).spread(),
            "server_cpu_s": Figure([r.extra["server_cpu_s"] for r in runs]).spread()}

