"""``tilefeed bench detection``: boxes and masks through the Loader and through a DataLoader with
torchvision v2's detection transforms, on the same samples.

Both sides train on the same geometry: a random-resized crop to ``--size`` and a horizontal flip,
with each image's boxes (and instance masks) following the pixels and sanitised as
``SanitizeBoundingBoxes``. The Loader reads a store preprocessed from the COCO-format folder with
its annotations (``--annotations``, instance masks on); the DataLoader reads the folder and the
JSON through ``CocoDetection`` wrapped for transforms v2 (``bench.peers.torchvision_detection``,
``num_workers`` = cores, as its users run it). Rounds interleaved, medians and ranges: images/s
with no step, and the stall at an emulated step (``--step-ms``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilefeed.bench.harness.steps import EmulatedStep
from tilefeed.bench.harness.watch import RunResult, measure
from tilefeed.bench.peers.torchvision_detection import detection_dataloader
from tilefeed.bench.harness.sides import DATALOADER, LOADER, Figure, SideBySide, figures
from tilefeed.pipeline import Loader
from tilefeed.pipeline.device import default_device
from tilefeed.store.host import usable_cores



@dataclass
class DetectionResult(SideBySide):
    """Both sides' figures (``SideBySide``); ``runs`` keeps every measured run's."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetectionResult:
        """The result again from ``as_dict``'s data (what ``--out`` wrote)."""
        return cls(data["step_ms"], figures(data["rate"]), figures(data["stall"]), data["settings"],
                   data.get("runs", []))

    def table(self) -> str:
        """Both sides' images/s and stall, and the ratio."""
        s = self.settings
        targets = "boxes and masks" if s["masks"] else "boxes"
        return "\n".join(self.rows(f"detection ({targets}), {s['rounds']} interleaved rounds (median, range), "
                                   f"batch {s['batch_size']}, random-resized crop to {s['size']} and flip:"))


def bench_detection(images: Path, annotations: Path, store: Path, *, batch_size: int = 32, size: int = 320,
                    workers: int | None = None, masks: bool = True, step_ms: float = 50.0, steps: int = 30,
                    rounds: int = 3) -> DetectionResult:
    """Measure both sides, rounds interleaved.

    Parameters
    ----------
    images : Path
        The COCO-format image folder (the DataLoader's input).
    annotations : Path
        Its instances JSON.
    store : Path
        The store preprocessed from them with the annotations (the Loader's input).
    batch_size : int, default 32
        Images per batch on both sides.
    size : int, default 320
        The output side (SSDlite's 320).
    workers : int, optional
        DataLoader processes and Loader threads; default the usable cores.
    masks : bool, default True
        Instance masks as well as boxes.
    step_ms : float, default 50
        The emulated step the stall is measured at.
    steps : int, default 30
        Steps measured per run (after two of warm-up).
    rounds : int, default 3
        Interleaved rounds; figures are medians and ranges.

    Returns
    -------
    DetectionResult
    """
    workers = usable_cores() if workers is None else workers
    device = default_device()
    targets = ("boxes", "masks") if masks else ("boxes",)

    def side(name: str) -> Iterable[Any]:
        if name == DATALOADER:
            return detection_dataloader(images, annotations, batch_size, size=size, workers=workers,
                                        masks=masks, pin_memory=device.type == "cuda")
        return Loader(store, batch_size, shuffle=True, train=True, size=size, num_workers=workers,
                      targets=targets, device=device)

    def run(name: str, ms: float) -> RunResult:
        loader = side(name)
        try:
            return measure(loader, EmulatedStep(ms, device), steps=steps, warmup=2, name=name, device=device)
        finally:
            close: Callable[[], None] | None = getattr(loader, "close", None)
            if close is not None:
                close()

    rate: dict[str, list[float]] = {LOADER: [], DATALOADER: []}
    stall: dict[str, list[float]] = {LOADER: [], DATALOADER: []}
    runs = []
    for r in range(rounds):
        for name in (LOADER, DATALOADER) if r % 2 == 0 else (DATALOADER, LOADER):
            fast, stepped = run(name, 0.0), run(name, step_ms)
            rate[name].append(fast.samples_per_s)
            stall[name].append(stepped.stall_fraction)
            runs += [{"round": r, "loader": name, "step_ms": ms, "samples_per_s": res.samples_per_s,
                      "stall": res.stall_fraction, "samples": res.samples}
                     for ms, res in ((0.0, fast), (step_ms, stepped))]
    settings = {"batch_size": batch_size, "size": size, "workers": workers, "masks": masks, "steps": steps,
                "rounds": rounds, "cores": usable_cores(), "images": str(images), "store": str(store),
                "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
                "torch": torch.__version__}
    return DetectionResult(step_ms, {k: Figure(v) for k, v in rate.items()},
                           {k: Figure(v) for k, v in stall.items()}, settings, runs)
