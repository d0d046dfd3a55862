"""``tilefeed bench diagnose``: is training input-bound, and which lever helps?"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from tilefeed.bench.harness.watch import measure
from tilefeed.bench.peers.loaders import RowSettings, build_loader
from tilefeed.bench.harness.steps import EmulatedStep


@dataclass
class Diagnosis:
    """The loader's rate alone, the step's, the verdict, and each lever tried or named."""

    loader: str
    loader_img_per_s: float
    step_img_per_s: float
    input_bound: bool
    lines: list[str] = field(default_factory=list)  # the report, line by line

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """The report: both rates, the verdict and the levers."""
        return "\n".join(self.lines)


def _loader_alone(name: str, s: RowSettings, steps: int, warmup: int) -> float:
    run = measure(build_loader(name, s), EmulatedStep(0, s.device), steps=steps, warmup=warmup,
                  name=name, device=s.device)
    return run.samples_per_s


def _step_alone(step: Any, s: RowSettings, steps: int, warmup: int) -> float:
    images = torch.zeros(s.batch_size, 3, s.size, s.size, device=s.device)
    labels = torch.zeros(s.batch_size, dtype=torch.int64, device=s.device)
    run = measure(itertools.repeat((images, labels)), step, steps=steps, warmup=warmup,
                  name="step alone", device=s.device)
    return s.batch_size / (run.step_median_ms / 1000) if run.step_median_ms else float("inf")


def diagnose(name: str, s: RowSettings, step: Any, *, steps: int, warmup: int) -> Diagnosis:
    """Loader ``name`` alone and ``step`` alone; when the loader cannot keep up, the levers."""
    feed = _loader_alone(name, s, steps, warmup)
    need = _step_alone(step, s, steps, warmup)
    lines = [f"loader '{name}' alone: {feed:.0f} img/s",
             f"step alone ({step.describe()}): {need:.0f} img/s"]
    found = Diagnosis(name, feed, need, input_bound=feed < need, lines=lines)
    if feed >= need:
        lines.append(f"verdict: not input-bound: the loader supplies {feed / need:.1f}x what the "
                     "step consumes; look at the step, not the data.")
        return found
    lines.append(f"verdict: input-bound: the step could take {need:.0f} img/s but gets {feed:.0f}; "
                 f"expected stall about {1 - feed / need:.0%} of each step's time.")
    levers = []
    more = _loader_alone(name, replace(s, workers=s.workers * 2), steps, warmup)
    levers.append((more, f"twice the workers ({s.workers * 2}): {more:.0f} img/s"))
    if name in ("baseline", "dali-files", "tiles-dataloader") and s.store is not None:
        tiles = _loader_alone("tilefeed", s, steps, warmup)
        levers.append((tiles, f"preprocess to tiles (tilefeed Loader on {s.store}): {tiles:.0f} img/s"))
    for rate, text in sorted(levers, reverse=True):
        lines.append(f"lever: {text}" + ("  <- enough" if rate >= need else ""))
    if s.device.type == "cuda":
        lines.append("lever: GPU decoding: preprocess with --codec jpeg, the Loader then decodes "
                     "with nvJPEG and augments on the device")
    else:
        lines.append("lever: GPU decoding and augmentation (not measurable here: no CUDA device)")
    lines.append("lever: deeper prefetch (Loader(prefetch=...)) only smooths bursts: it cannot lift "
                 "a loader whose average rate is below the step's")
    return found
