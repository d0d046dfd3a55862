"""The boxes move where the pixels move: a bright rectangle in a tile, cut, resized and mirrored
by a real CPU DALI graph (the graph's own ``fn.resize`` with the window as its region, and
``crop_mirror_normalize``'s mirror) and by PIL's resize of a box (the CPU path's batch source),
lands on the box ``transform_boxes`` computes: its width and centre, measured from the pixels'
mass, agree within a fifth of an output pixel (what
resampling a sharp edge leaves of its mass)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from tilefeed.pipeline.targets.geometry import Framing, transform_boxes
from tilefeed.pipeline.targets.objects import Objects

TILE, SIZE = 96, 64
# top, left, height, width of windows: whole pixels (training) and fractional (padded tiles' eval)
WINDOWS = np.array([[0, 0, 96, 96], [10, 7, 60, 80], [5.5, 12.25, 70.5, 66.75], [20, 30, 41, 37]])
RECT = (36, 30, 61, 52)  # x0, y0, x1, y1: pixels 36..60 across, 30..51 down


def tiles() -> np.ndarray:
    pixels = np.zeros((len(WINDOWS), TILE, TILE, 3), np.uint8)
    x0, y0, x1, y1 = RECT
    pixels[:, y0:y1, x0:x1] = 255
    return pixels


def measured(images: np.ndarray) -> np.ndarray:
    """(n, 4) width, centre x, height, centre y of the bright mass, in output pixels."""
    mass = images[..., 0].astype(np.float64) / 255
    cols, rows = mass.sum(axis=1), mass.sum(axis=2)  # (n, S) profiles across and down
    centres = np.arange(SIZE) + 0.5
    total = mass.sum(axis=(1, 2))
    # a middle column's mass is the height, a middle row's the width: the rest is the other side
    width, height = total / cols.max(axis=1), total / rows.max(axis=1)
    across, down = (cols * centres).sum(1) / cols.sum(1), (rows * centres).sum(1) / rows.sum(1)
    return np.stack([width, across, height, down], axis=1)


def expected(flip: np.ndarray) -> np.ndarray:
    start = WINDOWS[:, :2]
    framing = Framing.windows(start, start + WINDOWS[:, 2:], SIZE, flip)
    rows = np.array([[*RECT, 1, 0]] * len(WINDOWS), np.float64)
    b = transform_boxes(framing, Objects.from_rows(np.arange(len(WINDOWS) + 1), rows)).boxes
    return np.stack([b[:, 2] - b[:, 0], (b[:, 0] + b[:, 2]) / 2, b[:, 3] - b[:, 1], (b[:, 1] + b[:, 3]) / 2], 1)


def batch_of(values: np.ndarray) -> Any:
    """A source that gives ``values`` as a batch (a callable of no argument: DALI would pass
    one that takes one the iteration)."""
    return lambda: list(values)


def dali_graph(flip: np.ndarray) -> np.ndarray:
    from nvidia.dali import fn, pipeline_def, types

    start = WINDOWS[:, :2].astype(np.float32)
    end = (WINDOWS[:, :2] + WINDOWS[:, 2:]).astype(np.float32)
    n = len(WINDOWS)

    @pipeline_def(batch_size=n, num_threads=1, device_id=None)
    def graph() -> Any:
        pixels = fn.external_source(source=lambda: list(tiles()), batch=True, layout="HWC")
        s, e, f = (fn.external_source(source=batch_of(v), batch=True)
                   for v in (start, end, flip.astype(np.int32)))
        size = fn.external_source(source=lambda: [np.array([SIZE, SIZE], np.float32)] * n, batch=True)
        resized = fn.resize(pixels, size=size, roi_start=s, roi_end=e, roi_relative=False, antialias=True)
        return fn.crop_mirror_normalize(resized, dtype=types.FLOAT, output_layout="HWC", mean=[0.0] * 3,
                                        std=[1.0] * 3, mirror=f)

    pipe = graph()
    pipe.build()
    return np.stack([np.asarray(t) for t in pipe.run()[0]])


def pil_resize(flip: np.ndarray) -> np.ndarray:
    out = []
    for k, (top, left, height, width) in enumerate(WINDOWS):
        picture = Image.fromarray(tiles()[k]).resize((SIZE, SIZE), Image.Resampling.BILINEAR,
                                                      box=(left, top, left + width, top + height))
        pixels = np.asarray(picture)
        out.append(pixels[:, ::-1] if flip[k] else pixels)
    return np.stack(out).astype(np.float64)


@pytest.mark.parametrize("resample", [dali_graph, pil_resize], ids=["dali", "pil"])
def test_boxes_land_where_the_graph_puts_the_pixels(resample: Any) -> None:
    flip = np.array([0, 1, 0, 1])
    got, want = measured(resample(flip)), expected(flip)
    np.testing.assert_allclose(got, want, atol=0.2, rtol=0)
    # negative control: the boxes of the other flips are not where the pixels went
    assert np.abs(measured(resample(flip)) - expected(1 - flip)).max() > 1.0
