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

from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD
from tilefeed.preprocess.sources.finding import find_sources

MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def torchvision_get_params(rng: random.Random, height: int, width: int,
                           scale: tuple[float, float] = (0.08, 1.0),
                           ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width): torchvision's RandomResizedCrop.get_params rule in plain
    Python, one draw at a time: ten tries, then the centre fallback."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params as a PIL box: (left, top, right, bottom)."""
    top, left, h, w = torchvision_get_params(rng, height, width)
    return left, top, left + w, top + h


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
