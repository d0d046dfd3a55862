"""Boxes and masks through an auto-augment policy's geometric ops equal torchvision v2's own op
code (``_apply_image_or_video_transform``, the calls its policies make for the image) applied to
``BoundingBoxes`` and ``Mask``: for every geometric op of every torchvision policy, at fixed
magnitude bins and both signs, boxes within 1e-3 px and masks pixel for pixel but where a
pixel centre lands within 1e-3 px of a tie between two source pixels (there torchvision's
float32 rounding decides; under 4% of a mask). Neighbouring bins are a negative control."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from tilefeed.pipeline.recipe.policy_tables import Family, _matrix, _tv_param
from tilefeed.pipeline.targets.affine import Affines, affine_boxes, affine_masks, hflip_boxes
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError

TOL = 1e-3  # px, boxes
TIE = 1e-3  # px: a mask pixel whose source position is this close to a tie may differ
H, W = 40, 56  # not square: the axes cannot be swapped unseen
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
POLICIES: dict[str, tuple[Any, int, bool]] = {  # torchvision's class, its bins, wide tables
    "trivial_wide": (v2.TrivialAugmentWide, 31, True),
    "rand": (v2.RandAugment, 31, False),
    "auto_imagenet": (v2.AutoAugment, 10, False),
}


def torchvision_magnitude(cls: Any, name: str, bins: int, b: int, sign: float) -> float:
    """The magnitude torchvision's policy passes for op ``name`` at bin ``b``: its own table,
    negated for a negative sign (its ops are all signed)."""
    table, signed = cls._AUGMENTATION_SPACE[name]
    assert signed
    return sign * float(table(bins, H, W)[b])


def torchvision_op(cls: Any, target: Any, name: str, magnitude: float) -> Any:
    """torchvision's op on a box or mask tensor, with nearest sampling and fill 0 (its defaults)."""
    policy = cls()
    return policy._apply_image_or_video_transform(target, name, magnitude, v2.InterpolationMode.NEAREST,
                                                  policy._fill)


def tilefeed_affine(name: str, bins: int, wide: bool, b: int, sign: float) -> Affines:
    """The matrix the image path warps by for the same op, bin and sign."""
    from tilefeed.pipeline.recipe.policy_tables import _TV_NAMES

    op, _, amount = _tv_param(name, float(b), sign, np.array([H, W], np.float64), wide, bins)
    assert op is _TV_NAMES[name]
    matrix = _matrix(op, amount, np.array([H, W], np.float64), Family.TORCHVISION)
    return Affines.of(matrix[None, None], np.ones((1, 1), bool))


def random_boxes(rng: np.random.Generator, m: int) -> np.ndarray:
    x0, y0 = rng.uniform(0, W - 2, m), rng.uniform(0, H - 2, m)
    return np.stack([x0, y0, np.minimum(x0 + rng.uniform(1, W / 2, m), W),
                     np.minimum(y0 + rng.uniform(1, H / 2, m), H)], axis=1)


def near_ties(affines: Affines) -> np.ndarray:
    """(H, W) bool: output pixels whose source position (in float64) lies within ``TIE`` of a
    half-way point between two source pixels."""
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float64) + 0.5
    m = affines.matrices[0, 0]
    near = np.zeros((H, W), bool)
    for row in m:
        s = row[0] * xs + row[1] * ys + row[2] - 0.5
        near |= np.abs(np.abs(s - np.floor(s)) - 0.5) < TIE
    return near


def control(name: str, bins: int, wide: bool, b: int, sign: float, affines: Affines) -> Affines:
    """The nearest other bin whose op differs (translations truncate to whole pixels, so a
    neighbouring bin may translate by the same amount)."""
    for other in (b - 1, b + 1, b - 2, b + 2):
        if 0 < other < bins:
            made = tilefeed_affine(name, bins, wide, other, sign)
            if not np.array_equal(made.matrices, affines.matrices):
                return made
    raise AssertionError("no control bin")


CASES = [(policy, name, b, sign) for policy, (_, bins, _) in POLICIES.items() for name in GEOMETRIC
         for b in sorted({1, bins // 3, bins // 2, bins // 2 + 1, bins - 1}) for sign in (1.0, -1.0)]


@pytest.mark.parametrize(("policy", "name", "b", "sign"), CASES)
def test_boxes_and_masks_equal_torchvisions_op(policy: str, name: str, b: int, sign: float) -> None:
    cls, bins, wide = POLICIES[policy]
    rng = np.random.default_rng(b * 10 + len(name))
    rows = random_boxes(rng, 24)
    affines = tilefeed_affine(name, bins, wide, b, sign)
    magnitude = torchvision_magnitude(cls, name, bins, b, sign)

    objects = Objects(np.array([0, len(rows)]), rows, np.ones(len(rows), np.int64),
                      np.zeros(len(rows), np.int64), np.arange(len(rows)))
    got = affine_boxes(objects, affines, np.array([[H, W]], np.float64)).boxes
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows.copy()), format="XYXY", canvas_size=(H, W))
    want = torchvision_op(cls, boxes, name, magnitude).numpy()
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)

    # negative control: the neighbouring bin's boxes are not within the tolerance
    other = control(name, bins, wide, b, sign, affines)
    moved = affine_boxes(objects, other, np.array([[H, W]], np.float64)).boxes
    assert np.abs(moved - want).max() > 10 * TOL

    # masks: ids in blobs and stripes, so every kind of edge is sampled
    mask = ((np.arange(H)[:, None] * 7 + np.arange(W)[None, :] * 3) % 23).astype(np.uint8) + 1
    mask[rng.random((H, W)) < 0.1] = 0
    want_mask = torchvision_op(cls, tv_tensors.Mask(torch.from_numpy(mask[None].copy())), name,
                               magnitude).numpy()[0]
    got_mask = affine_masks(mask[None], affines, fill=0)[0].numpy()
    differ, near = got_mask != want_mask, near_ties(affines)
    assert not (differ & ~near).any(), f"{(differ & ~near).sum()} pixels differ away from ties"
    assert differ.mean() < 0.04  # a few ties only (a 45 degree turn's diagonal: 3%)
    shifted = affine_masks(mask[None], other, fill=0)[0].numpy()
    assert (shifted != want_mask).mean() > 0.01


def test_slots_chain_and_other_ops_leave_targets_alone() -> None:
    """Two slots compose in order (rotate, then shear, as torchvision applies them one after
    the other); a slot that is not geometric changes nothing; the flip mirrors."""
    cls, bins, wide = POLICIES["rand"]
    rows = random_boxes(np.random.default_rng(3), 16)
    first = tilefeed_affine("Rotate", bins, wide, 20, 1.0)
    second = tilefeed_affine("ShearX", bins, wide, 12, -1.0)
    chained = Affines.of(np.stack([first.matrices[0, 0], second.matrices[0, 0]])[None],
                         np.array([[True, True]]))
    objects = Objects(np.array([0, len(rows)]), rows, np.ones(len(rows), np.int64),
                      np.zeros(len(rows), np.int64), np.arange(len(rows)))
    got = affine_boxes(objects, chained, np.array([[H, W]])).boxes
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows.copy()), format="XYXY", canvas_size=(H, W))
    boxes = torchvision_op(cls, boxes, "Rotate", torchvision_magnitude(cls, "Rotate", bins, 20, 1.0))
    boxes = torchvision_op(cls, boxes, "ShearX", torchvision_magnitude(cls, "ShearX", bins, 12, -1.0))
    np.testing.assert_allclose(got, boxes.numpy(), atol=TOL, rtol=0)
    reversed_order = Affines.of(chained.matrices[:, ::-1].copy(), chained.moved)
    assert np.abs(affine_boxes(objects, reversed_order, np.array([[H, W]])).boxes - boxes.numpy()).max() > 0.1

    skipped = Affines.of(chained.matrices, np.array([[False, False]]))
    np.testing.assert_array_equal(affine_boxes(objects, skipped, np.array([[H, W]])).boxes, rows)
    mask = np.arange(H * W, dtype=np.int64).reshape(1, H, W).astype(np.uint8)
    np.testing.assert_array_equal(affine_masks(mask, skipped), mask)

    flipped = hflip_boxes(objects, np.array([True]), np.array([[H, W]])).boxes
    want = tv_tensors.BoundingBoxes(torch.from_numpy(rows.copy()), format="XYXY", canvas_size=(H, W))
    np.testing.assert_allclose(flipped, v2.functional.horizontal_flip(want).numpy(), atol=1e-9, rtol=0)


def test_shapes_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ConfigError, match="affines"):
        Affines(np.zeros((2, 1, 3, 3)), np.zeros((2, 1), bool))
    one = Affines.of(np.eye(2, 3)[None, None], np.ones((1, 1)))
    with pytest.raises(ConfigError, match="affine_masks"):
        affine_masks(np.zeros((2, 4, 4), np.uint8), one)
