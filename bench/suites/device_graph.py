"""``tilefeed bench device-graph``: the GPU's graph against the host path, cell by cell.

A CPU Loader cuts, resizes and applies a recipe in its reader threads (pillow-simd, torchvision's
PIL kernels); a GPU Loader does it all in the DALI graph. ``TILEFEED_DEVICE_GRAPH=1`` builds the
GPU's graph on DALI's CPU backend, so the device's code runs without a device. This bench runs
both shapes over a matrix of store codecs, tile fits, recipes and outputs on the same samples
and reports, per cell, how far the device shape's pixels are from the host shape's (mean and
largest difference, in levels of 0..255), whether the boxes and masks are the same bit for bit,
and, where the cell is a plain crop or evaluation framing, how far the host shape is from
torchvision's own functional calls on the stored tile (``resized_crop``, ``resize`` +
``center_crop``; PIL's resize of the window where evaluation framing of a padded picture is
fractional). With ``--cuda`` (a CUDA machine) the same graph on the GPU adds its own column.
Cells the Loader refuses (uint8 output with erasing or mixing) are shown as refused, with the
reason.

Each recipe has a stated tolerance on the mean difference, set by what binds it (``TOLERANCE``);
a cell over it fails the run (exit status 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline import Loader
from tilefeed.pipeline.device import device_graph_set
from tilefeed.pipeline.recipe.batch_mix import BatchMix
from tilefeed.pipeline.recipe.erasing import RandomErasing
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.recipe import ColorJitter, Crop, PhotometricDistort, Recipe
from tilefeed.preprocess.settings import Fit
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import Codec

CODECS = (Codec.LZ4, Codec.NONE, Codec.JPEG)
FITS = (Fit.PAD, Fit.CROP)
FILL = (123, 117, 104)
# recipe name -> (the recipe, given the store's class count; None: evaluation framing)
RECIPES: dict[str, Callable[[int], Recipe | None]] = {
    "evaluation": lambda classes: None,
    "crop": lambda classes: Recipe(),
    "jitter": lambda classes: Recipe(vflip=0.2, grayscale=0.2, color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1)),
    "trivial_wide": lambda classes: Recipe(auto_augment=AutoAugment.parse("ta_wide")),
    "randaugment": lambda classes: Recipe(auto_augment=AutoAugment.parse("rand-m9-mstd0.5-inc1")),
    "photometric": lambda classes: Recipe(photometric=PhotometricDistort()),
    "lsj": lambda classes: Recipe(crop=Crop.LSJ, fill=FILL),
    "zoom_iou": lambda classes: Recipe(crop=Crop.ZOOM_IOU, fill=FILL),
    "erasing": lambda classes: Recipe(erasing=RandomErasing(p=0.5, value="random")),
    "mixup_cutmix": lambda classes: Recipe(batch_mix=BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0,
                                                                        num_classes=classes)),
}
# The largest mean difference (levels) a recipe's cell may show between the shapes, and what binds it:
TOLERANCE: dict[str, tuple[float, str]] = {
    "evaluation": (0.5, "DALI's antialiased resize against PIL's"),
    "crop": (0.5, "DALI's antialiased resize against PIL's"),
    "jitter": (2.0, "the resize's gap, carried through the colour operations' truncations"),
    "trivial_wide": (4.0, "the resize's gap and each op's: nearest warps' ties, equalize's formula"),
    "randaugment": (4.0, "as trivial_wide, and timm's bicubic slots warped bilinear (DALI has no cubic warp)"),
    "photometric": (2.0, "the resize's gap, and PIL's uint8 hue against the graph's float hue"),
    "lsj": (3.0, "the resize's gap on the cut; the fill exact"),
    "zoom_iou": (3.0, "the resize's gap on the cut; the fill exact"),
    "erasing": (0.5, "the resize's gap; the erased noise is the same draw"),
    "mixup_cutmix": (0.5, "the resize's gap; the mix is the same draw"),
}
OUTPUTS: dict[str, dict[str, Any]] = {
    "float32 NCHW": dict(dtype=torch.float32, layout="NCHW"),
    "float32 channels_last": dict(dtype=torch.float32, layout="channels_last"),
    "uint8 NHWC": dict(dtype=torch.uint8, layout="NHWC"),
}


@dataclass
class Gap:
    """Pixels of one side against another's: the mean of each sample's mean absolute difference,
    and the largest difference, in levels."""

    mean: float
    most: float

    def text(self) -> str:
        return f"{self.mean:.2f} / {self.most:.0f}"


@dataclass
class Cell:
    """One cell of the matrix."""

    codec: str
    fit: str
    recipe: str
    output: str
    refused: str = ""  # the Loader's one line, where it refuses the cell
    device: Gap | None = None  # the device shape against the host shape
    cuda: Gap | None = None  # the graph on a GPU against the host shape
    reference: Gap | None = None  # the host shape against torchvision's calls (plain crops, framing)
    targets: bool | None = None  # the boxes and masks equal in both shapes (None: none asked)
    samples: int = 0

    @property
    def ok(self) -> bool:
        """Within the recipe's tolerance (``TOLERANCE``), the targets equal; a refused cell is."""
        bound = TOLERANCE[self.recipe][0]
        gaps = [g for g in (self.device, self.cuda) if g is not None]
        return bool(self.refused) or (all(g.mean <= bound for g in gaps) and self.targets is not False)


@dataclass
class DeviceGraphResult:
    """Every cell, and the settings they ran with."""

    cells: list[Cell]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every cell within its tolerance."""
        return all(c.ok for c in self.cells)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceGraphResult:
        """The result again from ``as_dict``'s data (what ``--out`` wrote)."""
        def cell(c: dict[str, Any]) -> Cell:
            gaps = {k: Gap(**c[k]) if c.get(k) else None for k in ("device", "cuda", "reference")}
            return Cell(**{**c, **gaps})

        return cls([cell(c) for c in data["cells"]], data["settings"])

    def as_dict(self) -> dict[str, Any]:
        return {"cells": [asdict(c) for c in self.cells], "settings": self.settings, "ok": self.ok}

    def table(self) -> str:
        """A row per codec, fit and recipe; per output, the device shape against the host shape
        (and the GPU's graph, where it ran): mean / largest difference in levels."""
        s = self.settings
        outputs = list(dict.fromkeys(c.output for c in self.cells))
        cuda = any(c.cuda is not None for c in self.cells)
        rows: dict[tuple[str, str, str], dict[str, Cell]] = {}
        for c in self.cells:
            rows.setdefault((c.codec, c.fit, c.recipe), {})[c.output] = c
        head = ["codec", "fit", "recipe",
                *(f"{o}{': device shape / CUDA' if cuda else ''}" for o in outputs),
                "host vs torchvision", "boxes, masks", "tolerance"]
        lines = [f"The device's graph on DALI's CPU backend against the host path, {s['count']} samples of "
                 f"{s['tile']} px tiles at {s['size']} px"
                 + (f" (CUDA: {s['cuda']})" if s.get("cuda") else "")
                 + ": mean / largest difference in levels (0-255)", "",
                 "| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
        for (codec, fit, recipe), by_output in rows.items():
            shown = []
            for o in outputs:
                cell = by_output.get(o)
                if cell is None:
                    shown.append("")
                elif cell.refused:
                    shown.append("refused")
                else:
                    text = cell.device.text() if cell.device is not None else "-"
                    if cuda:
                        text += " / " + (cell.cuda.text() if cell.cuda is not None else "-")
                    shown.append(text + ("" if cell.ok else " **over**"))
            ran = [c for c in by_output.values() if not c.refused]
            reference = next((c.reference.text() for c in ran if c.reference is not None), "-")
            told = {c.targets for c in ran} - {None}
            targets = "-" if not told else ("equal" if told == {True} else "**differ**")
            lines.append("| " + " | ".join([codec, fit, recipe, *shown, reference, targets,
                                            f"{TOLERANCE[recipe][0]:g}"]) + " |")
        refused = sorted({c.refused for c in self.cells if c.refused})
        lines.append("")
        lines += [f"Refused: {reason}" for reason in refused]
        lines.append("Tolerances, on the mean, and what binds each:")
        lines += [f"- {name}: {bound:g}, {why}" for name, (bound, why) in TOLERANCE.items()
                  if name in {c.recipe for c in self.cells}]
        over = [c for c in self.cells if not c.ok]
        lines.append(f"{len(self.cells)} cells, {sum(bool(c.refused) for c in self.cells)} refused, "
                     f"{len(over)} over their tolerance")
        return "\n".join(lines)


def _levels(images: torch.Tensor, loader: Loader) -> np.ndarray:
    """A batch as float HWC levels (0..255): normalised outputs taken back through mean and std."""
    x = images.detach().cpu()
    if x.shape[-1] != 3:  # NCHW (channels_last is an NCHW view of HWC bytes)
        x = x.permute(0, 2, 3, 1)
    x = x.float()
    if images.dtype != torch.uint8:
        a = loader.augment
        x = x * torch.tensor(a.std) + torch.tensor(a.mean)
    return x.numpy()


def _run(store: Path, options: dict[str, Any], device: str,
         device_graph: bool) -> tuple[dict[int, np.ndarray], dict[int, Any], Any]:
    """Every sample's pixels (levels) and targets of epoch 0, and the windows the Loader drew."""
    pixels: dict[int, np.ndarray] = {}
    targets: dict[int, Any] = {}
    with device_graph_set(device_graph), Loader(store, 8, device=device, **options) as loader:
        for images, labels, idx in loader:
            batch_targets: Any = labels  # with targets asked, a dict of tensors a sample
            for k, (image, i) in enumerate(zip(_levels(images, loader), idx.cpu().tolist(), strict=True)):
                pixels[i] = image
                if options.get("targets"):
                    targets[i] = {n: v.cpu() for n, v in batch_targets[k].items()}
        samples = np.array(sorted(pixels))
        windows = loader.windows(0, samples)
        resize_to = loader.augment.resize_to(loader.size_of(0))
    return pixels, targets, (samples, windows, resize_to)


def _gap(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> Gap:
    if a.keys() != b.keys():
        raise AssertionError("the two sides delivered other samples")
    diffs = [np.abs(a[i] - b[i]) for i in sorted(a)]
    return Gap(float(np.mean([d.mean() for d in diffs])), float(max(d.max() for d in diffs)))


def _reference(store: Path, fit: str, train: bool, size: int, drawn: Any) -> dict[int, np.ndarray]:
    """torchvision's calls on each stored tile (decoded as the host decodes it): ``resized_crop``
    of the training window and its flip; evaluation framing as ``resize`` + ``center_crop`` of a
    whole tile, or PIL's resize of a padded picture's fractional framing window."""
    from PIL import Image
    from torchvision.transforms.v2 import functional as F

    from tilefeed.pipeline import StoreReader

    samples, (start, end, flip), resize_to = drawn
    out = {}
    with StoreReader(store) as reader:
        for k, i in enumerate(samples.tolist()):
            tile = Image.fromarray(reader.read(i))
            if not train and fit == "crop":
                picture = F.center_crop(F.resize(tile, [resize_to], antialias=True), [size])
            elif train:
                (top, left), (bottom, right) = start[k].astype(int), end[k].astype(int)
                picture = F.resized_crop(tile, int(top), int(left), int(bottom - top), int(right - left),
                                         [size, size], antialias=True)
            else:
                (y0, x0), (y1, x1) = start[k].tolist(), end[k].tolist()
                picture = tile.resize((size, size), Image.Resampling.BILINEAR, box=(x0, y0, x1, y1))
            if flip[k]:
                picture = F.horizontal_flip(picture)
            out[i] = np.asarray(picture, dtype=np.float32)
    return out


def _same_targets(a: dict[int, Any], b: dict[int, Any]) -> bool:
    return a.keys() == b.keys() and all(
        a[i].keys() == b[i].keys() and all(torch.equal(a[i][n], b[i][n]) for n in a[i]) for i in a)


def make_stores(root: Path, *, count: int, tile: int) -> dict[tuple[Codec, Fit], Path]:
    """A generated COCO-style set (shapes on photo-like backgrounds) preprocessed with its boxes
    and instance masks into one store per codec and fit; complete stores are reused."""
    from tilefeed.bench.fixtures.coco import make_coco_folder
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tilefeed.preprocess.settings import TargetOptions

    images, annotations = make_coco_folder(root / "set", count=count,
                                           sizes=((96, 72), (72, 96), (100, 56), (64, 64)))
    stores = {}
    for codec in CODECS:
        for fit in FITS:
            store = root / f"{codec}-{fit}-{tile}"
            preprocess(images, store, TileSettings(tile=tile, fit=fit), StoreSettings(codec=codec),
                       targets=TargetOptions(annotations=str(annotations), instance_masks=True), workers=1)
            stores[codec, fit] = store
    return stores


def bench_device_graph(root: Path, *, count: int = 24, tile: int = 64, size: int = 48, cuda: bool = False,
                       codecs: tuple[Codec, ...] = CODECS, fits: tuple[Fit, ...] = FITS,
                       recipes: tuple[str, ...] = tuple(RECIPES), outputs: tuple[str, ...] = tuple(OUTPUTS),
                       progress: Callable[[str], None] | None = None) -> DeviceGraphResult:
    """Run the matrix (see the module's docstring) on stores made under ``root``.

    Parameters
    ----------
    root : Path
        Where the generated set and its stores are made (reused when complete).
    count, tile, size : int
        Generated pictures, the stores' tile side and the output side.
    cuda : bool
        Also run the graph on the current CUDA device (a column of its own).
    codecs : tuple of Codec
        The store codecs to run (default: all of ``CODECS``).
    fits : tuple of Fit
        The tile fits to run (default: all of ``FITS``).
    recipes, outputs : tuple of str
        The recipes and outputs to run (default: all of ``RECIPES``, ``OUTPUTS``).
    progress : callable, optional
        Called with each cell's name as it starts.

    Returns
    -------
    DeviceGraphResult
        Every cell's gaps, and whether each is within its tolerance.
    """
    stores = make_stores(root, count=count, tile=tile)
    cells = []
    for codec in codecs:
        for fit in fits:
            store = stores[codec, fit]
            classes = _classes(store)
            for name in recipes:
                for output in outputs:
                    if progress is not None:
                        progress(f"{codec} {fit} {name} {output}")
                    cells.append(_cell(store, codec, fit, name, output, classes, size, cuda))
    settings = dict(count=count, tile=tile, size=size, cuda=torch.cuda.get_device_name() if cuda else None)
    return DeviceGraphResult(cells, settings)


def _classes(store: Path) -> int:
    from tilefeed.pipeline import StoreReader

    with StoreReader(store) as reader:
        return len(reader.classes)


def _cell(store: Path, codec: str, fit: str, name: str, output: str, classes: int, size: int,
          cuda: bool) -> Cell:
    recipe = RECIPES[name](classes)
    train = recipe is not None
    # evaluation with targets reads whole tiles (boxes stay in tile pixels): without, a padded
    # picture is framed by a fractional window, the case to hold; mixing takes no targets
    targets = ("boxes", "masks") if name not in ("evaluation", "mixup_cutmix") else None
    options: dict[str, Any] = dict(with_index=True, num_workers=1, shuffle=False, seed=11, size=size,
                                   train=train, recipe=recipe, targets=targets, **OUTPUTS[output])
    cell = Cell(codec, fit, name, output)
    try:
        host, host_targets, drawn = _run(store, options, "cpu", False)
    except ConfigError as e:
        cell.refused = str(e).split("\n")[0]
        return cell
    device, device_targets, _ = _run(store, options, "cpu", True)
    cell.samples = len(host)
    cell.device = _gap(host, device)
    if targets is not None:
        cell.targets = _same_targets(host_targets, device_targets)
    if cuda:
        on_gpu, gpu_targets, _ = _run(store, options, "cuda", False)
        cell.cuda = _gap(host, on_gpu)
        if targets is not None:
            cell.targets = bool(cell.targets) and _same_targets(host_targets, gpu_targets)
    if name in ("evaluation", "crop"):
        cell.reference = _gap(_reference(store, fit, train, size, drawn), host)
    return cell
