"""``tilefeed bench aspect``: does training through tilefeed see what torchvision's crops see?

A generated task whose label lives near the picture's border: a red or a blue mark in the
outer eighth of a 4:3 picture, left or right at random, on a smooth random background. The
same small network is trained three ways and evaluated on the same whole pictures:

* torchvision's rule: RandomResizedCrop + flip drawn on the original pictures (the rule of
  ``RandomResizedCrop.get_params``, applied with PIL, so torchvision need not be installed);
* tilefeed, aspect-true tiles (``--fit pad``): the Loader's crops drawn inside each picture box;
* tilefeed, centre-square tiles (``--fit crop``): the border never reaches a tile.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from tilefeed.bench.harness.sides import Figure
from tilefeed.bench.peers.baseline import torchvision_get_params
from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD

WIDTH, HEIGHT, MARK = 128, 96, 10
SIDE = 64  # network input
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220)}


@dataclass
class AspectResult:
    seeds: int
    accuracy: dict[str, list[float]]  # variant -> per-seed validation accuracy

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        lines = ["| training view | val accuracy, median | range |", "| --- | ---: | ---: |"]
        for name, acc in self.accuracy.items():
            lines.append(f"| {name} | {Figure(acc).cells('.1%')} |")
        return "\n".join(lines)


def _picture(rng: np.random.Generator, colour: str) -> Image.Image:
    coarse = rng.integers(60, 200, (3, 4, 3), dtype=np.uint8)
    im = np.array(Image.fromarray(coarse, "RGB").resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC))
    x = int(rng.integers(2, WIDTH // 8 - MARK)) if rng.random() < 0.5 else \
        int(rng.integers(WIDTH - WIDTH // 8, WIDTH - MARK - 2))
    y = int(rng.integers(2, HEIGHT - MARK - 2))
    im[y : y + MARK, x : x + MARK] = COLOURS[colour]
    return Image.fromarray(im)


def make_dataset(root: Path, count: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for colour in COLOURS:
        (root / colour).mkdir(parents=True, exist_ok=True)
        for i in range(count // 2):
            _picture(rng, colour).save(root / colour / f"{i:05d}.png")
    return root


def _normalise(batch: np.ndarray) -> torch.Tensor:
    """(n, H, W, 3) uint8 -> float32 NCHW, ImageNet-normalised as the Loader does."""
    mean, std = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)
    return torch.from_numpy(((batch.astype(np.float32) - mean) / std).transpose(0, 3, 1, 2).copy())


def _whole(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every picture whole: longer side SIDE, letterboxed on white; the shared evaluation view."""
    images, labels = [], []
    for label, colour in enumerate(sorted(COLOURS)):
        for path in sorted((folder / colour).iterdir()):
            with Image.open(path) as im:
                small = im.convert("RGB").resize((SIDE, SIDE * HEIGHT // WIDTH), Image.Resampling.BILINEAR)
            canvas = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
            canvas.paste(small, (0, (SIDE - small.height) // 2))
            images.append(np.asarray(canvas))
            labels.append(label)
    return _normalise(np.stack(images)), torch.tensor(labels)


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def _torchvision_batches(folder: Path, batch: int, rng: random.Random) -> Batches:
    """One epoch of torchvision's RandomResizedCrop + flip rule on the original pictures."""
    items = [(p, label) for label, c in enumerate(sorted(COLOURS))
             for p in sorted((folder / c).iterdir())]
    rng.shuffle(items)
    out = []
    for k in range(0, len(items), batch):
        images, labels = [], []
        for path, label in items[k : k + batch]:
            with Image.open(path) as im:
                top, left, h, w = torchvision_get_params(rng, HEIGHT, WIDTH)
                crop = im.convert("RGB").resize((SIDE, SIDE), Image.Resampling.BILINEAR,
                                                box=(left, top, left + w, top + h))
            if rng.random() < 0.5:
                crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            images.append(np.asarray(crop))
            labels.append(label)
        out.append((_normalise(np.stack(images)), torch.tensor(labels)))
    return out


def _reference_epoch(folder: Path, batch: int, rng: random.Random, epoch: int) -> Batches:
    return _torchvision_batches(folder, batch, rng)


def _loader_epoch(loader: Any, epoch: int) -> Any:
    loader.set_epoch(epoch)
    return loader


def _network() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 2))


EpochBatches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def _fit(model: torch.nn.Module, optimiser: torch.optim.Optimizer, batches_per_epoch: EpochBatches,
         epochs: range) -> None:
    for epoch in epochs:
        for images, labels in batches_per_epoch(epoch):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()


def _train(batches_per_epoch: EpochBatches, epochs: int, seed: int, val: tuple[torch.Tensor, torch.Tensor],
           network: Callable[[], torch.nn.Module] = _network) -> float:
    torch.manual_seed(seed)
    model = network()
    _fit(model, torch.optim.Adam(model.parameters(), lr=3e-3), batches_per_epoch, range(epochs))
    with torch.no_grad():
        return float((model(val[0]).argmax(1) == val[1]).float().mean())


def bench_aspect(*, train_count: int = 512, val_count: int = 256, epochs: int = 10, seeds: int = 3,
                 batch: int = 32) -> AspectResult:
    from tilefeed.pipeline import Loader
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tilefeed.preprocess.settings import Fit
    from tilefeed.store.format import Codec

    accuracy: dict[str, list[float]] = {"torchvision's rule, original pictures": [],
                                        "tilefeed, aspect-true tiles (--fit pad)": [],
                                        "tilefeed, centre-square tiles (--fit crop)": []}
    with tempfile.TemporaryDirectory(prefix="tilefeed-aspect-") as tmp:
        root = Path(tmp)
        train = make_dataset(root / "train", train_count, seed=1)
        val = _whole(make_dataset(root / "val", val_count, seed=2))
        stores = {}
        fits = (Fit.PAD, Fit.CROP)
        for fit in fits:
            stores[fit] = root / f"store-{fit}"
            preprocess(train, stores[fit], TileSettings(tile=WIDTH if fit is Fit.PAD else HEIGHT, fit=fit),
                       StoreSettings(codec=Codec.NONE), workers=1)
        names = list(accuracy)
        for seed in range(seeds):
            rng = random.Random(seed)
            accuracy[names[0]].append(
                _train(partial(_reference_epoch, train, batch, rng), epochs, seed, val))
            for name, fit in zip(names[1:], fits, strict=True):
                with Loader(stores[fit], batch, shuffle=True, seed=seed, train=True, size=SIDE) as loader:
                    accuracy[name].append(_train(partial(_loader_epoch, loader), epochs, seed, val))
    return AspectResult(seeds, accuracy)
