"""Loaders for torchvision's COCO datasets: each sample's COCO image id from its source path, a
dataset's pictures (through Subsets and the v2 wrapper) as store samples, the detection
reference's refusals, and evaluation that hands over image ids and maps predicted boxes and
masks back to the source picture."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.preprocess.targets_data import write_coco
from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.loader.coco import (
    MISSING, CocoEvaluation, coco_dataset, coco_image_ids, dataset_samples, torchvision_detection_loader,
)
from tilefeed.pipeline.reading.reader import source_paths
from tilefeed.preprocess import TileSettings, preprocess
from tilefeed.preprocess.settings import TargetOptions
from tilefeed.store.errors import ConfigError

T = 64


def made(root: Path, fit: str, planted: bool = False, masks: bool = False) -> tuple[Path, Path, Path]:
    """(store, image folder, annotations) of a generated COCO set preprocessed with ``fit``."""
    coco = write_coco(root / "set", images=12, planted=planted)
    store = root / "store"
    preprocess(coco.src, store, TileSettings(tile=T, fit=fit), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=masks))
    return store, coco.src, coco.annotations


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return made(tmp_path_factory.mktemp("coco-pad"), "pad", masks=True)


@pytest.fixture(scope="module")
def stretched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return made(tmp_path_factory.mktemp("coco-stretch"), "stretch")


def dataset(src: Path, annotations: Path) -> Any:
    from torchvision.datasets import CocoDetection

    return CocoDetection(str(src), str(annotations))


def args(**changes: Any) -> argparse.Namespace:
    """references/detection/train.py's defaults for what its loaders read, on the CPU."""
    values = dict(data_augmentation="hflip", batch_size=2, workers=1, device="cpu",
                  model="ssdlite320_mobilenet_v3_large", dataset="coco", use_copypaste=False, use_v2=False,
                  weights=None, test_only=False, backend="pil", aspect_ratio_group_factor=3)
    values.update(changes)
    return argparse.Namespace(**values)


def expected_ids(reader: StoreReader, src: Path, annotations: Path) -> list[int]:
    by_name = {image["file_name"]: image["id"] for image in json.loads(annotations.read_text())["images"]}
    return [by_name[str(Path(p).relative_to(src))] for p in source_paths(reader, np.arange(len(reader)))]


def test_each_sample_gets_the_image_id_of_its_file_name(padded: tuple[Path, Path, Path],
                                                         tmp_path: Path) -> None:
    store, src, annotations = padded
    imgs = dataset(src, annotations).coco.imgs
    with StoreReader(store) as reader:
        want = expected_ids(reader, src, annotations)
        assert len(set(want)) == len(reader) > 10
        assert coco_image_ids(reader, imgs, src).tolist() == want
        # the folder found from the paths alone, or when the store was made elsewhere
        assert coco_image_ids(reader, imgs).tolist() == want
        assert coco_image_ids(reader, imgs, tmp_path / "elsewhere").tolist() == want
        # a picture the entries do not list is MISSING; entries naming none of them refuse
        fewer = {i: e for i, e in imgs.items() if i != want[0]}
        assert coco_image_ids(reader, fewer, src).tolist() == [MISSING, *want[1:]]
        renamed = {i: {**e, "file_name": "x" + e["file_name"]} for i, e in imgs.items()}
        with pytest.raises(ConfigError, match="no folder makes the store's source paths"):
            coco_image_ids(reader, renamed)


def test_a_datasets_pictures_through_subsets_and_the_v2_wrapper(padded: tuple[Path, Path, Path]) -> None:
    from torchvision.datasets import wrap_dataset_for_transforms_v2

    store, src, annotations = padded
    full = dataset(src, annotations)
    inner = torch.utils.data.Subset(wrap_dataset_for_transforms_v2(full), [5, 2, 9, 0])
    nested = torch.utils.data.Subset(inner, [3, 1])  # full's 0 and 2
    assert coco_dataset(nested)[2] == [full.ids[0], full.ids[2]]
    with StoreReader(store) as reader:
        ids = expected_ids(reader, src, annotations)
        samples, image_ids, absent = dataset_samples(reader, nested)
        assert sorted(image_ids.tolist()) == sorted([full.ids[0], full.ids[2]]) and absent == []
        assert [ids[s] for s in samples.tolist()] == image_ids.tolist()
        samples, _, absent = dataset_samples(reader, full)
        assert len(samples) == len(reader) and absent == []
    with pytest.raises(ConfigError, match="not a torchvision CocoDetection"):
        coco_dataset(torch.utils.data.TensorDataset(torch.zeros(2)))


def test_training_loads_the_datasets_pictures_whole_and_mirrored(stretched: tuple[Path, Path, Path]) -> None:
    """--data-augmentation hflip: each whole tile, mirrored at even odds."""
    store, src, annotations = stretched
    chosen = torch.utils.data.Subset(dataset(src, annotations), list(range(8)))
    with torchvision_detection_loader(store, args(), chosen, train=True) as loader:
        assert isinstance(loader, Loader) and len(loader) == 4  # 8 pictures, full batches of 2
        with StoreReader(store) as reader:
            ids = np.array(expected_ids(reader, src, annotations))
        for images, targets in loader:
            assert images.dtype == torch.float32 and 0 <= float(images.min()) and float(images.max()) <= 1
            assert all(set(t) == {"boxes", "labels", "iscrowd"} for t in targets)
        epoch = loader.epoch_indices(0).numpy()
        seen = sorted(ids[epoch].tolist())
        start, end, flip = loader.windows(0, epoch)
        flips = flip.tolist()
    assert seen == sorted(dataset(src, annotations).ids[:8])
    assert np.array_equal(start, np.zeros_like(start)) and np.array_equal(end, np.full_like(end, T))
    assert 0 < sum(flips) < len(flips)


def test_the_detection_scripts_refusals(padded: tuple[Path, Path, Path], stretched: tuple[Path, Path, Path],
                                       tmp_path: Path) -> None:
    store, src, annotations = stretched
    full = dataset(src, annotations)
    for changed, named in ((dict(data_augmentation="multiscale"), "--data-augmentation multiscale"),
                           (dict(dataset="coco_kp"), "--dataset coco_kp"),
                           (dict(data_augmentation="lsj", use_copypaste=True), "--use-copypaste")):
        with pytest.raises(ConfigError, match="flags the tilefeed Loader does not apply") as refused:
            torchvision_detection_loader(store, args(**changed), full, train=True)
        assert named in str(refused.value) and "\n" not in str(refused.value)
    # evaluation applies neither training augmentation
    torchvision_detection_loader(store, args(data_augmentation="multiscale"), full, train=False).close()
    # letterboxed pictures train as their whole tiles, letterbox included
    torchvision_detection_loader(padded[0], args(), dataset(padded[1], padded[2]), train=True).close()
    # a cut picture: neither trained on nor scored whole
    cropped = made(tmp_path / "crop", "crop")
    for train in (True, False):
        with pytest.raises(ConfigError, match="--fit crop, which cuts the pictures"):
            torchvision_detection_loader(cropped[0], args(), dataset(cropped[1], cropped[2]), train=train)
    # a crowd object: dropped by the script without --use-v2, kept by the Loader
    document = json.loads(annotations.read_text())
    document["annotations"][0]["iscrowd"] = 1
    crowded = tmp_path / "crowded.json"
    crowded.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="without --use-v2 drops crowd objects"):
        torchvision_detection_loader(store, args(), dataset(src, crowded), train=True)
    torchvision_detection_loader(store, args(use_v2=True), dataset(src, crowded), train=True).close()


def test_evaluation_refuses_a_dataset_the_store_lacks_pictures_of(tmp_path: Path) -> None:
    store, src, annotations = made(tmp_path, "stretch", planted=True)  # the planted pictures are rejected
    full = dataset(src, annotations)
    with pytest.raises(ConfigError, match="evaluation pictures of the dataset are not in the store"):
        torchvision_detection_loader(store, args(), full, train=False)
    with pytest.warns(UserWarning, match="training pictures of the dataset are not in the store"):
        torchvision_detection_loader(store, args(), full, train=True).close()


def decoded(annotation: dict[str, Any], height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_utils

    segmentation = annotation["segmentation"]
    if isinstance(segmentation, list):
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    else:
        rle = mask_utils.frPyObjects(segmentation, height, width) if isinstance(segmentation["counts"], list) \
            else segmentation
    return mask_utils.decode(rle).astype(bool)


def test_evaluation_hands_over_image_ids_and_maps_boxes_and_masks_back(padded: tuple[Path, Path, Path]) -> None:
    """The letterboxed tiles' own targets, taken as predictions, land on the annotations: boxes
    within 1e-3 px, masks overlapping the annotations' (IoU); the masks resized to the picture
    without the letterbox's frame (the negative control) overlap far less."""
    store, src, annotations = padded
    full = dataset(src, annotations)
    document = json.loads(annotations.read_text())
    ious: list[float] = []
    naive: list[float] = []
    masked = args(model="maskrcnn_resnet50_fpn")
    with torchvision_detection_loader(store, masked, full, train=False) as evaluation:
        assert isinstance(evaluation, CocoEvaluation) and evaluation.dataset is full
        assert len(evaluation) == len(full) == 13
        seen = []
        for images, targets in evaluation:
            assert images.shape == (1, 3, T, T)
            seen += [t["image_id"] for t in targets]
            predicted = [{"boxes": t["boxes"], "labels": t["labels"], "scores": torch.ones(len(t["boxes"])),
                          "masks": t["masks"][:, None].float()} for t in targets]
            for target, back in zip(targets, evaluation.to_source(predicted, targets), strict=True):
                entry = full.coco.imgs[target["image_id"]]
                height, width = entry["height"], entry["width"]
                wanted = [a for a in document["annotations"] if a["image_id"] == target["image_id"]]
                xyxy = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in wanted)])
                xyxy = xyxy.reshape(-1, 4)
                assert back["boxes"].dtype == torch.float32
                assert np.allclose(back["boxes"].numpy(), xyxy, atol=1e-3, rtol=0)
                assert back["masks"].shape == (len(wanted), 1, height, width)
                stretched_masks = torch.nn.functional.interpolate(target["masks"][:, None].float(),
                                                                  size=(height, width), mode="bilinear")
                truths = [decoded(annotation, height, width) for annotation in wanted]
                for k, truth in enumerate(truths):
                    # where objects overlap the store keeps one instance id a pixel: score the rest
                    alone = ~np.any([t for j, t in enumerate(truths) if j != k], axis=0) if len(truths) > 1 \
                        else np.ones_like(truth)
                    if (truth & alone).sum() < 40:
                        continue
                    for masks, into in ((back["masks"], ious), (stretched_masks, naive)):
                        got = masks[k, 0].numpy() >= 0.5
                        into.append((got & truth & alone).sum() / ((got | truth) & alone).sum())
    assert sorted(seen) == sorted(full.ids)
    assert len(ious) >= 10 and min(ious) > 0.6 and float(np.mean(ious)) > 0.8, ious
    assert float(np.mean(naive)) < float(np.mean(ious)) - 0.2, (naive, ious)


def test_ssdlite_trains_on_ssds_iou_crops(stretched: tuple[Path, Path, Path]) -> None:
    """--data-augmentation ssdlite: RandomIoUCrop's windows inside each picture, then the flip."""
    store, src, annotations = stretched
    with torchvision_detection_loader(store, args(data_augmentation="ssdlite"), dataset(src, annotations),
                                      train=True) as loader:
        assert loader.recipe is not None and loader.recipe.crop == "iou"
        epoch = loader.epoch_indices(0).numpy()
        start, end, _ = loader.windows(0, epoch)
        assert list(next(iter(loader))[1][0]) == ["boxes", "labels", "iscrowd"]
    assert (start >= 0).all() and (end <= T).all()
    assert ((end - start) < T).any()  # some windows cut the picture


def test_ssd_trains_on_photometric_distortion_zoom_out_and_iou_crops(
        stretched: tuple[Path, Path, Path]) -> None:
    """--data-augmentation ssd: RandomPhotometricDistort, RandomZoomOut on the presets' mean,
    RandomIoUCrop, then the flip. The distortion moves no pixel: a short run hands over the
    targets the same recipe without it hands over, box for box, on other pixels."""
    from tilefeed.pipeline.recipe.adapters import torchvision_detection_options
    from tilefeed.pipeline.recipe.recipe import PhotometricDistort, Recipe

    options = torchvision_detection_options(args(data_augmentation="ssd"), train=True)
    recipe = options["recipe"]
    assert recipe.crop == "zoom_iou" and recipe.fill == (123, 117, 104) and recipe.hflip == 0.5
    assert recipe.photometric == PhotometricDistort() and "size" not in options
    assert torchvision_detection_options(args(data_augmentation="ssd"), train=False).get("recipe") is None
    store, src, annotations = stretched
    runs = {}
    for name, photometric in (("ssd", PhotometricDistort()), ("plain", None)):
        with Loader(store, 2, train=True, seed=0, num_workers=1, targets=("boxes",), mean=(0.0, 0.0, 0.0),
                    std=(1.0, 1.0, 1.0), recipe=Recipe(crop="zoom_iou", fill=(123, 117, 104),
                                                       photometric=photometric)) as loader:
            runs[name] = [(images.clone(), targets) for images, targets in loader]
    with torchvision_detection_loader(store, args(data_augmentation="ssd"), dataset(src, annotations),
                                      train=True) as loader:
        assert loader.recipe == recipe
        first = next(iter(loader))
        assert list(first[1][0]) == ["boxes", "labels", "iscrowd"]
    assert len(runs["ssd"]) == len(runs["plain"]) > 0
    changed = 0
    for (x, targets), (y, plain) in zip(runs["ssd"], runs["plain"], strict=True):
        for t, u in zip(targets, plain, strict=True):
            assert torch.equal(t["boxes"], u["boxes"]) and torch.equal(t["labels"], u["labels"])
        changed += int(not torch.equal(x, y))
    assert changed > 0  # the distortion did act on the pixels


def test_lsj_trains_on_large_scale_jitter_at_1024(stretched: tuple[Path, Path, Path]) -> None:
    """--data-augmentation lsj: ScaleJitter to 1024 and the reference's FixedSizeCrop of 1024
    padded with the presets' mean, then the flip; a short run hands over 1024 squares."""
    from tilefeed.pipeline.recipe.adapters import torchvision_detection_options

    options = torchvision_detection_options(args(data_augmentation="lsj"), train=True)
    assert options["size"] == 1024 and options["recipe"].crop == "lsj"
    assert options["recipe"].fill == (123, 117, 104)
    assert "size" not in torchvision_detection_options(args(data_augmentation="lsj"), train=False)
    store, src, annotations = stretched
    fill = torch.tensor([123, 117, 104], dtype=torch.float32) / 255
    corners = []
    with torchvision_detection_loader(store, args(data_augmentation="lsj"), dataset(src, annotations),
                                      train=True) as loader:
        epoch = loader.epoch_indices(0).numpy()
        start, end, _ = loader.windows(0, epoch)
        padded = ((end - start) > T).all(axis=1)  # the picture smaller than 1024 both ways
        for b, (images, targets) in enumerate(loader):
            assert images.shape[1:] == (3, 1024, 1024) and list(targets[0]) == ["boxes", "labels", "iscrowd"]
            for k, image in enumerate(images):  # the bottom-right corner is past the picture, flip or not
                if padded[b * 2 + k]:
                    corners.append(torch.allclose(image[:, -1, -1].float(), fill, atol=1e-3))
    assert corners and all(corners)
