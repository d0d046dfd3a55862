"""Aspect-true tiles (--fit pad): crops and framing of the whole picture, as torchvision's."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import photo, psnr
from tilefeed.bench.peers.baseline import torchvision_get_params
from tests.helpers import RATIO, SCALE, ks

SIZES = [(320, 240), (240, 320), (400, 200), (256, 256)]  # width, height


@pytest.fixture(scope="module")
def pad_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("aspect")
    for k, (w, h) in enumerate(SIZES):
        (root / "src" / f"c{k}").mkdir(parents=True)
        photo(k, w, h).save(root / "src" / f"c{k}" / "0.png")
    preprocess(root / "src", root / "store", TileSettings(tile=400, fit="pad", background=(0, 0, 0)),
               StoreSettings(codec="none"), workers=1)
    return root / "src", root / "store"


def test_boxes_record_where_each_picture_lies(pad_store: tuple[Path, Path]) -> None:
    _, store = pad_store
    reader = StoreReader(store)
    assert reader.padded
    assert reader.boxes.tolist() == [[50, 0, 300, 400], [0, 50, 400, 300], [100, 0, 200, 400],
                                     [0, 0, 400, 400]]


@pytest.mark.parametrize("sample", range(len(SIZES)))
def test_training_crops_follow_torchvision_on_the_original_picture(
        pad_store: tuple[Path, Path], sample: int) -> None:
    _, store = pad_store
    loader = Loader(store, 4, train=True)
    width, height = SIZES[sample]
    top, left, box_h, box_w = loader.reader.boxes[sample]
    n = 3000
    starts, ends = [], []
    for epoch in range(n):
        start, end, _ = loader.windows(epoch, np.array([sample]))
        starts.append(start[0])
        ends.append(end[0])
    start, end = np.array(starts, np.float64), np.array(ends, np.float64)
    assert (start[:, 0] >= top).all() and (start[:, 1] >= left).all(), "a crop reached the padding"
    assert (end[:, 0] <= top + box_h).all() and (end[:, 1] <= left + box_w).all(), "a crop reached the padding"
    # the windows in the original picture's pixels
    sy, sx = height / box_h, width / box_w
    y0, x0 = (start[:, 0] - top) * sy, (start[:, 1] - left) * sx
    h, w = (end[:, 0] - start[:, 0]) * sy, (end[:, 1] - start[:, 1]) * sx
    rng = random.Random(sample)
    ref = np.array([torchvision_get_params(rng, height, width) for _ in range(n)], dtype=np.float64)
    critical = 1.95 * math.sqrt(2 / n)  # two-sample KS at alpha = 0.001
    pairs = {
        "area": (h * w / (height * width), ref[:, 2] * ref[:, 3] / (height * width)),
        "aspect": (np.log(w / h), np.log(ref[:, 3] / ref[:, 2])),
        "centre y": ((y0 + h / 2) / height, (ref[:, 0] + ref[:, 2] / 2) / height),
        "centre x": ((x0 + w / 2) / width, (ref[:, 1] + ref[:, 3] / 2) / width),
    }
    for name, (ours, theirs) in pairs.items():
        assert ks(ours, theirs) < critical, name
    assert SCALE == (0.08, 1.0) and RATIO == (3 / 4, 4 / 3)


def torchvision_eval(image: Image.Image, size: int = 224, resize: int = 256) -> np.ndarray:
    """torchvision's Resize(256) + CenterCrop(224) on a PIL image (bilinear, PIL's antialiasing)."""
    w, h = image.size
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    resized = image.resize((nw, nh), Image.Resampling.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.asarray(resized.crop((left, top, left + size, top + size)))


def test_evaluation_framing_matches_torchvision_on_the_original(pad_store: tuple[Path, Path],
                                                                shape: str) -> None:
    src, store = pad_store
    with Loader(store, 4, shuffle=False, size=224, dtype=torch.uint8, layout="NHWC",
                with_index=True) as loader:
        images, _, idx = next(iter(loader))
    for image, i in zip(images.numpy(), idx.tolist(), strict=True):
        with Image.open(src / f"c{i}" / "0.png") as original:
            expected = torchvision_eval(original.convert("RGB"))
        assert psnr(image, expected) > 32, i
