"""A batch's targets in the shapes models take: torchvision's detection dicts (a real
torchvision detection model trains a step on them) and padded tensors with counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.pipeline.targets.helpers import crop_params, object_rows
from tilefeed.pipeline.options import Targets, parse_targets
from tilefeed.pipeline.targets.batches import FramedTargets, MaskKind, check_targets, frame_targets
from tilefeed.pipeline.targets.geometry import Framing, transform_boxes
from tilefeed.pipeline.targets.masks import instance_masks, transform_masks
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError

TILE, SIZE = 64, 48


def batch(n: int = 6, seed: int = 0) -> tuple[Framing, Objects, np.ndarray]:
    rng = np.random.default_rng(seed)
    offsets, rows = object_rows(rng, n, TILE, most=5, small=False)
    ids = np.zeros((n, TILE, TILE), np.uint8)
    for i in range(n):
        for k, row in enumerate(rows[offsets[i]:offsets[i + 1]]):
            x0, y0, x1, y1 = row[:4].astype(int)
            ids[i, y0:y1, x0:x1] = k + 1
    crops = crop_params(n, TILE, seed)
    framing = Framing.windows(crops[:, :2], crops[:, :2] + crops[:, 2:], SIZE, rng.integers(0, 2, n))
    return framing, Objects.from_rows(offsets, rows), ids


def test_detection_dicts_hold_torchvisions_keys_and_dtypes() -> None:
    framing, objects, ids = batch()
    framed = frame_targets(framing, parse_targets(("boxes", "masks")), objects, ids, "instance")
    dicts = framed.as_dicts()
    kept = transform_boxes(framing, objects)
    per_object = instance_masks(transform_masks(framing, ids), kept)
    assert len(dicts) == len(objects)
    for i, d in enumerate(dicts):
        k = int(kept.counts[i])
        assert set(d) == {"boxes", "labels", "iscrowd", "masks"}
        assert d["boxes"].dtype == torch.float32 and d["boxes"].shape == (k, 4)
        assert d["labels"].dtype == torch.int64 and d["iscrowd"].dtype == torch.int64
        assert d["masks"].dtype == torch.uint8 and d["masks"].shape == (k, SIZE, SIZE)
        np.testing.assert_array_equal(d["masks"].numpy(), per_object[i])
        np.testing.assert_array_equal(d["labels"].numpy(), kept.labels[kept.offsets[i]:kept.offsets[i + 1]])


def test_padded_tensors_and_counts_hold_the_same_boxes() -> None:
    framing, objects, ids = batch(seed=1)
    framed = frame_targets(framing, frozenset({Targets.BOXES, Targets.MASKS}), objects, ids, MaskKind.INSTANCE)
    dicts, padded = framed.as_dicts(), framed.as_padded()
    counts = padded["counts"]
    width = int(counts.max())
    assert padded["boxes"].shape == (len(dicts), width, 4) and padded["labels"].shape == (len(dicts), width)
    for i, d in enumerate(dicts):
        c = int(counts[i])
        assert torch.equal(padded["boxes"][i, :c], d["boxes"])
        assert torch.equal(padded["labels"][i, :c], d["labels"])
        assert bool((padded["labels"][i, c:] == -1).all()) and bool((padded["boxes"][i, c:] == 0).all())
        for m in range(c):  # slot m's mask is id m + 1 of the padded id map
            assert torch.equal((padded["masks"][i] == m + 1).to(torch.uint8), d["masks"][m])
    fixed = framed.as_padded(max_objects=width + 3)
    assert fixed["boxes"].shape[1] == width + 3
    with pytest.raises(ConfigError, match="max_objects"):
        framed.as_padded(max_objects=width - 1)


def test_semantic_masks_as_one_tensor() -> None:
    framing, _, _ = batch()
    classes = np.random.default_rng(0).integers(0, 20, (6, TILE, TILE), dtype=np.uint8)
    framed = frame_targets(framing, parse_targets("masks"), masks=classes, kind="semantic")
    padded = framed.as_padded()
    assert set(padded) == {"masks"} and padded["masks"].shape == (6, SIZE, SIZE)
    np.testing.assert_array_equal(padded["masks"].numpy(), transform_masks(framing, classes))
    assert framed.as_dicts()[2]["masks"].shape == (SIZE, SIZE)


def test_a_torchvision_detection_model_trains_a_step_on_the_dicts() -> None:
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    framing, objects, _ = batch(n=2, seed=4)
    targets = frame_targets(framing, parse_targets("boxes"), objects).as_dicts()
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
    model.train()
    losses = model(list(torch.rand(2, 3, SIZE, SIZE)), targets)
    total = sum(losses.values())
    total.backward()
    assert set(losses) == {"bbox_regression", "classification"} and torch.isfinite(total)


def test_what_a_batch_may_ask_for() -> None:
    assert parse_targets(None) == frozenset()
    assert parse_targets(["boxes", Targets.MASKS]) == {Targets.BOXES, Targets.MASKS}
    with pytest.raises(ConfigError, match="'keypoints'"):
        parse_targets("keypoints")
    with pytest.raises(ConfigError, match="holds none"):
        check_targets(parse_targets("boxes"), boxes=False, masks="semantic")
    with pytest.raises(ConfigError, match="holds none"):
        check_targets(parse_targets("masks"), boxes=True, masks=None)
    with pytest.raises(ConfigError, match="ask for boxes and masks"):
        check_targets(parse_targets("masks"), boxes=True, masks="instance")
    assert FramedTargets(None, None, None).as_padded() == {}


def test_padding_is_ignore_in_semantic_masks() -> None:
    from tilefeed.pipeline.targets.windows import ScaleJitter, scale_jitter_framing

    n = 8
    framing = scale_jitter_framing(ScaleJitter((SIZE, SIZE), (0.3, 0.5)), 0, 0, np.arange(n),
                                   np.tile([0, 0, TILE, TILE], (n, 1)), SIZE)
    assert (framing.resized < SIZE).all()  # every output padded on the bottom and right
    classes = np.full((n, TILE, TILE), 7, np.uint8)
    semantic = frame_targets(framing, parse_targets("masks"), masks=classes, kind="semantic").masks
    assert semantic is not None
    rows, cols = int(framing.resized[0, 0]), int(framing.resized[0, 1])
    assert (semantic[0, :rows, :cols] == 7).all() and (semantic[0, rows:] == 255).all()
    assert (semantic[0, :, cols:] == 255).all()
    assert (transform_masks(framing, classes, fill=3)[0, rows:] == 3).all()  # the fill asked for
