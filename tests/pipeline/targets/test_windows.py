"""Detection's window draws against torchvision v2's own: ``RandomIoUCrop``'s windows and
``ScaleJitter``'s sizes have the same distributions (two-sample Kolmogorov-Smirnov at
alpha = 0.001, fixed sample sizes), and a changed setting is told apart (negative controls);
draws depend on (seed, epoch, key) alone; large-scale jitter's boxes equal torchvision's
resize and crop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from tests.helpers import ks
from tests.pipeline.recipe.helpers import ks_critical
from tests.pipeline.targets.helpers import object_rows
from tilefeed.pipeline.targets.geometry import transform_boxes
from tilefeed.pipeline.targets.masks import transform_masks
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.pipeline.targets.windows import (IoUCrop, ScaleJitter, iou_crops, scale_jitter_framing,
                                               scale_jitter_sizes, scale_jitter_windows)
from tilefeed.store.errors import ConfigError

N = 1500  # draws on each side
ALPHA = 0.001
H, W = 80, 100
ROWS = np.array([[10, 10, 40, 30, 1, 0], [50, 20, 90, 70, 2, 0], [70, 5, 78, 12, 3, 1]], np.float64)


def ours(crop: IoUCrop, n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n, 4) top, left, height, width of our windows (the picture fills a tile at (2, 3)), and
    (n,) boxes kept."""
    objects = Objects.gather(np.array([0, 3]), ROWS + [3, 2, 3, 2, 0, 0], np.zeros(n, np.int64))
    drawn = iou_crops(crop, seed, 1, np.arange(n), np.tile([2, 3, H, W], (n, 1)), objects)
    kept = np.add.reduceat(drawn.keep.astype(np.int64), objects.offsets[:-1])
    return np.concatenate([drawn.start - [2, 3], drawn.end - drawn.start], axis=1), kept


def torchvisions(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """The same from ``RandomIoUCrop.make_params`` (the whole picture where it leaves it as is)."""
    torch.manual_seed(0)
    crop = v2.RandomIoUCrop()
    image = tv_tensors.Image(torch.zeros(3, H, W))
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(ROWS[:, :4].copy()), format="XYXY", canvas_size=(H, W))
    windows, kept = [], []
    for _ in range(n):
        p = crop.make_params([image, boxes])
        windows.append((p["top"], p["left"], p["height"], p["width"]) if p else (0, 0, H, W))
        kept.append(int(p["is_within_crop_area"].sum()) if p else len(ROWS))
    return np.array(windows, np.float64), np.array(kept)


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    return torchvisions()


def test_iou_crop_windows_are_distributed_as_torchvisions(reference: tuple[np.ndarray, np.ndarray]) -> None:
    theirs, their_kept = reference
    mine, my_kept = ours(IoUCrop())
    limit = ks_critical(N, N, ALPHA)
    for k, name in enumerate(("top", "left", "height", "width")):
        assert ks(mine[:, k], theirs[:, k]) < limit, name
    assert ks(my_kept.astype(float), their_kept.astype(float)) < limit
    whole = lambda w: (w[:, 2] == H) & (w[:, 3] == W)  # noqa: E731
    share, their_share = whole(mine).mean(), whole(theirs).mean()
    assert abs(share - their_share) < 4 * np.sqrt(2 * 0.25 / N)  # two proportions, four sigmas


def test_a_changed_min_scale_is_told_apart(reference: tuple[np.ndarray, np.ndarray]) -> None:
    """Negative control: the same test rejects windows drawn with ``min_scale`` 0.5 for 0.3."""
    theirs, _ = reference
    mine, _ = ours(IoUCrop(min_scale=0.5))
    assert ks(mine[:, 3], theirs[:, 3]) > ks_critical(N, N, ALPHA)


def test_every_iou_window_keeps_torchvisions_rule() -> None:
    windows, kept = ours(IoUCrop(), n=400, seed=3)
    top, left, height, width = windows.T
    cropped = ~((height == H) & (width == W))
    aspect = width[cropped] / height[cropped]
    assert ((0.5 <= aspect) & (aspect <= 2.0)).all() and (kept[cropped] >= 1).all()
    assert (top >= 0).all() and (left >= 0).all() and (top + height <= H).all() and (left + width <= W).all()
    assert np.array_equal(windows, np.round(windows))  # whole pixels, as torchvision's ints


def test_iou_draws_depend_on_the_key_alone() -> None:
    rng = np.random.default_rng(0)
    offsets, rows = object_rows(rng, 60, 64, small=False)
    objects = Objects.from_rows(offsets, rows)
    pictures = np.tile([0, 0, 64, 64], (60, 1))
    keys = np.arange(100, 160)
    whole = iou_crops(IoUCrop(), 5, 2, keys, pictures, objects)
    later = Objects.gather(offsets, rows, np.arange(30, 60))
    tail = iou_crops(IoUCrop(), 5, 2, keys[30:], pictures[30:], later)
    np.testing.assert_array_equal(whole.start[30:], tail.start)
    np.testing.assert_array_equal(whole.keep[offsets[30]:], tail.keep)
    other = iou_crops(IoUCrop(), 5, 3, keys, pictures, objects)
    assert not np.array_equal(whole.start, other.start)  # another epoch, other windows


def test_scale_jitter_sizes_are_distributed_as_torchvisions() -> None:
    torch.manual_seed(0)
    jitter = v2.ScaleJitter((1024, 1024))
    image = tv_tensors.Image(torch.zeros(3, H, W))
    theirs = np.array([jitter.make_params([image])["size"] for _ in range(N)], np.float64)
    heights, widths = np.full(N, H), np.full(N, W)
    mine = np.stack(scale_jitter_sizes(ScaleJitter((1024, 1024)), 0, 0, np.arange(N), heights, widths), 1)
    limit = ks_critical(N, N, ALPHA)
    for k in (0, 1):
        assert ks(mine[:, k].astype(float), theirs[:, k]) < limit
    narrower = np.stack(scale_jitter_sizes(ScaleJitter((1024, 1024), (0.3, 2.0)), 0, 0, np.arange(N), heights,
                                           widths), 1)
    assert ks(narrower[:, 1].astype(float), theirs[:, 1]) > limit  # negative control


def test_large_scale_jitter_boxes_and_masks_equal_torchvisions_resize_and_crop() -> None:
    n, tile, size = 40, 64, 48
    rng = np.random.default_rng(1)
    offsets, rows = object_rows(rng, n, tile, small=False)
    masks = rng.integers(1, 256, (n, tile, tile), dtype=np.uint8)
    jitter = ScaleJitter((size, size), (0.5, 2.0))
    pictures = np.tile([0, 0, tile, tile], (n, 1))
    framing = scale_jitter_framing(jitter, 9, 0, np.arange(n), pictures, size)
    new_h, new_w = scale_jitter_sizes(jitter, 9, 0, np.arange(n), pictures[:, 2], pictures[:, 3])
    assert (new_w < size).any() and (new_w > size).any()  # both padding and cutting happen
    out = transform_boxes(framing, Objects.from_rows(offsets, rows))
    framed = transform_masks(framing, masks)
    for i in range(n):
        boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[offsets[i]:offsets[i + 1], :4].copy()),
                                         format="XYXY", canvas_size=(tile, tile))
        top, left = (int(v) for v in framing.anchor[i])
        size_i = [int(new_h[i]), int(new_w[i])]
        cut = F.crop(F.resize(boxes, size_i), top, left, size, size)
        ref = v2.SanitizeBoundingBoxes(labels_getter=None)(v2.ClampBoundingBoxes()(cut))
        np.testing.assert_allclose(out.boxes[out.offsets[i]:out.offsets[i + 1]], ref.numpy(), atol=1e-3, rtol=0)
        mask = F.crop(F.resize(tv_tensors.Mask(torch.from_numpy(masks[i])), size_i), top, left, size, size)
        np.testing.assert_array_equal(framed[i], mask.numpy())  # padding included (torchvision's 0)
    # the graph's window: the same square, in tile pixels
    drawn = scale_jitter_windows(jitter, 9, 0, np.arange(n), pictures, size)
    np.testing.assert_allclose(drawn.start[:, 1], framing.anchor[:, 1] * tile / new_w)
    np.testing.assert_allclose(drawn.end[:, 1] - drawn.start[:, 1], size * tile / new_w)


def test_window_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="min_scale"):
        IoUCrop(min_scale=0.0)
    with pytest.raises(ConfigError, match="sampler_options"):
        IoUCrop(sampler_options=())
    with pytest.raises(ConfigError, match="scale_range"):
        ScaleJitter((64, 64), (2.0, 1.0))
