"""What a rank's epoch order costs at scale: seconds and memory (``pipeline.planning.order``).

``order_cost(400_000_000, 64)`` measures, in a fresh Python process so that nothing this
process holds counts, three things a Loader on one rank does each epoch:

* ``order``: its order of a fresh epoch (``rank_indices`` of the epoch's ``EpochOrder``);
* ``resume``: its share of what is left after an elastic resume: the epoch saved at
  ``world_size`` with half its batches delivered, resumed at ``world_size // 2``;
* ``ledger``: packing that share into its ledger record (``Ledger.record``'s encoding).

Memory is the growth of the process's peak resident set over the stage: the peak is reset
before each stage (``/proc/self/clear_refs``) and read from ``/proc/self/status`` after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

SHARD_SIZE = 1024  # tiles per shard: the preprocess default
WINDOW = 4  # shards mixed at a time under shuffle="shard": the Loader's default
STAGES = {
    "order": "one rank's order of the epoch",
    "resume": "its share after an elastic resume",
    "ledger": "packing its ledger record",
}


@dataclass
class OrderCost:
    """One rank's order costs: the run's settings, and per stage (``STAGES``) its ``seconds``,
    ``peak_mib`` (peak resident growth) and ``items`` (samples, or bytes of the ledger record)."""

    samples: int
    world_size: int
    resumed_world_size: int
    rank: int
    shuffle: str
    batch_size: int
    seed: int
    saved_batches: int
    peak_reset: bool  # False: the kernel kept the peak, so each stage's includes the ones before
    baseline_mib: float
    stages: dict[str, dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """The figures as a table, one row per stage."""
        lines = [f"order cost: {self.samples:,} samples, world size {self.world_size} "
                 f"(resumed at {self.resumed_world_size} after {self.saved_batches:,} batches), "
                 f"rank {self.rank}, shuffle={self.shuffle}, batch {self.batch_size}"]
        row = "{:<36}  {:>13}  {:>8}  {:>9}"
        lines.append(row.format("stage", "samples/bytes", "seconds", "peak MiB"))
        for name, title in STAGES.items():
            s = self.stages[name]
            lines.append(row.format(title, f"{s['items']:,}", f"{s['seconds']:.2f}", f"{s['peak_mib']:.1f}"))
        if not self.peak_reset:
            lines.append("(the kernel refused to reset the peak: each stage's figure includes the ones before)")
        return "\n".join(lines)


def order_cost(samples: int, world_size: int, *, shuffle: str = "global", rank: int = 0,
               batch_size: int = 256, seed: int = 0) -> OrderCost:
    """Seconds and peak memory growth (MiB) of each stage, measured in a fresh subprocess."""
    args = dict(samples=samples, world_size=world_size, shuffle=shuffle, rank=rank,
                batch_size=batch_size, seed=seed)
    code = ("import json, sys; from tilefeed.bench.suites.order_cost import _measure; "
            f"print(json.dumps(_measure(**json.loads({json.dumps(args)!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"order_cost child failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return OrderCost(**json.loads(done.stdout.strip().splitlines()[-1]))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> bool:
    """Start the peak resident set (VmHWM) afresh; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measure(samples: int, world_size: int, shuffle: str, rank: int, batch_size: int,
             seed: int) -> dict[str, Any]:
    """The child's side of ``order_cost``: everything imported before the first stage."""
    import gc
    import time

    from tilefeed.pipeline.audit.ledger import _pack
    from tilefeed.pipeline.planning.order import Segment, batches_per_rank, epoch_order, rank_indices

    resumed_world = max(1, world_size // 2)
    half = batches_per_rank(samples, world_size, batch_size, False) // 2
    saved = Segment(world_size, batch_size, False, half)
    stages: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    reset = True

    def stage(name: str, work: Any) -> None:
        nonlocal reset
        gc.collect()
        reset = _reset_peak() and reset
        before = _status_kib("VmRSS")
        began = time.perf_counter()
        out = work()
        seconds = time.perf_counter() - began
        peak = _status_kib("VmHWM")
        kept[name] = out
        stages[name] = {"seconds": seconds, "peak_mib": max(0, peak - before) / 1024, "items": len(out)}

    def order() -> Any:
        made = epoch_order(samples, shuffle=shuffle, seed=seed, epoch=0, shard_size=SHARD_SIZE, window=WINDOW)
        return rank_indices(made, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=False)

    def resume() -> Any:
        made = epoch_order(samples, shuffle=shuffle, seed=seed, epoch=0, shard_size=SHARD_SIZE, window=WINDOW)
        return rank_indices(made, rank=min(rank, resumed_world - 1), world_size=resumed_world,
                            batch_size=batch_size, drop_last=False, after=[saved])

    stage("order", order)
    kept.pop("order")  # a Loader holds one share at a time per epoch
    stage("resume", resume)
    stage("ledger", lambda: _pack(kept["resume"]))
    return {"samples": samples, "world_size": world_size, "resumed_world_size": resumed_world,
            "rank": rank, "shuffle": shuffle, "batch_size": batch_size, "seed": seed,
            "saved_batches": saved.batches, "peak_reset": reset, "baseline_mib": _status_kib("VmRSS") / 1024,
            "stages": stages}


if __name__ == "__main__":  # python -m tilefeed.bench.suites.order_cost SAMPLES WORLD [SHUFFLE]
    print(order_cost(int(sys.argv[1]), int(sys.argv[2]),
                     shuffle=sys.argv[3] if len(sys.argv) > 3 else "global").table())
