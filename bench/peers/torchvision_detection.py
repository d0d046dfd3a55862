"""torchvision's detection input on a torch DataLoader: COCO read by ``CocoDetection``, its
targets wrapped for transforms v2, the same training geometry as the Loader's.

``torchvision.datasets.CocoDetection`` over the image folder and instances JSON, wrapped by
``wrap_dataset_for_transforms_v2`` (boxes as ``tv_tensors.BoundingBoxes`` in XYXY, masks decoded
from the polygons by pycocotools as ``tv_tensors.Mask``), then v2 transforms: random-resized crop
to ``size`` (boxes and masks follow), horizontal flip, ``ClampBoundingBoxes`` and
``SanitizeBoundingBoxes`` (as the detection reference presets end), float scaled to
0..1 and normalised; batches collated as the detection reference scripts do (a tuple of images
and a tuple of target dicts). Run as its users run it: ``num_workers`` processes, ``shuffle=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from tilefeed.bench.peers.torchvision_recipe import IMAGENET_MEAN_01, IMAGENET_STD_01


def detection_transform(size: int) -> Any:
    """The training transform: the Loader's geometry (random-resized crop, flip) in torchvision v2."""
    from torchvision.transforms import v2

    return v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(size, antialias=True),
        v2.RandomHorizontalFlip(0.5),
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(),
        v2.ToDtype(torch.float, scale=True),
        v2.Normalize(mean=IMAGENET_MEAN_01, std=IMAGENET_STD_01),
        v2.ToPureTensor(),
    ])


def collate(batch: list[tuple[Any, Any]]) -> tuple[Any, ...]:
    """The detection reference scripts' ``utils.collate_fn``: images and targets as tuples."""
    return tuple(zip(*batch, strict=True))


def detection_dataloader(images: str | Path, annotations: str | Path, batch_size: int, *, size: int,
                         workers: int, masks: bool = True, pin_memory: bool = False) -> DataLoader[Any]:
    """A training DataLoader over a COCO-format folder with boxes (and masks) following the crop."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    keys = ("boxes", "labels", "masks") if masks else ("boxes", "labels")
    dataset = wrap_dataset_for_transforms_v2(
        CocoDetection(str(images), str(annotations), transforms=detection_transform(size)), target_keys=keys)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      pin_memory=pin_memory, collate_fn=collate, persistent_workers=workers > 0)
