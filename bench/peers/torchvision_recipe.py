"""torchvision's ResNet-50 recipe on a torch DataLoader, as its reference ``train.py`` builds it.

The training preset of ``references/classification/presets.py`` (PIL backend, transforms v2):
random-resized crop at ``crop`` with bilinear antialiased resizing, horizontal flip at 0.5, the
auto-augment policy (TrivialAugmentWide for ``--auto-augment ta_wide``), PIL to tensor, float
scaled to 0..1, normalise, random erasing; the batch is collated and then mixed by a random choice
of ``MixUp`` and ``CutMix``, as ``train.py`` does with ``--mixup-alpha`` and ``--cutmix-alpha``.
Run as its users run it: ``num_workers`` processes, ``shuffle=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, default_collate

from tilefeed.preprocess.sources.finding import find_sources

IMAGENET_MEAN_01 = (0.485, 0.456, 0.406)
IMAGENET_STD_01 = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class RecipeFlags:
    """The flags of torchvision's ResNet-50 recipe that shape the input (its other flags, such as
    ``--label-smoothing``, act in the loss); defaults are that recipe's values."""

    crop: int = 176  # --train-crop-size
    auto_augment: str | None = "ta_wide"
    random_erase: float = 0.1
    mixup_alpha: float = 0.2
    cutmix_alpha: float = 1.0
    hflip: float = 0.5


class ImageFiles(Dataset[tuple[Any, int]]):
    """The source images of a folder (tilefeed's own source finding, so both sides read the
    same samples with the same labels), each decoded by PIL and transformed per access."""

    def __init__(self, root: str | Path, transform: Any) -> None:
        sources = find_sources(root)
        self.paths, self.labels = sources.paths, sources.labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        with Image.open(self.paths[index]) as f:
            image = f.convert("RGB")
        return self.transform(image), int(self.labels[index])


def train_transform(flags: RecipeFlags) -> Any:
    """``ClassificationPresetTrain`` of torchvision's reference scripts for these flags."""
    from torchvision.transforms import v2

    steps: list[Any] = [v2.RandomResizedCrop(flags.crop, interpolation=v2.InterpolationMode.BILINEAR,
                                             antialias=True)]
    if flags.hflip > 0:
        steps.append(v2.RandomHorizontalFlip(flags.hflip))
    if flags.auto_augment == "ta_wide":
        steps.append(v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR))
    elif flags.auto_augment == "ra":
        steps.append(v2.RandAugment(interpolation=v2.InterpolationMode.BILINEAR))
    elif flags.auto_augment is not None:
        steps.append(v2.AutoAugment(v2.AutoAugmentPolicy(flags.auto_augment),
                                    interpolation=v2.InterpolationMode.BILINEAR))
    steps += [v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
              v2.Normalize(mean=IMAGENET_MEAN_01, std=IMAGENET_STD_01)]
    if flags.random_erase > 0:
        steps.append(v2.RandomErasing(flags.random_erase))
    steps.append(v2.ToPureTensor())
    return v2.Compose(steps)


class MixCollate:
    """``train.py``'s collate: ``default_collate``, then a random choice of MixUp and CutMix
    (soft targets of ``classes`` columns). A class, not a lambda, so worker processes can pickle it."""

    def __init__(self, flags: RecipeFlags, classes: int) -> None:
        from torchvision.transforms import v2

        mixes = []
        if flags.mixup_alpha > 0:
            mixes.append(v2.MixUp(alpha=flags.mixup_alpha, num_classes=classes))
        if flags.cutmix_alpha > 0:
            mixes.append(v2.CutMix(alpha=flags.cutmix_alpha, num_classes=classes))
        self.mix = v2.RandomChoice(mixes) if mixes else None

    def __call__(self, batch: list[tuple[Any, int]]) -> Any:
        collated = default_collate(batch)
        return collated if self.mix is None else self.mix(*collated)


def recipe_dataloader(root: str | Path, batch_size: int, *, workers: int, flags: RecipeFlags,
                      classes: int, pin_memory: bool = False) -> DataLoader[Any]:
    """The reference script's training DataLoader over the source folder ``root``."""
    return DataLoader(ImageFiles(root, train_transform(flags)), batch_size=batch_size, shuffle=True,
                      num_workers=workers, pin_memory=pin_memory, drop_last=False,
                      collate_fn=MixCollate(flags, classes), persistent_workers=workers > 0)
