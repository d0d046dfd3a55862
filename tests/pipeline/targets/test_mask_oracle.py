"""The mask work (``transform_masks``, ``affine_masks``, ``instance_masks``, ``remap_ids`` and
``frame_targets``' chain of them) equals a plain numpy statement of the same sampling
(``numpy_masks``) bit for bit, on random batches: fractional windows reaching past the tile on
every side (padding), both flips, an auto-augment policy's moves (rotations, shears and
translations, some at exact ties), semantic fills and instance renumbering after sanitising."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.pipeline.targets import numpy_masks as ref
from tests.pipeline.targets.helpers import object_rows
from tilefeed.pipeline.targets.affine import Affines, affine_masks
from tilefeed.pipeline.options import parse_targets
from tilefeed.pipeline.targets.batches import frame_targets
from tilefeed.pipeline.targets.geometry import Framing, transform_boxes
from tilefeed.pipeline.targets.masks import instance_masks, remap_ids, source_indices, transform_masks
from tilefeed.pipeline.targets.objects import Objects

N = 24  # samples a batch


def host(value: Any) -> np.ndarray:
    """A result as a numpy array, wherever it was made."""
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def framing(rng: np.random.Generator, tile: int, size: int, n: int = N) -> Framing:
    """Fractional windows from half a tile before it to half a tile past it, both flips."""
    start = rng.uniform(-tile / 2, tile, (n, 2))
    end = start + rng.uniform(1, 1.5 * tile, (n, 2))
    return Framing.windows(start, end, size, rng.integers(0, 2, n), rng.integers(0, 2, n))


def affines(rng: np.random.Generator, h: int, w: int, n: int = N, slots: int = 2) -> Affines:
    """Output-to-input maps: rotations (some by exactly 45 or 90 degrees, whose centres land on
    ties), shears and translations, each slot moved or not."""
    angle = np.radians(np.where(rng.random((n, slots)) < 0.3, rng.choice([45.0, 90.0, -45.0], (n, slots)),
                                rng.uniform(-30, 30, (n, slots))))
    shear = np.where(rng.random((n, slots)) < 0.5, rng.choice([0.0, 0.2, -0.3], (n, slots)), 0.0)
    m = np.zeros((n, slots, 2, 3))
    m[..., 0, 0], m[..., 0, 1] = np.cos(angle), -np.sin(angle) + shear
    m[..., 1, 0], m[..., 1, 1] = np.sin(angle), np.cos(angle)
    m[..., 0, 2] = rng.uniform(-w / 3, w / 3, (n, slots)) + (1 - np.cos(angle)) * w / 2 + np.sin(angle) * h / 2
    m[..., 1, 2] = rng.uniform(-h / 3, h / 3, (n, slots)) + (1 - np.cos(angle)) * h / 2 - np.sin(angle) * w / 2
    return Affines.of(m, rng.random((n, slots)) < 0.7)


def instance_batch(rng: np.random.Generator, tile: int, n: int = N) -> tuple[Objects, np.ndarray]:
    """Objects in the store's layout and id maps holding their ids (0 background)."""
    offsets, rows = object_rows(rng, n, tile, most=12)
    counts = np.diff(offsets)
    ids = (rng.integers(0, 256, (n, tile, tile)) % (counts[:, None, None] + 1)).astype(np.uint8)
    return Objects.from_rows(offsets, rows), ids


@pytest.mark.parametrize(("tile", "size"), [(32, 24), (57, 64), (100, 37)])
def test_framed_masks_are_the_oracles(tile: int, size: int) -> None:
    rng = np.random.default_rng(tile + size)
    f = framing(rng, tile, size)
    masks = rng.integers(0, 256, (N, tile, tile), dtype=np.uint8)
    ys = source_indices(f, 0, tile)
    assert (ys < 0).any() and (ys >= 0).any() and f.hflip.any() and f.vflip.any()  # the cases are there
    for fill in (0, 255):
        got = transform_masks(f, masks, fill)
        np.testing.assert_array_equal(host(got), ref.transform_masks(f, masks, fill))
    centre = Framing.centre(N, tile, size + 5, size)
    np.testing.assert_array_equal(host(transform_masks(centre, masks)), ref.transform_masks(centre, masks))


@pytest.mark.parametrize(("h", "w"), [(40, 56), (37, 37)])
def test_moved_masks_are_the_oracles(h: int, w: int) -> None:
    rng = np.random.default_rng(h * w)
    a = affines(rng, h, w)
    masks = rng.integers(0, 256, (N, h, w), dtype=np.uint8)
    for fill in (0, 255):
        want = ref.affine_masks(masks, a, fill)
        assert (want == fill).mean() > (masks == fill).mean()  # some pixels left the source
        np.testing.assert_array_equal(host(affine_masks(masks, a, fill)), want)


def test_per_object_masks_and_renumbering_are_the_oracles() -> None:
    rng = np.random.default_rng(3)
    objects, ids = instance_batch(rng, 48)
    f = framing(rng, 48, 40)
    kept = transform_boxes(f, objects)
    assert len(kept.boxes) < len(objects.boxes)  # sanitising dropped some: their pixels go to 0
    framed = ref.transform_masks(f, ids)
    per_object = instance_masks(framed, kept)
    want = ref.instance_masks(framed, kept)
    assert len(per_object) == len(want)
    for got, expected in zip(per_object, want, strict=True):
        np.testing.assert_array_equal(host(got), expected)
    np.testing.assert_array_equal(host(remap_ids(framed, kept)), ref.remap_ids(framed, kept))


@pytest.mark.parametrize("moved", [False, True])
def test_a_batchs_targets_are_the_oracles_chain(moved: bool) -> None:
    """``frame_targets``: crop and resize, vertical flip, the policy's moves, horizontal flip,
    then the renumbering for the boxes that survive; and a semantic store's fill."""
    rng = np.random.default_rng(11 + moved)
    tile, size = 64, 48
    objects, ids = instance_batch(rng, tile)
    f = framing(rng, tile, size)
    a = affines(rng, size, size) if moved else None
    framed = frame_targets(f, parse_targets(("boxes", "masks")), objects, ids, "instance", affines=a)
    assert framed.objects is not None
    first = Framing(f.origin, f.region, f.resized, f.anchor, f.size, np.zeros_like(f.hflip), f.vflip)
    want = ref.transform_masks(first if moved else f, ids)
    if a is not None:
        want = ref.affine_masks(want, a)
        want = np.where(f.hflip[:, None, None], want[:, :, ::-1], want)
    np.testing.assert_array_equal(host(framed.masks), ref.remap_ids(want, framed.objects))
    classes = rng.integers(0, 21, (N, tile, tile), dtype=np.uint8)
    semantic = frame_targets(f, parse_targets("masks"), masks=classes, kind="semantic", affines=a)
    want = ref.transform_masks(first if moved else f, classes, 255)
    if a is not None:
        want = np.where(f.hflip[:, None, None], ref.affine_masks(want, a, 255)[:, :, ::-1],
                        ref.affine_masks(want, a, 255))
    np.testing.assert_array_equal(host(semantic.masks), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_masks_are_the_oracles_and_stay_there() -> None:
    """The same functions on CUDA tensors: every result on the device, equal to the oracle."""
    rng = np.random.default_rng(5)
    tile, size = 64, 48
    objects, ids = instance_batch(rng, tile)
    f = framing(rng, tile, size)
    a = affines(rng, size, size)
    cuda = torch.from_numpy(ids).cuda()
    framed = transform_masks(f, cuda, 255)
    assert framed.is_cuda
    np.testing.assert_array_equal(host(framed), ref.transform_masks(f, ids, 255))
    moved = affine_masks(framed, a, 255)
    assert moved.is_cuda
    np.testing.assert_array_equal(host(moved), ref.affine_masks(ref.transform_masks(f, ids, 255), a, 255))
    kept = transform_boxes(f, objects)
    plain = ref.transform_masks(f, ids)
    on_device = transform_masks(f, cuda)
    for got, want in zip(instance_masks(on_device, kept), ref.instance_masks(plain, kept), strict=True):
        assert got.is_cuda
        np.testing.assert_array_equal(host(got), want)
    np.testing.assert_array_equal(host(remap_ids(on_device, kept)), ref.remap_ids(plain, kept))
    whole = frame_targets(f, parse_targets(("boxes", "masks")), objects, cuda, "instance", affines=a)
    on_host = frame_targets(f, parse_targets(("boxes", "masks")), objects, ids, "instance", affines=a)
    assert whole.masks is not None and whole.masks.is_cuda
    np.testing.assert_array_equal(host(whole.masks), host(on_host.masks))
