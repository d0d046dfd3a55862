"""Boxes through the Loader's geometry equal torchvision v2's transforms of ``BoundingBoxes``:
the same crop parameters, the same flips, then ``ClampBoundingBoxes`` and
``SanitizeBoundingBoxes``; within 1e-3 px, and the same boxes kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from tests.helpers import RATIO, SCALE
from tests.pipeline.targets.helpers import crop_params, object_rows, reference_boxes
from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.crops import window_inputs
from tilefeed.pipeline.targets.geometry import Framing, frame_boxes, transform_boxes, valid_boxes
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError

TOL = 1e-3


def assert_matches(out: Objects, rows: np.ndarray, offsets: np.ndarray, crops: np.ndarray, tile: int,
                   size: int, hflip: np.ndarray, vflip: np.ndarray, **sanitize: float) -> int:
    """Every sample's surviving boxes, labels, crowd flags and ids equal torchvision's; the
    number of boxes torchvision kept."""
    kept = 0
    for i in range(len(crops)):
        ref = reference_boxes(rows[offsets[i]:offsets[i + 1]], tile, tuple(crops[i]), size, bool(hflip[i]),
                              bool(vflip[i]), **sanitize)
        mine = slice(out.offsets[i], out.offsets[i + 1])
        np.testing.assert_array_equal(out.ids[mine], ref["ids"].numpy(), err_msg=f"sample {i}: kept boxes")
        np.testing.assert_allclose(out.boxes[mine], ref["boxes"].numpy(), atol=TOL, rtol=0)
        np.testing.assert_array_equal(out.labels[mine], ref["labels"].numpy())
        np.testing.assert_array_equal(out.iscrowd[mine], ref["iscrowd"].numpy())
        kept += len(ref["ids"])
    return kept


@pytest.mark.parametrize(("tile", "size"), [(64, 32), (57, 224), (96, 96)])
def test_boxes_equal_torchvision_for_random_resized_crop_and_flips(tile: int, size: int) -> None:
    rng = np.random.default_rng(tile + size)
    n = 120
    offsets, rows = object_rows(rng, n, tile)
    crops = crop_params(n, tile, seed=size)
    hflip, vflip = rng.integers(0, 2, n), rng.integers(0, 2, n)
    start = crops[:, :2].astype(np.float32)  # as the graph takes them
    framing = Framing.windows(start, start + crops[:, 2:].astype(np.float32), size, hflip, vflip)
    out = transform_boxes(framing, Objects.from_rows(offsets, rows))
    kept = assert_matches(out, rows, offsets, crops, tile, size, hflip, vflip)
    assert 0 < kept < len(rows)  # the test saw boxes removed and boxes kept


def test_the_same_boxes_as_torchvision_under_larger_thresholds() -> None:
    rng = np.random.default_rng(5)
    n, tile, size = 80, 64, 48
    offsets, rows = object_rows(rng, n, tile, small=False)
    crops = crop_params(n, tile, seed=1)
    flips = rng.integers(0, 2, n)
    framing = Framing.windows(crops[:, :2], crops[:, :2] + crops[:, 2:], size, flips)
    objects = Objects.from_rows(offsets, rows)
    loose = transform_boxes(framing, objects)
    strict = transform_boxes(framing, objects, min_size=4.0, min_area=40.0)
    assert len(strict.boxes) < len(loose.boxes)  # the thresholds do remove boxes here
    assert_matches(strict, rows, offsets, crops, tile, size, flips, np.zeros(n), min_size=4.0, min_area=40.0)


def test_a_window_one_pixel_off_is_caught() -> None:
    """The comparison sees a framing that is not torchvision's (a negative control)."""
    rng = np.random.default_rng(2)
    n, tile, size = 40, 64, 32
    offsets, rows = object_rows(rng, n, tile, small=False)
    crops = crop_params(n, tile, seed=3)
    zeros = np.zeros(n)
    moved = crops[:, :2] + [0.0, 1.0]
    framing = Framing.windows(moved, moved + crops[:, 2:], size)
    with pytest.raises(AssertionError):
        assert_matches(transform_boxes(framing, Objects.from_rows(offsets, rows)), rows, offsets, crops, tile,
                       size, zeros, zeros)


def test_the_loaders_training_windows_are_whole_pixels_and_match_torchvision() -> None:
    """The windows the Loader sends the graph (``window_inputs``, with each picture's offset in
    its tile): whole pixels, so torchvision's integer crops are the reference."""
    rng = np.random.default_rng(7)
    n, tile, size = 100, 48, 32
    pictures = np.array([[4, 0, 40, 48]] * n)  # top, left, height, width: a padded tile
    augment = Augment(train=True, tile=tile, normalize=False, half=False, channels_first=False,
                      scale=SCALE, ratio=RATIO, windows=True)
    start, end, flip = window_inputs(pictures, augment, seed=3, epoch=1, samples=np.arange(n),
                                     keys=np.arange(n))
    assert np.array_equal(start, np.round(start)) and np.array_equal(end, np.round(end))
    offsets, rows = object_rows(rng, n, tile)
    out = transform_boxes(Framing.windows(start, end, size, flip), Objects.from_rows(offsets, rows))
    crops = np.concatenate([start, end - start], axis=1).astype(np.float64)
    assert_matches(out, rows, offsets, crops, tile, size, flip, np.zeros(n))


def test_fractional_windows_follow_torchvisions_box_kernels() -> None:
    """Evaluation windows of padded tiles are fractional: the same arithmetic as torchvision's
    box kernels given those fractional crops."""
    n, tile, size = 30, 64, 40
    pictures = np.array([[8, 3, 47, 61]] * n)
    augment = Augment(train=False, tile=tile, normalize=False, half=False, channels_first=False, windows=True)
    start, end, flip = window_inputs(pictures, augment, seed=0, epoch=0, samples=np.arange(n),
                                     keys=np.arange(n), size=size)
    assert not np.array_equal(start, np.round(start))  # the case this test is for
    offsets, rows = object_rows(np.random.default_rng(1), n, tile)
    out = transform_boxes(Framing.windows(start, end, size, flip), Objects.from_rows(offsets, rows))
    crops = np.concatenate([start, end - start], axis=1).astype(np.float64)
    assert_matches(out, rows, offsets, crops, tile, size, flip, flip)


CENTRE = [(64, 64, 64), (64, 73, 64), (64, 36, 32), (57, 256, 224)]  # tile, resized, output


@pytest.mark.parametrize(("tile", "resized", "size"), CENTRE)
def test_eval_centre_framing_is_resize_then_the_graphs_centre_crop(tile: int, resized: int, size: int) -> None:
    rng = np.random.default_rng(resized)
    n = 20
    offsets, rows = object_rows(rng, n, tile)
    out = frame_boxes(Framing.centre(n, tile, resized, size), Objects.from_rows(offsets, rows))
    anchor = (resized - size + 1) // 2  # DALI's crop: (resized - size) / 2 rounded half up
    for i in range(n):
        boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[offsets[i]:offsets[i + 1], :4].copy()),
                                         format="XYXY", canvas_size=(tile, tile))
        ref = v2.ClampBoundingBoxes()(F.crop(F.resize(boxes, [resized, resized]), anchor, anchor, size, size))
        np.testing.assert_allclose(out.boxes[offsets[i]:offsets[i + 1]], ref.numpy(), atol=TOL, rtol=0)


def test_the_graphs_centre_crop_anchor_is_dalis() -> None:
    """The anchor ``Framing.centre`` assumes is the one DALI's crop takes (a real CPU graph)."""
    from nvidia.dali import fn, pipeline_def, types  # noqa: F401 - the real graph's crop

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def crop(ramp: np.ndarray, side: np.ndarray) -> object:
        pixels = fn.external_source(source=lambda: [ramp], batch=True, layout="HWC")
        return fn.crop(pixels, crop=fn.external_source(source=lambda: [side], batch=True))

    for resized, size in [(10, 7), (12, 7), (257, 224), (256, 224)]:
        ramp = np.tile(np.arange(resized, dtype=np.uint8)[None, :, None], (resized, 1, 3))
        graph = crop(ramp, np.array([size, size], np.float32))
        graph.build()
        first = int(np.asarray(graph.run()[0][0])[0, 0, 0])
        assert first == Framing.centre(1, resized, resized, size).anchor[0, 1], (resized, size)


def test_labels_crowd_flags_and_ids_leave_with_their_boxes() -> None:
    offsets = np.array([0, 3, 3, 5])
    rows = np.array([[0, 0, 10, 10, 7, 0], [30, 30, 30.5, 31, 8, 1], [5, 5, 20, 20, 9, 1],
                     [0, 0, 0.5, 8, 3, 0], [2, 2, 30, 30, 4, 0]], dtype=np.float64)
    framing = Framing.windows(np.zeros((3, 2)), np.full((3, 2), 32.0), 32)
    out = transform_boxes(framing, Objects.from_rows(offsets, rows))
    assert out.offsets.tolist() == [0, 2, 2, 3]
    assert out.labels.tolist() == [7, 9, 4] and out.iscrowd.tolist() == [0, 1, 0]
    assert out.ids.tolist() == [0, 2, 1]


def test_gather_takes_a_batchs_rows_from_the_whole_store() -> None:
    offsets, rows = object_rows(np.random.default_rng(0), 10, 32)
    tiles = np.array([7, 2, 2, 9])
    batch = Objects.gather(offsets, rows, tiles)
    for i, t in enumerate(tiles):
        np.testing.assert_array_equal(batch.boxes[batch.offsets[i]:batch.offsets[i + 1]],
                                      rows[offsets[t]:offsets[t + 1], :4])
        count = offsets[t + 1] - offsets[t]
        assert batch.ids[batch.offsets[i]:batch.offsets[i + 1]].tolist() == list(range(count))


def test_refusals_are_torchvisions() -> None:
    framing = Framing.windows(np.zeros((1, 2)), np.full((1, 2), 8.0), 8)
    objects = Objects.from_rows(np.array([0, 0]), np.zeros((0, 6)))
    with pytest.raises(ConfigError, match="min_size"):
        transform_boxes(framing, objects, min_size=0.5)
    with pytest.raises(ValueError, match="min_size"):  # torchvision refuses the same value
        v2.SanitizeBoundingBoxes(min_size=0.5)
    with pytest.raises(ConfigError, match="min_area"):
        valid_boxes(np.zeros((0, 4)), np.zeros((0, 2)), min_area=0.0)
    with pytest.raises(ConfigError, match="offsets"):
        Objects.from_rows(np.array([1, 2]), np.zeros((1, 6)))
