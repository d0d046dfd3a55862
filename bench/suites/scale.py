"""``tilefeed bench scale``: what the writer, the reader and the order cost as a store grows.

An ImageNet-shaped source set (class folders of tiny JPEGs, so that bookkeeping rather than
decoding is what is timed) is preprocessed at two or more sizes; per size the bench reports the
writer driver's peak resident memory and CPU per source, the time and resident growth of opening
the store, the random-order uint8 rate of a Loader and the read path's CPU per sample under it,
and the time of ``tilefeed info`` and ``tilefeed verify``. Each figure is taken in a fresh
process, so one size's caches do not help another's, but the rates: one process times every
size's Loader in turn, so that they share the machine's moments. Per-source growth is the
difference between sizes, divided by the sources added.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.bench.harness.sides import Figure, range_text
from tilefeed.bench.suites.order_cost import OrderCost

JPEG_SIDE = 16  # tiny: decoding must not be what is timed


@dataclass
class ScaleRow:
    """One size's figures, each taken in a fresh process but the rates."""

    writer: dict[str, Any]  # sources, peak_bytes, cpu_s, wall_s, us_per_source
    open: dict[str, Any]  # seconds, growth_bytes, samples
    read: dict[str, float]  # cpu_us, faults: per sample, random batches, every page mapped
    info_s: float
    verify_s: float
    store: str
    rates: list[float] = field(default_factory=list)  # samples/s per round, the stores in turn


@dataclass
class ScaleResult:
    """Every size's row, the settings they share and, when measured, one rank's epoch order at
    scale (``order_cost``), one per shuffle."""

    rows: list[ScaleRow]
    batch_size: int
    size: int
    workers: int
    order: list[OrderCost] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """A Markdown table, one column per size and one for the growth per added source; then
        each order's table."""
        return "\n\n".join([self._sizes_table(), *(order.table() for order in self.order)])

    def _sizes_table(self) -> str:
        rows = self.rows
        first = rows[0]
        heads = " | ".join(f"{r.writer['sources']:,} sources" for r in rows)
        lines = [f"| | {heads} | per added source |",
                 "|---|" + "---|" * (len(rows) + 1)]

        def line(name: str, cells: list[str], per: str = "") -> None:
            lines.append(f"| {name} | {' | '.join(cells)} | {per} |")

        def per_source(key: Any, unit: str = "bytes", scale: float = 1.0) -> str:
            last = rows[-1]
            added = last.writer["sources"] - first.writer["sources"]
            return f"{(key(last) - key(first)) * scale / added:.1f} {unit}" if added else ""

        line("writer driver peak RSS", [f"{r.writer['peak_bytes'] / 1e6:.0f} MB" for r in rows],
             per_source(lambda r: r.writer["peak_bytes"]))
        line("writer driver CPU per source", [f"{r.writer['us_per_source']:.1f} µs" for r in rows],
             per_source(lambda r: r.writer["cpu_s"], "µs", 1e6))
        line("writer wall time", [f"{r.writer['wall_s']:.0f} s" for r in rows])
        line("`StoreReader` open: time, resident growth",
             [f"{r.open['seconds'] * 1e3:.0f} ms, +{r.open['growth_bytes'] / 1e6:.1f} MB" for r in rows],
             per_source(lambda r: r.open["growth_bytes"]))

        def against_first(runs: list[float]) -> str:
            ratios = Figure([mine / base for mine, base in zip(runs, first.rates, strict=True)])
            return f"{ratios.median:.2f}x ({range_text(ratios.bounds, '.2f')})"

        line(f"Loader uint8, batch {self.batch_size}, random order, {self.size} px tiles, "
             "in turn in one process: samples/s, median (range); against the first store, median of "
             "the rounds' ratios (range)",
             [f"{Figure(r.rates).text(',.0f')}, {against_first(r.rates)}" for r in rows])
        line("read path alone, random batches once every page is mapped: CPU per sample, page faults",
             [f"{r.read['cpu_us']:.2f} µs, {r.read['faults']:.3f}" for r in rows])
        line("`tilefeed info` / `tilefeed verify`", [f"{r.info_s:.1f} s / {r.verify_s:.1f} s" for r in rows])
        return "\n".join(lines)


def linked_image_folder(root: Path, *, classes: int, per_class: int) -> Path:
    """``classes`` folders of ``per_class`` files each, every file of a class a hard link to the
    class's one distinct tiny JPEG: a million sources in seconds and a few megabytes of disk.
    A folder already complete (its marker written last) is reused."""
    marker = root / ".complete"
    if marker.exists():
        return root
    from PIL import Image

    rng = np.random.default_rng(classes)
    for c in range(classes):
        folder = root / f"class_{c:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        first = folder / "img_00000.jpg"
        if not first.exists():
            pixels = rng.integers(0, 256, (JPEG_SIDE, JPEG_SIDE, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=90)
            first.write_bytes(buf.getvalue())
        for i in range(1, per_class):
            path = folder / f"img_{i:05d}.jpg"
            if not path.exists():
                os.link(first, path)
    marker.write_text(f"{classes} x {per_class}\n")
    return root


def _ticks(pid: int) -> tuple[int, float]:
    """(peak resident bytes, CPU seconds) of process ``pid`` itself, not its children."""
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return peak, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def driver_cost(command: list[str], poll: float = 0.05) -> dict[str, float]:
    """Run ``command``; its own peak resident memory and CPU time, read from /proc until it
    exits (its workers are its children and are not counted), and the wall time."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, cpu = 0, 0.0
    while proc.poll() is None:
        try:
            peak, cpu = _ticks(proc.pid)
        except (OSError, StopIteration, IndexError):
            pass  # exiting between the poll and the read: the last reading stands
        time.sleep(poll)
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {err.strip()[-2000:]}")
    return {"peak_bytes": peak, "cpu_s": cpu, "wall_s": time.perf_counter() - began}


_OPEN = """
import json, sys, time
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmRSS:'))
from tilefeed.pipeline.reading.reader import StoreReader
import numpy
before = rss(); began = time.perf_counter()
reader = StoreReader(sys.argv[1])
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "growth_bytes": rss() - before, "samples": len(reader)}))
"""

_RATES = """
import json, sys, time
import torch
from tilefeed.pipeline import Loader
batch, warm, timed, rounds = (int(v) for v in sys.argv[1:5])
loaders = [Loader(store, batch, shuffle=True, dtype=torch.uint8, num_workers=2, stats=False)
           for store in sys.argv[5:]]
def window(loader, batches):
    # the first batches of a fresh epoch, so every store's window starts an epoch alike
    epoch, began, done = iter(loader), time.perf_counter(), 0
    for _ in zip(range(batches), epoch):
        done += 1
    seconds = time.perf_counter() - began
    epoch.close()
    return done * batch / seconds
for loader in loaders:
    window(loader, warm)  # the graph, the first maps
rates = [[] for _ in loaders]
for r in range(rounds):
    lead = r % len(loaders)  # the lead changes every round
    for k in [*range(lead, len(loaders)), *range(lead)]:
        rates[k].append(window(loaders[k], timed))
for loader in loaders:
    loader.close()
print(json.dumps({"rates": rates}))
"""


_READ = """
import json, resource, sys, time
import numpy as np
from tilefeed.pipeline.reading.reader import StoreReader
reader = StoreReader(sys.argv[1])
n, batch = len(reader), 256
out = np.empty((batch, reader.tile, reader.tile, 3), np.uint8)
for start in range(0, n, batch):  # every shard mapped and every page touched once
    idx = list(range(start, min(n, start + batch)))
    reader.read_batch_into(idx, out[: len(idx)])
rng = np.random.default_rng(0)
faults, cpu, done = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), 0
while done < 400_000:
    reader.read_batch_into(rng.integers(0, n, batch).tolist(), out)
    done += batch
print(json.dumps({"cpu_us": 1e6 * (time.process_time() - cpu) / done,
                  "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / done}))
"""


def _child(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise RuntimeError(f"measurement failed: {out.stderr.strip()[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True)
    return time.perf_counter() - began


def build(sources: Path, store: Path, *, size: int, workers: int) -> dict[str, Any]:
    """Preprocess ``sources`` afresh: the driver's peak memory and CPU per source. A store
    already there goes first (the same command would find it up to date and reuse it)."""
    if store.exists():
        shutil.rmtree(store)
    count = sum(1 for _ in sources.glob("*/*.jpg"))
    write = driver_cost([sys.executable, "-m", "tilefeed", "preprocess", str(sources), str(store),
                         "--tile", str(size), "--codec", "lz4", "--processes", str(workers),
                         "--quiet"])
    return {"sources": count, **write, "us_per_source": 1e6 * write["cpu_s"] / count}


def open_cost(store: Path) -> dict[str, Any]:
    """Opening the store in a fresh process, after one open on the node has checked it."""
    _child(_OPEN, str(store))
    return _child(_OPEN, str(store))


def rates(stores: list[Path], *, batch_size: int, warm: int, timed: int, rounds: int) -> list[list[float]]:
    """Random-order uint8 samples/s per store: one process holds a Loader over each store and
    times the first ``timed`` batches of a fresh epoch of each in turn, round after round, the
    lead changing (a busy moment of a shared machine then falls on every size alike; rates of
    processes run one after another differed more between runs than the stores did). Each
    window starts an epoch, so no store's window holds an epoch's end and another's none."""
    found = _child(_RATES, str(batch_size), str(warm), str(timed), str(rounds), *map(str, stores))
    return [list(map(float, runs)) for runs in found["rates"]]


def run_scale(root: Path, classes: list[int], *, per_class: int, size: int, workers: int,
              batch_size: int, warm: int, timed: int, rounds: int) -> ScaleResult:
    """Each of ``classes`` (class folders of ``per_class`` sources) made under ``root`` and
    preprocessed at ``size`` px; every size's figures, the rates last, in one process."""
    rows: list[ScaleRow] = []
    for count in classes:
        sources = linked_image_folder(root / f"sources-{count}x{per_class}", classes=count,
                                      per_class=per_class)
        store = root / f"store-{count}x{per_class}-{size}"
        print(f"{count * per_class:,} sources: preprocessing into {store}", file=sys.stderr, flush=True)
        writer = build(sources, store, size=size, workers=workers)
        rows.append(ScaleRow(writer=writer, open=open_cost(store), read=_child(_READ, str(store)),
                             info_s=_timed([sys.executable, "-m", "tilefeed", "info", str(store)]),
                             verify_s=_timed([sys.executable, "-m", "tilefeed", "verify", str(store)]),
                             store=str(store)))
    print("random-order rates, the stores in turn", file=sys.stderr, flush=True)
    for row, runs in zip(rows, rates([Path(r.store) for r in rows], batch_size=batch_size,
                                     warm=warm, timed=timed, rounds=rounds), strict=True):
        row.rates = runs
    return ScaleResult(rows=rows, batch_size=batch_size, size=size, workers=workers)

