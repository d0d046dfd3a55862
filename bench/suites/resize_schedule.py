"""``tilefeed bench schedule``: what progressive resizing does to training, at equal wall-clock.

The task of ``tilefeed bench aspect`` (a mark near the border of 4:3 pictures, aspect-true
tiles): one network, from the same seeds, trained two ways for the same time on this machine:
at the full size every epoch, and with FFCV's ramp (``tilefeed.ramp``) from a low size up
to the full one over the run. Low-resolution epochs cost less, so the ramp fits more epochs in
the time. Both are scored on the same whole validation pictures at the full size. The network
is wider than aspect's, so that more of an epoch's time follows the pixels.

The time is planned, not raced: an epoch's training at each size the ramp can take is timed
first (the loop alone: no network built, no validation), the fixed run gets ``epochs`` epochs,
and the ramp the most epochs whose timed costs add up to no more than that (its low size until
70% of them, the full size from 85%, as FFCV's ResNet-50 recipes place their ramps). Each
run's measured wall-clock is reported beside it.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tilefeed.bench.harness.sides import Figure
from tilefeed.bench.suites.aspect import SIDE, WIDTH, _fit, _loader_epoch, _train, _whole, make_dataset
from tilefeed.pipeline.planning.sizes import Ramp, ramp

FIXED, RAMPED = "fixed size", "ramp"
RAMP_START, RAMP_END = 0.70, 0.85  # fractions of the run, as FFCV's ResNet-50 configurations
MAX_EPOCHS = 1000


@dataclass
class ScheduleResult:
    seeds: int
    low: int
    high: int
    epoch_seconds: dict[int, float]  # size -> one training epoch, timed before the runs
    epochs: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, list[int]] = field(default_factory=dict)  # each epoch's size
    accuracy: dict[str, list[float]] = field(default_factory=dict)  # per seed
    seconds: dict[str, list[float]] = field(default_factory=dict)  # measured wall-clock per seed

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        lines = ["one epoch's training at each size (s): " + ", ".join(
                     f"{size} px {s:.2f}" for size, s in self.epoch_seconds.items()),
                 "| training | epochs | sizes | wall-clock s, median | val accuracy, median | range |",
                 "| --- | ---: | --- | ---: | ---: | ---: |"]
        for name in self.accuracy:
            acc, sizes = self.accuracy[name], self.sizes[name]
            shown = f"{sizes[0]}" if len(set(sizes)) == 1 else f"{sizes[0]} ... {sizes[-1]}"
            lines.append(f"| {name} | {self.epochs[name]} | {shown} px | "
                         f"{Figure(self.seconds[name]).median:.1f} | {Figure(acc).cells('.1%')} |")
        return "\n".join(lines)


def network() -> torch.nn.Module:
    """Four convolutions, 32 to 64 channels; fully convolutional, so any input size serves."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 2))


def plan_ramp(costs: dict[int, float], budget: float, low: int, high: int, step: int) -> tuple[int, Ramp]:
    """The most epochs (and their ramp) whose epochs' ``costs`` (seconds by size) add up to at
    most ``budget``; at least one."""
    best = 1, ramp(0, 0, low, high, step)
    for epochs in range(1, MAX_EPOCHS):
        schedule = ramp(round(RAMP_START * epochs), round(RAMP_END * epochs), low, high, step)
        if sum(costs[schedule(e)] for e in range(epochs)) > budget:
            break
        best = epochs, schedule
    return best


def ramp_sizes(low: int, high: int, step: int) -> list[int]:
    """Every size a ramp from ``low`` to ``high`` can take: its ends and the multiples of
    ``step`` between them."""
    return sorted({low, high, *range(-(-(low + 1) // step) * step, high, step)})


def _epoch_seconds(store: Path, size: int, batch: int, epochs: int = 2) -> float:
    """One training epoch at ``size``: the loop alone, the mean of ``epochs`` after one untimed
    epoch (the graph, the maps)."""
    from tilefeed.pipeline import Loader

    with Loader(store, batch, shuffle=True, train=True, size=size) as loader:
        model = network()
        optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
        _fit(model, optimiser, partial(_loader_epoch, loader), range(1))
        began = time.perf_counter()
        _fit(model, optimiser, partial(_loader_epoch, loader), range(1, 1 + epochs))
        return (time.perf_counter() - began) / epochs


def bench_schedule(*, train_count: int = 512, val_count: int = 256, epochs: int = 10, seeds: int = 5,
                   batch: int = 32, low: int = 32, step: int = 16) -> ScheduleResult:
    from tilefeed.pipeline import Loader
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tilefeed.preprocess.settings import Fit
    from tilefeed.store.format import Codec

    high = SIDE
    with tempfile.TemporaryDirectory(prefix="tilefeed-schedule-") as tmp:
        root = Path(tmp)
        train = make_dataset(root / "train", train_count, seed=1)
        val = _whole(make_dataset(root / "val", val_count, seed=2))
        store = root / "store"
        preprocess(train, store, TileSettings(tile=WIDTH, fit=Fit.PAD), StoreSettings(codec=Codec.NONE),
                   workers=1)
        costs = {size: _epoch_seconds(store, size, batch) for size in ramp_sizes(low, high, step)}
        result = ScheduleResult(seeds, low, high, costs)
        ramped, schedule = plan_ramp(costs, epochs * costs[high], low, high, step)
        plans: dict[str, tuple[int, int | Ramp]] = {FIXED: (epochs, high), RAMPED: (ramped, schedule)}
        for name, (count, size) in plans.items():
            result.epochs[name] = count
            result.sizes[name] = [size if isinstance(size, int) else size(e) for e in range(count)]
            result.accuracy[name], result.seconds[name] = [], []
        for seed in range(seeds):
            for name, (count, size) in plans.items():
                with Loader(store, batch, shuffle=True, seed=seed, train=True, size=size) as loader:
                    began = time.perf_counter()
                    result.accuracy[name].append(_train(partial(_loader_epoch, loader), count, seed, val,
                                                        network))
                    result.seconds[name].append(time.perf_counter() - began)
    return result
