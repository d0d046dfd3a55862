"""Masks through the Loader's geometry equal torchvision v2's ``resized_crop`` of a
``tv_tensors.Mask`` (nearest) and its flips, pixel for pixel; instance masks follow their boxes
through ``SanitizeBoundingBoxes``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as F

from tests.pipeline.targets.helpers import crop_params, object_rows
from tilefeed.pipeline.targets.geometry import Framing, transform_boxes
from tilefeed.pipeline.targets.masks import instance_masks, remap_ids, transform_masks
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError


def reference_mask(mask: np.ndarray, crop: np.ndarray, size: int, hflip: bool, vflip: bool,
                   interpolation: InterpolationMode = InterpolationMode.NEAREST) -> np.ndarray:
    top, left, height, width = (int(v) for v in crop)
    out = F.resized_crop(tv_tensors.Mask(torch.from_numpy(mask)), top, left, height, width, [size, size],
                         interpolation=interpolation)
    if hflip:
        out = F.horizontal_flip(out)
    if vflip:
        out = F.vertical_flip(out)
    return out.numpy()  # type: ignore[no-any-return]


@pytest.mark.parametrize("tile", [32, 57, 100])
@pytest.mark.parametrize("size", [7, 24, 64, 224])
def test_masks_equal_torchvision_for_random_resized_crops_and_flips(tile: int, size: int) -> None:
    rng = np.random.default_rng(tile * size)
    n = 40
    masks = rng.integers(0, 256, (n, tile, tile), dtype=np.uint8)  # every pixel differs from its neighbours
    crops = crop_params(n, tile, seed=size)
    hflip, vflip = rng.integers(0, 2, n), rng.integers(0, 2, n)
    out = transform_masks(Framing.windows(crops[:, :2], crops[:, :2] + crops[:, 2:], size, hflip, vflip), masks)
    assert out.shape == (n, size, size) and out.dtype == torch.uint8
    for i in range(n):
        np.testing.assert_array_equal(out[i], reference_mask(masks[i], crops[i], size, bool(hflip[i]),
                                                             bool(vflip[i])), err_msg=f"sample {i}")


def test_torchvision_resizes_masks_with_nearest_not_nearest_exact() -> None:
    """What the parity stands on: torchvision's ``resized_crop`` of a Mask samples as
    ``nearest`` whatever filter it is given, and ``nearest-exact`` would differ (so the
    comparison above tells the two apart)."""
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 256, (50, 50), dtype=np.uint8)
    crop = np.array([3, 5, 37, 41])
    ours = transform_masks(Framing.windows(crop[None, :2], crop[None, :2] + crop[None, 2:], 31), mask[None])[0]
    bilinear = reference_mask(mask, crop, 31, False, False, InterpolationMode.BILINEAR)
    np.testing.assert_array_equal(ours, bilinear)
    exact = F.resize(tv_tensors.Mask(torch.from_numpy(mask[3:40, 5:46].copy())), [31, 31],
                     interpolation=InterpolationMode.NEAREST_EXACT).numpy()
    assert not np.array_equal(ours, exact)


CENTRE = [(64, 64, 64), (64, 73, 64), (64, 36, 32), (57, 256, 224)]  # tile, resized, output


@pytest.mark.parametrize(("tile", "resized", "size"), CENTRE)
def test_eval_centre_framing_of_masks_is_resize_then_the_graphs_centre_crop(tile: int, resized: int,
                                                                             size: int) -> None:
    rng = np.random.default_rng(size)
    masks = rng.integers(0, 256, (4, tile, tile), dtype=np.uint8)
    out = transform_masks(Framing.centre(4, tile, resized, size), masks)
    anchor = (resized - size + 1) // 2
    for i in range(4):
        ref = F.crop(F.resize(tv_tensors.Mask(torch.from_numpy(masks[i])), [resized, resized]), anchor, anchor,
                     size, size)
        np.testing.assert_array_equal(out[i], ref.numpy())


def instance_tiles(rng: np.random.Generator, offsets: np.ndarray, rows: np.ndarray, tile: int) -> np.ndarray:
    """Instance-id tiles painting each object's box (later objects over earlier ones)."""
    masks = np.zeros((len(offsets) - 1, tile, tile), np.uint8)
    for i in range(len(offsets) - 1):
        for k, row in enumerate(rows[offsets[i]:offsets[i + 1]]):
            x0, y0, x1, y1 = np.floor(row[:4]).astype(int)
            masks[i, y0:y1 + 1, x0:x1 + 1] = k + 1
    return masks


def test_instance_masks_equal_torchvisions_per_object_masks_after_sanitising() -> None:
    rng = np.random.default_rng(11)
    n, tile, size = 30, 48, 40
    offsets, rows = object_rows(rng, n, tile)
    ids = instance_tiles(rng, offsets, rows, tile)
    crops = crop_params(n, tile, seed=4)
    hflip = rng.integers(0, 2, n)
    framing = Framing.windows(crops[:, :2], crops[:, :2] + crops[:, 2:], size, hflip)
    kept = transform_boxes(framing, Objects.from_rows(offsets, rows))
    framed = transform_masks(framing, ids)
    ours = instance_masks(framed, kept)
    renumbered = remap_ids(framed, kept)
    removed = 0
    for i in range(n):
        tile_rows = rows[offsets[i]:offsets[i + 1]]
        per_object = np.stack([ids[i] == k + 1 for k in range(len(tile_rows))]).astype(np.uint8) \
            if len(tile_rows) else np.zeros((0, tile, tile), np.uint8)
        sample = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(tile_rows[:, :4].copy()), format="XYXY",
                                                    canvas_size=(tile, tile)),
                  "masks": tv_tensors.Mask(torch.from_numpy(per_object)),
                  "labels": torch.from_numpy(tile_rows[:, 4].astype(np.int64))}
        top, left, height, width = (int(v) for v in crops[i])
        for key in ("boxes", "masks"):
            sample[key] = F.resized_crop(sample[key], top, left, height, width, [size, size])
            if hflip[i]:
                sample[key] = F.horizontal_flip(sample[key])
        ref = v2.SanitizeBoundingBoxes()(v2.ClampBoundingBoxes()(sample))
        np.testing.assert_array_equal(ours[i], ref["masks"].numpy(), err_msg=f"sample {i}")
        removed += len(tile_rows) - len(ref["masks"])
        # the renumbered map: kept object m is m + 1, dropped objects' pixels are background
        expected = np.zeros((size, size), np.uint8)
        for m, binary in enumerate(ref["masks"].numpy()):
            expected[binary == 1] = m + 1
        np.testing.assert_array_equal(renumbered[i], expected)
    assert removed > 0  # sanitising dropped objects, whose masks had to go with them


def test_mask_refusals() -> None:
    framing = Framing.windows(np.zeros((2, 2)), np.full((2, 2), 8.0), np.array([[8, 8], [4, 4]]))
    with pytest.raises(ConfigError, match="one whole-pixel size"):
        transform_masks(framing, np.zeros((2, 8, 8), np.uint8))
    with pytest.raises(ConfigError, match=r"expected \(2, H, W\) uint8 masks"):
        transform_masks(framing, np.zeros((3, 8, 8), np.uint8))
