"""Predictions mapped back to the source image: ground-truth boxes made in source pixels, sent
through the store's frames and the Loader's eval framing as a perfect model would see them,
mapped back, score AP 1.0 in pycocotools' COCO evaluation; a few pixels off, or the mapping
without the frame, score less."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tilefeed.pipeline.targets.geometry import Framing, frame_boxes
from tilefeed.pipeline.targets.mapping import (boxes_to_source, compose, invert, map_boxes, output_to_source,
                                               source_to_output)
from tilefeed.pipeline.targets.objects import Objects

TILE = 128


def frames_of(sizes: np.ndarray, fit: str) -> np.ndarray:
    """(n, 4) the store's frames for pictures of ``sizes`` (w, h) in square tiles: ``pad``
    scales the longer side to the tile and centres, ``crop`` scales the shorter side and cuts."""
    longest = sizes.max(axis=1) if fit == "pad" else sizes.min(axis=1)
    s = TILE / longest
    t = (TILE - sizes * s[:, None]) / 2
    return np.stack([s, s, t[:, 0], t[:, 1]], axis=1)


def dataset(rng: np.random.Generator, n: int, frames_fit: str,
            framing: Framing) -> tuple[dict[str, Any], np.ndarray, list[np.ndarray]]:
    """A COCO ground truth of ``n`` images with boxes visible in the framed output, the frames,
    and each image's boxes in source pixels."""
    sizes = rng.integers(80, 320, (n, 2)).astype(np.float64)
    frames = frames_of(sizes, frames_fit)
    to_out = source_to_output(framing, frames)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    per_image: list[np.ndarray] = []
    for i in range(n):
        w, h = sizes[i]
        boxes: list[np.ndarray] = []
        while len(boxes) < 4:
            x0, y0 = rng.uniform(0, w - 12), rng.uniform(0, h - 12)
            box = np.array([x0, y0, min(w, x0 + rng.uniform(12, w / 2)), min(h, y0 + rng.uniform(12, h / 2))])
            out = map_boxes(box[None], to_out[i])[0]
            if out.min() >= 0 and out[2] <= framing.size[i, 1] and out[3] <= framing.size[i, 0]:
                boxes.append(box)  # inside the output: a model sees all of it
        per_image.append(np.array(boxes))
        images.append({"id": i + 1, "width": int(w), "height": int(h)})
        for k, (x0, y0, x1, y1) in enumerate(boxes):
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": 1 + k % 3,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                "iscrowd": 0})
    truth = {"images": images, "annotations": annotations,
             "categories": [{"id": c, "name": f"shape{c}"} for c in (1, 2, 3)]}
    return truth, frames, per_image


def predictions(framing: Framing, frames: np.ndarray, per_image: list[np.ndarray]) -> list[np.ndarray]:
    """What a perfect model predicts: the stored tile boxes (source through frames) framed as the
    Loader frames the pixels, in output pixels."""
    tile_boxes = [map_boxes(b, frames[i]) for i, b in enumerate(per_image)]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in tile_boxes])])
    rows = np.concatenate([np.concatenate([b, np.zeros((len(b), 2))], axis=1) for b in tile_boxes])
    framed = frame_boxes(framing, Objects.from_rows(offsets, rows))
    return [framed.boxes[framed.offsets[i]:framed.offsets[i + 1]] for i in range(len(per_image))]


def average_precision(truth: dict[str, Any], boxes: list[np.ndarray]) -> float:
    """COCO's AP@[.5:.95] of ``boxes`` (source pixels) as detections, scored 1, labelled as truth."""
    detections = []
    for i, image_boxes in enumerate(boxes):
        labels = [a["category_id"] for a in truth["annotations"] if a["image_id"] == i + 1]
        for (x0, y0, x1, y1), label in zip(image_boxes.tolist(), labels, strict=True):
            detections.append({"image_id": i + 1, "category_id": label, "bbox": [x0, y0, x1 - x0, y1 - y0],
                               "score": 1.0})
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = truth
        coco.createIndex()
        evaluation = COCOeval(coco, coco.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(evaluation.stats[0])


FRAMINGS = {
    "centre crop 0.875": lambda n: Framing.centre(n, TILE, 128, 112),
    "resize only": lambda n: Framing.centre(n, TILE, 96, 96),
    "enlarge and crop": lambda n: Framing.centre(n, TILE, 256, 224),
    "fractional windows": lambda n: Framing.windows(np.tile([10.25, 3.5], (n, 1)),
                                                    np.tile([117.75, 124.5], (n, 1)), 100),
}


@pytest.mark.parametrize("fit", ["pad", "crop"])
@pytest.mark.parametrize("name", list(FRAMINGS))
def test_ground_truth_through_frames_and_eval_framing_scores_ap_one(fit: str, name: str) -> None:
    n = 12
    framing = FRAMINGS[name](n)
    truth, frames, per_image = dataset(np.random.default_rng(len(name)), n, fit, framing)
    predicted = predictions(framing, frames, per_image)
    back = boxes_to_source(predicted, framing, frames)
    for mine, true in zip(back, per_image, strict=True):
        np.testing.assert_allclose(mine, true, atol=1e-3, rtol=0)
    assert average_precision(truth, back) == pytest.approx(1.0)
    # negative controls: three pixels off, and the way back without the store's frame
    shifted = [b + np.array([3.0, 0.0, 3.0, 0.0]) for b in back]
    assert average_precision(truth, shifted) < 0.95
    no_frame = [map_boxes(b, invert(framing.affines())[i]) for i, b in enumerate(predicted)]
    assert average_precision(truth, no_frame) < 0.5


def test_flips_map_back_too() -> None:
    rng = np.random.default_rng(3)
    n = 16
    framing = Framing.windows(np.tile([4.0, 6.0], (n, 1)), np.tile([120.0, 126.0], (n, 1)), 64,
                              rng.integers(0, 2, n), rng.integers(0, 2, n))
    truth, frames, per_image = dataset(rng, n, "pad", framing)
    back = boxes_to_source(predictions(framing, frames, per_image), framing, frames)
    for mine, true in zip(back, per_image, strict=True):
        np.testing.assert_allclose(mine, true, atol=1e-3, rtol=0)


def test_affines_compose_and_invert() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 2, (5, 4)), rng.uniform(-3, 3, (5, 4))
    points = rng.uniform(0, 100, (5, 2))
    both = compose(a, b)
    once = (points * a[:, :2] + a[:, 2:]) * b[:, :2] + b[:, 2:]
    np.testing.assert_allclose(points * both[:, :2] + both[:, 2:], once)
    np.testing.assert_allclose(compose(both, invert(both)), np.tile([1.0, 1.0, 0.0, 0.0], (5, 1)), atol=1e-12)
    framing = Framing.centre(5, TILE, 146, 128)
    np.testing.assert_allclose(compose(source_to_output(framing, a), output_to_source(framing, a)),
                               np.tile([1.0, 1.0, 0.0, 0.0], (5, 1)), atol=1e-9)
