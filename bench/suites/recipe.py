"""``tilefeed bench recipe``: torchvision's ResNet-50 recipe through the Loader and through the
DataLoader its reference script builds, on the same samples.

The recipe (``--auto-augment ta_wide --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0
--train-crop-size 176``) reaches the Loader through ``pipeline.recipe.adapters.torchvision_options``,
the adapter a swapped ``train.py`` calls, and the DataLoader through
``bench.peers.torchvision_recipe`` (``presets.py``'s transforms, its collate's MixUp/CutMix,
``num_workers`` = cores). Two measurements, rounds interleaved, medians and ranges:

- the whole recipe: images/s with no step (how fast each side can feed) and the stall at an
  emulated step (``--step-ms``, 50 by default);
- what each operation costs: images/s with no step for the recipe's crop and flip alone, then with
  each operation added alone, then all of them, on each side.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tilefeed.bench.harness.sides import DATALOADER, LOADER, Figure, SideBySide, figures
from tilefeed.bench.harness.steps import EmulatedStep
from tilefeed.bench.harness.watch import RunResult, measure
from tilefeed.bench.peers.torchvision_recipe import RecipeFlags, recipe_dataloader
from tilefeed.pipeline import Loader
from tilefeed.pipeline.device import default_device
from tilefeed.pipeline.recipe.adapters import torchvision_options
from tilefeed.store.host import usable_cores

RESNET50 = RecipeFlags()  # torchvision's ResNet-50 recipe
# each operation alone on top of the crop and flip, then the whole recipe
OPERATIONS: dict[str, dict[str, Any]] = {
    "crop + flip": {"auto_augment": None, "random_erase": 0.0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0},
    "+ TrivialAugmentWide": {"random_erase": 0.0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0},
    "+ random erasing 0.1": {"auto_augment": None, "mixup_alpha": 0.0, "cutmix_alpha": 0.0},
    "+ mixup/cutmix": {"auto_augment": None, "random_erase": 0.0},
    "whole recipe": {},
}


def script_args(flags: RecipeFlags, *, batch_size: int, workers: int) -> argparse.Namespace:
    """The namespace torchvision's reference ``train.py`` would hold for these flags."""
    return argparse.Namespace(
        batch_size=batch_size, workers=workers, train_crop_size=flags.crop, val_resize_size=232,
        val_crop_size=224, interpolation="bilinear", auto_augment=flags.auto_augment,
        ra_magnitude=9, augmix_severity=3, random_erase=flags.random_erase,
        mixup_alpha=flags.mixup_alpha, cutmix_alpha=flags.cutmix_alpha, ra_sampler=False, ra_reps=3,
        backend="pil", use_v2=True, label_smoothing=0.1)


@dataclass(kw_only=True)
class RecipeResult(SideBySide):
    """Both measurements, per side: the whole recipe (``SideBySide``) and each operation's cost.

    Attributes
    ----------
    flags : RecipeFlags
        The recipe measured.
    operations : dict of str to dict of str to Figure
        Operation row -> side -> images/s with no step.
    """

    flags: RecipeFlags
    operations: dict[str, dict[str, Figure]]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecipeResult:
        """The result again from ``as_dict``'s data (what ``--out`` wrote)."""
        return cls(step_ms=data["step_ms"], rate=figures(data["rate"]), stall=figures(data["stall"]),
                   settings=data["settings"], runs=data.get("runs", []), flags=RecipeFlags(**data["flags"]),
                   operations={op: figures(sides) for op, sides in data["operations"].items()})

    def table(self) -> str:
        """The whole recipe's figures, then each operation's cost."""
        lines = self.rows(f"torchvision's ResNet-50 recipe, {self.settings['rounds']} interleaved rounds "
                          f"(median, range), batch {self.settings['batch_size']}, crop {self.flags.crop}:")
        if self.operations:
            lines += ["", "what each operation costs (img/s, no step):",
                      f"| operations | {LOADER} | {DATALOADER} |", "| --- | ---: | ---: |"]
        for name, sides in self.operations.items():
            lines.append(f"| {name} | {sides[LOADER].text(',.0f')} | {sides[DATALOADER].text(',.0f')} |")
        return "\n".join(lines)


def bench_recipe(images: Path, store: Path, *, classes: int, batch_size: int = 64,
                 workers: int | None = None, step_ms: float = 50.0, steps: int = 40, rounds: int = 3,
                 flags: RecipeFlags = RESNET50, operations: bool = True) -> RecipeResult:
    """Measure the recipe through both sides, rounds interleaved.

    Parameters
    ----------
    images : Path
        The source image folder (the DataLoader's input).
    store : Path
        The store preprocessed from it (the Loader's input).
    classes : int
        Classes of the soft targets mixup and cutmix give.
    batch_size : int, default 64
        Samples per batch on both sides.
    workers : int, optional
        DataLoader processes and Loader threads; default the usable cores, as users of each run them.
    step_ms : float, default 50
        The emulated step the stall is measured at.
    steps : int, default 40
        Steps measured per run (after two of warm-up).
    rounds : int, default 3
        Interleaved rounds; figures are medians and ranges.
    flags : RecipeFlags
        The recipe (torchvision's ResNet-50 recipe by default).
    operations : bool, default True
        Also measure each operation alone.

    Returns
    -------
    RecipeResult
    """
    workers = usable_cores() if workers is None else workers
    device = default_device()  # a GPU where there is one (make gpu-check), else the CPU

    def side(name: str, chosen: RecipeFlags) -> Iterable[Any]:
        if name == DATALOADER:
            return recipe_dataloader(images, batch_size, workers=workers, flags=chosen, classes=classes,
                                     pin_memory=device.type == "cuda")
        options = torchvision_options(script_args(chosen, batch_size=batch_size, workers=workers),
                                      train=True, num_classes=classes)
        return Loader(store, **{**options, "device": device})

    def run(name: str, chosen: RecipeFlags, ms: float) -> RunResult:
        loader = side(name, chosen)
        try:
            return measure(loader, EmulatedStep(ms, device), steps=steps, warmup=2, name=name, device=device)
        finally:
            close: Callable[[], None] | None = getattr(loader, "close", None)
            if close is not None:
                close()

    rate: dict[str, list[float]] = {LOADER: [], DATALOADER: []}
    stall: dict[str, list[float]] = {LOADER: [], DATALOADER: []}
    costs: dict[str, dict[str, list[float]]] = {
        op: {LOADER: [], DATALOADER: []} for op in (OPERATIONS if operations else {})}
    runs = []
    for r in range(rounds):
        order = (LOADER, DATALOADER) if r % 2 == 0 else (DATALOADER, LOADER)
        for name in order:
            fast, stepped = run(name, flags, 0.0), run(name, flags, step_ms)
            rate[name].append(fast.samples_per_s)
            stall[name].append(stepped.stall_fraction)
            runs += [{"round": r, "loader": name, "step_ms": 0.0, **_brief(fast)},
                     {"round": r, "loader": name, "step_ms": step_ms, **_brief(stepped)}]
            for op, changes in OPERATIONS.items() if operations else ():
                if op == "whole recipe":
                    costs[op][name].append(fast.samples_per_s)
                    continue
                costs[op][name].append(run(name, replace(flags, **changes), 0.0).samples_per_s)
    settings = {"batch_size": batch_size, "workers": workers, "steps": steps, "rounds": rounds,
                "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
                "classes": classes, "images": str(images), "store": str(store), "cores": usable_cores(),
                "torch": torch.__version__}
    return RecipeResult(step_ms=step_ms, rate={k: Figure(v) for k, v in rate.items()},
                        stall={k: Figure(v) for k, v in stall.items()}, settings=settings, runs=runs,
                        flags=flags, operations={op: {k: Figure(v) for k, v in sides.items()}
                                                 for op, sides in costs.items()})


def _brief(run: RunResult) -> dict[str, Any]:
    return {"samples_per_s": run.samples_per_s, "stall": run.stall_fraction,
            "wait_median_ms": run.wait_median_ms, "samples": run.samples}
