"""Random erasing against torchvision's and timm's RandomErasing: the same fill for the same box,
the same distributions of boxes, counts and values, per-sample determinism, every layout and dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from timm.data import random_erasing as timm_erasing
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from tests.pipeline.recipe.two_sample import chi2_same, ks_same
from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.recipe.erasing import STREAM, Fill, RandomErasing
from tilefeed.store.errors import ConfigError
from tests.pipeline.recipe.helpers import as_nchw, in_layout

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("NCHW", "NHWC", "channels_last")
SAMPLES = 3000  # images per distribution check
SIDE = 32


def box_of(mask: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(top, left, height, width) of the one rectangle set in a 2-d mask, or None."""
    rows, cols = torch.nonzero(mask.any(1)).flatten(), torch.nonzero(mask.any(0)).flatten()
    if not len(rows):
        return None
    return int(rows[0]), int(cols[0]), int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)


def features(boxes: list[tuple[int, int, int, int] | None]) -> dict[str, np.ndarray]:
    """Erased or not per image; per box its area fraction, log aspect (h / w) and relative top."""
    found = [b for b in boxes if b is not None]
    t, _, h, w = (np.array(v, float) for v in zip(*found, strict=True))
    return {"erased": np.array([b is not None for b in boxes]), "area": h * w / SIDE**2,
            "aspect": np.log(h / w), "top": t / (SIDE - h + 1)}


def our_boxes(erasing: RandomErasing, seed: int = 5) -> list[tuple[int, int, int, int] | None]:
    images = erasing.erase(torch.zeros(SAMPLES, 1, SIDE, SIDE), np.arange(SAMPLES), seed, 3)
    return [box_of(image[0] != 0) for image in images]


def torchvision_boxes(**options: Any) -> list[tuple[int, int, int, int] | None]:
    torch.manual_seed(0)
    reference = v2.RandomErasing(value=1.0, **options)
    return [box_of(reference(torch.zeros(1, SIDE, SIDE))[0] != 0) for _ in range(SAMPLES)]


@pytest.fixture(scope="module")
def torchvision_features() -> dict[str, np.ndarray]:
    return features(torchvision_boxes(p=0.25, scale=(0.02, 0.33), ratio=(0.3, 3.3)))


def test_boxes_are_drawn_as_torchvisions(torchvision_features: dict[str, np.ndarray]) -> None:
    ours = features(our_boxes(RandomErasing(p=0.25, value=1.0)))
    assert chi2_same(ours["erased"], torchvision_features["erased"])
    for name in ("area", "aspect", "top"):
        assert ks_same(ours[name], torchvision_features[name]), name


def test_negative_controls_fail(torchvision_features: dict[str, np.ndarray]) -> None:
    """The checks above can fail: p 0.35 for 0.25, scale up to 0.45 for 0.33."""
    assert not chi2_same(features(our_boxes(RandomErasing(p=0.35, value=1.0)))["erased"],
                         torchvision_features["erased"])
    wider = features(our_boxes(RandomErasing(p=0.25, scale=(0.02, 0.45), value=1.0)))
    assert not ks_same(wider["area"], torchvision_features["area"])


def test_counts_boxes_and_channel_values_are_drawn_as_timms(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[int, torch.Tensor]] = []  # per box timm fills: the image's number, the values
    sizes: list[tuple[int, int]] = []  # and the box's height and width
    fill = timm_erasing._get_pixels

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        values = fill(*args, **kwargs)
        made.append((image, values))
        sizes.append(tuple(args[2][1:]))
        return values

    monkeypatch.setattr(timm_erasing, "_get_pixels", recorded)
    options: dict[str, Any] = {"probability": 0.6, "min_area": 0.05, "max_area": 0.5, "min_aspect": 0.4,
                               "mode": "rand", "max_count": 3}
    reference = timm_erasing.RandomErasing(device="cpu", **options)
    ours = RandomErasing.from_timm(**options)
    import random
    random.seed(0)
    torch.manual_seed(0)
    for image in range(SAMPLES):  # noqa: B007 (the recorder reads it)
        reference(torch.zeros(3, SIDE, SIDE))
    want_counts = np.bincount([i for i, _ in made], minlength=SAMPLES)
    want_values = torch.cat([v.flatten() for _, v in made]).numpy()
    boxes = ours.boxes(np.arange(SAMPLES), 5, 3, SIDE, SIDE)
    counts = np.bincount(boxes.sample, minlength=SAMPLES)
    assert chi2_same(counts, want_counts)
    want_h, want_w = (np.array(v, float) for v in zip(*sizes, strict=True))
    assert ks_same(boxes.height * boxes.width / SIDE**2, want_h * want_w / SIDE**2)
    assert ks_same(np.log(boxes.height / boxes.width), np.log(want_h / want_w))
    assert not chi2_same(np.bincount(RandomErasing.from_timm(**{**options, "max_count": 2}).boxes(
        np.arange(SAMPLES), 5, 3, SIDE, SIDE).sample, minlength=SAMPLES), want_counts)  # negative control
    # per channel and box: one standard normal value, as timm's 'rand' fills
    images = ours.erase(torch.full((SAMPLES, 3, SIDE, SIDE), float("nan")), np.arange(SAMPLES), 5, 3)
    first = [(i, t, left) for i, b, t, left in zip(boxes.sample, boxes.box, boxes.top, boxes.left, strict=True)
             if b == 0]
    values = torch.stack([images[i, :, t, left] for i, t, left in first]).flatten().numpy()
    assert ks_same(values[:3000], want_values[:3000])
    assert not ks_same(1.3 * values[:3000], want_values[:3000])  # negative control: another spread


def test_random_values_are_standard_normal_per_pixel_as_torchvisions() -> None:
    torch.manual_seed(0)
    reference = v2.RandomErasing(p=1.0, value="random")
    want = []
    for _ in range(200):
        params = reference.make_params([torch.zeros(3, SIDE, SIDE)])
        if params["v"] is not None:
            want.append(params["v"].flatten())
    want_values = torch.cat(want).numpy()[:5000]
    erasing = RandomErasing(p=1.0, value="random")
    images = erasing.erase(torch.full((200, 3, SIDE, SIDE), float("nan")), np.arange(200), 1, 0)
    values = images[~images.isnan()].numpy()
    assert ks_same(values[:5000], want_values)
    assert not ks_same(values[:5000] + 0.15, want_values)  # negative control: shifted
    # each pixel its own value: a box of many pixels holds many values
    assert len(np.unique(values)) > 0.99 * len(values)


@pytest.mark.parametrize("value", [0.0, (0.5, -1.0, 2.0)])
def test_constant_fill_is_torchvisions_erase_of_the_same_box(value: float | tuple[float, ...]) -> None:
    erasing = RandomErasing(p=0.7, value=value)
    batch = torch.randn(64, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    keys = np.arange(100, 164)
    ours = erasing.erase(batch, keys, 2, 1)
    b = erasing.boxes(keys, 2, 1, SIDE, SIDE)
    numbers = torch.tensor(value if isinstance(value, tuple) else (value,))[:, None, None]
    want = batch.clone()
    for i, t, left, h, w in zip(b.sample, b.top, b.left, b.height, b.width, strict=True):
        want[i] = F.erase(want[i], int(t), int(left), int(h), int(w), numbers)
    assert torch.equal(ours, want)
    assert not torch.equal(batch, want)  # not in place: torchvision's default


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [Fill.RANDOM, Fill.CHANNEL, (0.25, 0.5, -0.75)])
def test_every_layout_and_dtype_is_the_float32_nchw_result(layout: str, dtype: torch.dtype,
                                                           value: Fill | tuple[float, ...]) -> None:
    erasing = RandomErasing(p=0.6, value=value, count=(1, 2), inplace=True)
    nchw = torch.randn(16, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(3)).to(dtype)
    keys = np.arange(16) * 7
    want = erasing.erase(nchw.float(), keys, 4, 2).to(dtype)  # values are made in float32, then cast
    batch = in_layout(nchw, layout)
    strides = batch.stride()
    out = erasing.erase(batch, torch.from_numpy(keys), 4, 2, layout)
    assert out is batch and out.stride() == strides  # in place, in its own layout: no copy
    assert torch.equal(as_nchw(out, layout), want)


def test_a_sample_is_erased_alike_in_any_batch() -> None:
    erasing = RandomErasing(p=0.8, value="random", count=(1, 3))
    batch = torch.randn(24, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(4))
    keys = np.arange(1000, 1024)
    whole = erasing.erase(batch, keys, 6, 1)
    order = np.random.default_rng(0).permutation(24)
    parts = [erasing.erase(batch[order[a:b]], keys[order[a:b]], 6, 1) for a, b in ((0, 5), (5, 17), (17, 24))]
    assert torch.equal(torch.cat(parts), whole[order])
    again = erasing.erase(batch, keys, 6, 1)
    assert torch.equal(again, whole)
    assert not torch.equal(erasing.erase(batch, keys, 6, 2), whole)  # another epoch, other boxes
    # the erasing stream is not the crops': same seed, epoch and keys, other draws
    assert not np.array_equal(uniforms(stream_seed(6, STREAM), 1, keys, 8), uniforms(6, 1, keys, 8))


@pytest.mark.parametrize(("make", "words"), [
    (lambda: RandomErasing(p=1.2), "p should be"),
    (lambda: RandomErasing(scale=(0.5, 0.2)), "scale must be"),
    (lambda: RandomErasing(scale=(0.1, 1.5)), "scale should be between"),
    (lambda: RandomErasing(ratio=(0.0, 2.0)), "ratio must be positive"),
    (lambda: RandomErasing(value="noise"), "value, if a string"),
    (lambda: RandomErasing(count=(2, 1)), "count must be"),
    (lambda: RandomErasing.from_timm(mode="gauss"), "mode must be"),
    (lambda: RandomErasing.from_timm(num_splits=2), "num_splits=2"),
])
def test_bad_options_are_refused_in_one_line(make: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        make()
    assert "\n" not in str(caught.value)


def test_uint8_and_a_value_per_wrong_channel_count_are_refused() -> None:
    with pytest.raises(ConfigError, match="normalised float batch, got torch.uint8"):
        RandomErasing().erase(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), np.arange(2), 0, 0)
    with pytest.raises(ConfigError, match="1 or 3 numbers"):
        RandomErasing(value=(1.0, 2.0)).erase(torch.zeros(2, 3, 8, 8), np.arange(2), 0, 0)
