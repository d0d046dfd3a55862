"""Host-side crop windows: torchvision's RandomResizedCrop distribution, from the sample alone."""

from __future__ import annotations

import math
import random

from typing import Any

import numpy as np
import pytest

from tilefeed.bench.peers.baseline import torchvision_get_params
from tilefeed.pipeline.engine import crops
from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.crops import random_resized_crops
from tilefeed.pipeline.engine.operations import graph_inputs
from tilefeed.pipeline.planning.counters import uniforms
from tilefeed.pipeline.recipe.recipe import Recipe
from tests.helpers import RATIO, SCALE, ks
from tests.pipeline.targets.helpers import object_rows



@pytest.mark.parametrize("height,width", [(224, 224), (168, 224), (224, 120), (60, 300)])
def test_crop_windows_follow_torchvision_distribution(height: int, width: int) -> None:
    n = 6000
    ours = random_resized_crops(3, 1, np.arange(n), height, width, SCALE, RATIO)
    rng = random.Random(0)
    ref = np.array([torchvision_get_params(rng, height, width) for _ in range(n)], dtype=np.float64)
    assert (ours.top >= 0).all() and (ours.left >= 0).all()
    assert (ours.top + ours.height <= height).all() and (ours.left + ours.width <= width).all()
    features = {
        "area": (ours.height * ours.width / (height * width), ref[:, 2] * ref[:, 3] / (height * width)),
        "aspect": (np.log(ours.width / ours.height), np.log(ref[:, 3] / ref[:, 2])),
        "centre_y": ((ours.top + ours.height / 2) / height, (ref[:, 0] + ref[:, 2] / 2) / height),
        "centre_x": ((ours.left + ours.width / 2) / width, (ref[:, 1] + ref[:, 3] / 2) / width),
    }
    critical = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    for name, (a, b) in features.items():
        assert ks(np.asarray(a, float), b) < critical, name
    assert abs(ours.flip.mean() - 0.5) < 0.03


def test_draws_depend_on_seed_epoch_and_sample_only() -> None:
    a = uniforms(1, 2, np.array([5, 9, 11]), 4)
    b = uniforms(1, 2, np.array([11, 5]), 4)
    np.testing.assert_array_equal(a[[2, 0]], b)
    assert not np.array_equal(uniforms(1, 3, np.array([5]), 4), a[:1])
    assert not np.array_equal(uniforms(2, 2, np.array([5]), 4), a[:1])
    u = uniforms(0, 0, np.arange(20000), 2)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


@pytest.mark.parametrize("crop", ["iou", "zoom_iou"])
def test_an_iou_crop_is_drawn_once_and_its_keep_travels_with_its_windows(
        crop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's inputs under an IoU crop: its windows and its keep of the samples' objects
    (one flag an object, in sample order) from one draw, the one ``iou_windows`` makes."""
    tile, n = 64, 40
    offsets, rows = object_rows(np.random.default_rng(0), n, tile)
    boxes = np.tile(np.array([0, 0, tile, tile], np.int64), (n, 1))  # each tile's picture: all of it
    augment = Augment(train=True, tile=tile, normalize=False, half=False, channels_first=False, windows=True,
                      recipe=Recipe(crop=crop))
    samples, keys = np.array([3, 17, 5, 29, 11, 8, 22, 36]), np.arange(8)
    drawn = crops.iou_windows(7, 2, samples, keys, boxes[samples], (offsets, rows), zoom=crop == "zoom_iou")
    calls: list[Any] = []
    real = crops.iou_windows

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(crops, "iou_windows", counted)
    sent = graph_inputs(boxes, augment, 7, 2, 48, samples, keys, (offsets, rows))
    assert len(calls) == 1
    assert sent["keep"].shape == (int((offsets[samples + 1] - offsets[samples]).sum()),)
    assert sent["keep"].any() and not sent["keep"].all()  # a keep that leaves some out
    np.testing.assert_array_equal(sent["keep"], drawn.keep)
    np.testing.assert_array_equal(sent["start"], drawn.start.astype(np.float32))
    np.testing.assert_array_equal(sent["end"], drawn.end.astype(np.float32))
