"""The standard ImageNet recipe on a torch DataLoader: PIL decode of the source JPEGs,
random-resized crop, flip, normalise. torchvision-free (its wheels do not match the pinned
torch here), but the same operations torchvision's transforms perform."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from tilefeed.pipeline.augment import IMAGENET_MEAN, IMAGENET_STD
from tilefeed.preprocess.sources import find_sources

MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def random_resized_box(width: int, height: int, rng: random.Random,
                       scale: tuple[float, float] = (0.08, 1.0),
                       ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (left, top, right, bottom)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)  # fallback: the centre crop
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


class JpegFolder(Dataset[tuple[torch.Tensor, int]]):
    """Source images decoded per access. ``train``: random-resized crop + flip + normalise to
    float32 CHW; otherwise centre crop + resize to uint8 HWC (what preprocessing stores)."""

    def __init__(self, root: str | Path, *, size: int = 224, train: bool = True,
                 dtype: torch.dtype = torch.float32) -> None:
        sources = find_sources(root)
        self.paths, self.labels = sources.paths, sources.labels
        self.size, self.train, self.dtype = size, train, dtype
        self._rng = random.Random(0)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[index]) as f:
            f.draft("RGB", (self.size, self.size))
            im = f.convert("RGB")
            w, h = im.size
            if self.train:
                box = random_resized_box(w, h, self._rng)
            else:
                side = min(w, h)
                box = ((w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side)
            im = im.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
            if self.train and self._rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.array(im))  # a writable copy, as torchvision makes
        if self.dtype == torch.uint8:
            return pixels, self.labels[index]
        chw = pixels.permute(2, 0, 1).float()
        return ((chw - MEAN) / STD).to(self.dtype), self.labels[index]


def seed_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: each worker draws its own augmentation stream."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        info.dataset._rng = random.Random(info.seed)  # type: ignore[attr-defined]


def jpeg_dataloader(root: str | Path, batch_size: int, *, workers: int, train: bool = True,
                    size: int = 224, dtype: torch.dtype = torch.float32,
                    pin_memory: bool = False, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(
        JpegFolder(root, size=size, train=train, dtype=dtype), batch_size=batch_size,
        shuffle=True, num_workers=workers, pin_memory=pin_memory, worker_init_fn=seed_worker,
        persistent_workers=workers > 0, **kwargs)
