"""The detection bench: boxes and masks through the Loader and through torchvision's CocoDetection
with transforms v2, on the same generated COCO-format images; both sides hand over what a
detection model takes, and the result draws the same table again from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tilefeed.bench.fixtures.coco import make_coco_folder
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.settings import TargetOptions


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("detection-bench")
    images, annotations = make_coco_folder(root / "coco", count=12, sizes=((96, 72), (72, 96)))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=64, fit="pad"), StoreSettings(shard_size=8), workers=1,
               targets=TargetOptions(annotations=str(annotations), instance_masks=True))
    return images, annotations, store


def test_the_generated_set_holds_what_was_drawn(data: tuple[Path, Path, Path]) -> None:
    images, annotations, _ = data
    document = json.loads(annotations.read_text())
    assert len(document["images"]) == 12
    assert all((images / i["file_name"]).is_file() for i in document["images"])
    for a in document["annotations"]:
        xs, ys = a["segmentation"][0][0::2], a["segmentation"][0][1::2]
        assert a["bbox"] == [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
    again = make_coco_folder(images.parent, count=12)  # complete: reused as it is
    assert again == (images, annotations) and json.loads(annotations.read_text()) == document


def test_both_sides_hand_over_boxes_and_masks_and_the_table_comes_back(data: tuple[Path, Path, Path]) -> None:
    from tilefeed.bench.peers.torchvision_detection import detection_dataloader
    from tilefeed.bench.suites.detection import DATALOADER, LOADER, DetectionResult, bench_detection

    images, annotations, store = data
    peer = detection_dataloader(images, annotations, 4, size=48, workers=0)
    pictures, targets = next(iter(peer))
    assert all(p.shape == (3, 48, 48) and p.dtype == torch.float32 for p in pictures)
    assert all(set(t) == {"boxes", "labels", "masks"} and t["masks"].shape[1:] == (48, 48) for t in targets)
    result = bench_detection(images, annotations, store, batch_size=4, size=48, workers=1, step_ms=5,
                             steps=2, rounds=1)
    assert set(result.rate) == set(result.stall) == {LOADER, DATALOADER}
    assert all(f.median > 0 for f in result.rate.values())
    assert all(0 <= f.median <= 1 for f in result.stall.values())
    assert len({r["samples"] for r in result.runs}) == 1  # the same number of images on both sides
    again = DetectionResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again.table() == result.table() and f"{result.speedup:.2f}x" in result.table()
