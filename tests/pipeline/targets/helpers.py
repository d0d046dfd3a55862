"""What the targets tests share: random tiles' objects in the store's layout, torchvision's
crop parameters, and torchvision v2's own transforms of boxes and masks as the reference."""

from __future__ import annotations

import numpy as np
import torch
import torchvision.transforms as T1
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from tests.helpers import RATIO, SCALE


def object_rows(rng: np.random.Generator, n: int, tile: int, most: int = 8,
                small: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, rows) as the store keeps them: up to ``most`` boxes a tile, inside the tile with
    positive size, fractional corners, some tiny (so sanitising has work), categories 1..90."""
    counts = rng.integers(0, most + 1, n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    m = int(offsets[-1])
    x0, y0 = rng.uniform(0, tile - 1, m), rng.uniform(0, tile - 1, m)
    span = (0.3 if small else 2.0, tile / 2)
    x1 = np.minimum(x0 + rng.uniform(*span, m), tile)
    y1 = np.minimum(y0 + rng.uniform(*span, m), tile)
    rows = np.stack([x0, y0, x1, y1, rng.integers(1, 91, m), rng.integers(0, 2, m)], axis=1)
    return offsets, rows


def crop_params(n: int, tile: int, seed: int) -> np.ndarray:
    """(n, 4) top, left, height, width from torchvision's ``RandomResizedCrop.get_params``."""
    torch.manual_seed(seed)
    image = torch.zeros(3, tile, tile)
    return np.array([T1.RandomResizedCrop.get_params(image, list(SCALE), list(RATIO)) for _ in range(n)],
                    dtype=np.float64)


def reference_boxes(rows: np.ndarray, tile: int, crop: tuple[float, float, float, float], size: int,
                    hflip: bool, vflip: bool, min_size: float = 1.0,
                    min_area: float = 1.0) -> dict[str, torch.Tensor]:
    """torchvision v2 on one tile's rows: ``resized_crop``, flips, ``ClampBoundingBoxes``,
    ``SanitizeBoundingBoxes`` (labels and crowd flags removed with their boxes)."""
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[:, :4].copy()), format="XYXY",
                                     canvas_size=(tile, tile))
    top, left, height, width = crop
    boxes = F.resized_crop(boxes, top, left, height, width, [size, size])
    if hflip:
        boxes = F.horizontal_flip(boxes)
    if vflip:
        boxes = F.vertical_flip(boxes)
    sample = {"boxes": boxes, "labels": torch.from_numpy(rows[:, 4].astype(np.int64)),
              "iscrowd": torch.from_numpy(rows[:, 5].astype(np.int64)),
              "ids": torch.arange(len(rows))}
    sample = v2.ClampBoundingBoxes()(sample)
    keep = v2.SanitizeBoundingBoxes(min_size, min_area,
                                    labels_getter=lambda s: (s["labels"], s["iscrowd"], s["ids"]))
    return keep(sample)  # type: ignore[no-any-return]
