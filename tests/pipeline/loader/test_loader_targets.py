"""A Loader with targets: each batch's boxes and masks are torchvision v2's transforms of the
stored ones on the Loader's own crop windows and flips; a resumed epoch on another world size
gives them bit for bit; evaluation maps them back to the source annotations; what a store or a
recipe cannot give is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.pipeline.sheet import source_paths
from tilefeed.bench.fixtures.generated import make_image_folder
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.settings import TargetOptions
from tilefeed.store.errors import ConfigError
from tests.helpers import device_sides, on_side
from tests.preprocess.targets_data import write_coco

T = 64  # tile side
OPTS: dict[str, Any] = dict(with_index=True, num_workers=1, train=True, seed=7, size=48, shuffle=True)


@pytest.fixture(scope="module")
def coco_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("coco-loader")
    coco = write_coco(root / "set", images=12, planted=False)
    store = root / "store"
    preprocess(coco.src, store, TileSettings(tile=T, fit="pad"), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    return store, coco.src, coco.annotations


@pytest.fixture(scope="module")
def coco_jpeg_store(coco_store: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``coco_store``'s pictures and annotations as JPEG tiles (quality 95)."""
    store = tmp_path_factory.mktemp("coco-jpeg") / "store"
    preprocess(coco_store[1], store, TileSettings(tile=T, fit="pad"), StoreSettings(codec="jpeg", quality=95),
               workers=1, targets=TargetOptions(annotations=str(coco_store[2]), instance_masks=True))
    return store


def torchvision_targets(reader: StoreReader, sample: int, start: np.ndarray, end: np.ndarray, flip: int,
                        size: int) -> dict[str, torch.Tensor]:
    """torchvision v2 on the stored boxes and instance masks of ``sample``: resized crop of the
    window, the flip, then ClampBoundingBoxes and SanitizeBoundingBoxes (labels and masks of
    removed boxes go with them), as the detection reference presets end."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    store = reader.targets
    assert store is not None
    rows = store.rows([sample])[0]
    ids = np.empty((1, T, T), dtype=np.uint8)
    store.read_masks_into([sample], ids)
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[:, :4].copy()), format="XYXY", canvas_size=(T, T))
    per_object = (ids[0][None] == np.arange(1, len(rows) + 1)[:, None, None]).astype(np.uint8)
    masks = tv_tensors.Mask(torch.from_numpy(per_object))
    top, left = (int(v) for v in start)
    height, width = (int(v) for v in end - start)
    out = {"boxes": F.resized_crop(boxes, top, left, height, width, [size, size]),
           "masks": F.resized_crop(masks, top, left, height, width, [size, size]),
           "labels": torch.from_numpy(rows[:, 4].astype(np.int64))}
    if flip:
        out["boxes"], out["masks"] = F.horizontal_flip(out["boxes"]), F.horizontal_flip(out["masks"])
    return v2.Compose([v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes()])(out)


def test_batches_hold_torchvisions_boxes_and_masks_on_the_loaders_windows(coco_store: tuple[Path, ...],
                                                                         shape: str) -> None:
    store = coco_store[0]
    seen = 0
    with Loader(store, 4, targets=("boxes", "masks"), **OPTS) as loader:
        for images, targets, indices in loader:
            assert isinstance(targets, list) and len(targets) == len(images)
            samples = indices.numpy()
            start, end, flip = loader.windows(0, samples)
            for k, sample in enumerate(samples.tolist()):
                want = torchvision_targets(loader.reader, sample, start[k], end[k], int(flip[k]), 48)
                got = targets[k]
                assert set(got) == {"boxes", "labels", "iscrowd", "masks"}
                assert got["boxes"].dtype == torch.float32 and got["masks"].dtype == torch.uint8
                assert torch.equal(got["labels"], want["labels"])
                assert torch.allclose(got["boxes"].double(), want["boxes"].double(), atol=1e-3, rtol=0)
                assert torch.equal(got["masks"], want["masks"].to(torch.uint8))
                seen += len(got["boxes"])
    assert seen > 10  # the crops kept objects to compare


def torchvision_policy_targets(reader: StoreReader, policy: AutoAugment, seed: int, epoch: int, sample: int,
                               start: np.ndarray, end: np.ndarray, flip: int, size: int) -> dict[str, Any]:
    """torchvision v2 with the policy's ops for ``sample``: its resized crop, then each op the
    policy drew (the op's name, magnitude bin and sign, recomputed from the seed, the epoch and
    the sample; the magnitude from torchvision's own table; the move by torchvision's own op
    code, fill 0), then the flip, the clamp and the sanitising."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    from tilefeed.pipeline.planning.counters import stream_seed, uniforms
    from tilefeed.pipeline.recipe.policies import _PER_SLOT, STREAM

    store = reader.targets
    assert store is not None
    rows = store.rows([sample])[0]
    ids = np.empty((1, T, T), dtype=np.uint8)
    store.read_masks_into([sample], ids)
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[:, :4].copy()), format="XYXY", canvas_size=(T, T))
    per_object = (ids[0][None] == np.arange(1, len(rows) + 1)[:, None, None]).astype(np.uint8)
    masks = tv_tensors.Mask(torch.from_numpy(per_object))
    top, left = (int(v) for v in start)
    height, width = (int(v) for v in end - start)
    boxes = F.resized_crop(boxes, top, left, height, width, [size, size])
    masks = F.resized_crop(masks, top, left, height, width, [size, size])
    u = uniforms(stream_seed(seed, STREAM), epoch, np.array([sample]), 1 + _PER_SLOT * max(policy.slots, 1))
    chosen, strength, sign = policy._choose(u, 1)
    cls = {"trivial_wide": v2.TrivialAugmentWide, "rand": v2.RandAugment}[policy.policy.value]
    tv_policy = cls()
    for k, name in enumerate(chosen[0]):
        if name not in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
            continue  # the other ops leave boxes and masks alone
        magnitude = float(cls._AUGMENTATION_SPACE[name][0](31, size, size)[int(strength[0, k])]) * sign[0, k]
        boxes = tv_policy._apply_image_or_video_transform(boxes, name, magnitude, "nearest", tv_policy._fill)
        masks = tv_policy._apply_image_or_video_transform(masks, name, magnitude, "nearest", tv_policy._fill)
    if flip:
        boxes, masks = F.horizontal_flip(boxes), F.horizontal_flip(masks)
    out = {"boxes": boxes, "masks": masks, "labels": torch.from_numpy(rows[:, 4].astype(np.int64)),
           "chosen": chosen[0]}
    return v2.Compose([v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes()])(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("text", ["ta_wide", "ra"])
def test_a_policys_geometric_ops_move_boxes_and_masks_as_torchvisions(coco_store: tuple[Path, ...],
                                                                     text: str) -> None:
    """Each batch's boxes and masks equal torchvision v2's chain on the Loader's own windows,
    policy ops and flips (two epochs, so every sample draws twice); a moved sample's boxes
    differ from those without the policy (the control)."""
    store = coco_store[0]
    policy = AutoAugment.parse(text)
    moved = seen = 0
    for epoch in range(2):
        with Loader(store, 4, targets=("boxes", "masks"), recipe=Recipe(auto_augment=policy), **OPTS) as loader:
            loader.set_epoch(epoch)
            for _, targets, indices in loader:
                samples = indices.numpy()
                start, end, flip = loader.windows(epoch, samples)
                for k, sample in enumerate(samples.tolist()):
                    want = torchvision_policy_targets(loader.reader, policy, 7, epoch, sample, start[k], end[k],
                                                      int(flip[k]), 48)
                    plain = torchvision_targets(loader.reader, sample, start[k], end[k], int(flip[k]), 48)
                    got = targets[k]
                    assert torch.equal(got["labels"], want["labels"])
                    assert torch.allclose(got["boxes"].double(), want["boxes"].double(), atol=1e-3, rtol=0)
                    # masks: pixel for pixel but at ties of the nearest sampling (test_affine.py)
                    assert got["masks"].shape == want["masks"].shape
                    differ = int((got["masks"] != want["masks"].to(torch.uint8)).sum())
                    assert differ <= 0.04 * got["masks"].numel()
                    geometric = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"} & set(want["chosen"])
                    if geometric and len(plain["boxes"]) == len(got["boxes"]) and len(got["boxes"]):
                        moved += not torch.allclose(got["boxes"].double(), plain["boxes"].double(), atol=1e-3)
                    seen += len(got["boxes"])
    assert seen > 10 and moved > 0
    with Loader(store, 4, targets="boxes", recipe=Recipe(auto_augment=policy), **OPTS) as loader, \
            pytest.raises(ConfigError, match="auto-augment"):
        loader.boxes_to_source([np.zeros((0, 4))], [0])


def by_sample(batches: list[tuple[Any, ...]]) -> dict[int, Any]:
    return {int(i): target for _, targets, idx in batches for target, i in zip(targets, idx, strict=True)}


def same_target(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_an_elastic_resume_gives_the_same_targets_bit_for_bit(coco_store: tuple[Path, ...], shape: str) -> None:
    """Two ranks hand over part of the epoch; three ranks at another batch size finish it: every
    sample's boxes and masks are those the uninterrupted run gave."""
    store = coco_store[0]
    asked = dict(targets=("boxes", "masks"), **OPTS)
    whole: dict[int, Any] = {}
    for rank in range(2):
        with Loader(store, 2, rank=rank, world_size=2, **asked) as loader:
            whole |= by_sample(list(loader))
    first: dict[int, Any] = {}
    states = []
    for rank in range(2):
        with Loader(store, 2, rank=rank, world_size=2, **asked) as loader:
            batches = []
            for n, batch in enumerate(loader):
                batches.append(batch)
                if n == 0:
                    states.append(loader.state_dict())
                    break
            first |= by_sample(batches)
    rest: dict[int, Any] = {}
    for rank in range(3):
        with Loader(store, 3, rank=rank, world_size=3, **asked) as loader:
            loader.load_state_dict(states[0])
            rest |= by_sample(list(loader))
    assert not first.keys() & rest.keys() and (first | rest).keys() == whole.keys()
    assert all(same_target((first | rest)[i], whole[i]) for i in whole)


def test_padded_targets_hold_the_same_boxes_with_counts(coco_store: tuple[Path, ...]) -> None:
    store = coco_store[0]
    with Loader(store, 4, targets="boxes", **OPTS) as loader:
        dicts = list(loader)
    with Loader(store, 4, targets="boxes", targets_layout="padded", max_objects=16, **OPTS) as loader:
        padded = list(loader)
    for (_, listed, i1), (_, table, i2) in zip(dicts, padded, strict=True):
        assert torch.equal(i1, i2)
        assert table["boxes"].shape == (len(i1), 16, 4) and table["labels"].shape == (len(i1), 16)
        for k, target in enumerate(listed):
            count = int(table["counts"][k])
            assert count == len(target["boxes"])
            assert torch.equal(table["boxes"][k, :count], target["boxes"])
            assert torch.equal(table["labels"][k, :count], target["labels"])
            assert bool((table["labels"][k, count:] == -1).all())


def test_evaluation_boxes_map_back_to_the_source_annotations(coco_store: tuple[Path, ...]) -> None:
    """Whole tiles in evaluation: each image's boxes, mapped back through the Loader, are its
    annotation's boxes within 1e-3 px, and score AP 1.0 in COCO's evaluation."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    store, src, annotations = coco_store
    document = json.loads(Path(annotations).read_text())
    image_id = {image["file_name"]: image["id"] for image in document["images"]}
    results = []
    with StoreReader(store) as reader:
        names = [str(Path(p).relative_to(src)) for p in source_paths(reader, np.arange(len(reader)))]
    with Loader(store, 5, targets="boxes", with_index=True, shuffle=False, crop_pct=1.0) as loader:
        for _, targets, indices in loader:
            back = loader.boxes_to_source([t["boxes"] for t in targets], indices)
            for target, boxes, sample in zip(targets, back, indices.tolist(), strict=True):
                wanted = [a for a in document["annotations"] if a["image_id"] == image_id[names[sample]]]
                xyxy = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in wanted)])
                # every object, in the file's order
                assert boxes.shape == xyxy.reshape(-1, 4).shape
                assert np.allclose(boxes, xyxy.reshape(-1, 4), atol=1e-3, rtol=0)
                results += [{"image_id": image_id[names[sample]], "category_id": int(label),
                             "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": 1.0}
                            for b, label in zip(boxes.tolist(), target["labels"].tolist(), strict=True)]
    truth = COCO(str(annotations))
    scored = COCOeval(truth, truth.loadRes(results), "bbox")
    scored.evaluate()
    scored.accumulate()
    scored.summarize()
    assert scored.stats[0] == pytest.approx(1.0)


def test_what_cannot_be_given_is_refused_in_one_line(coco_store: tuple[Path, ...], tmp_path: Path) -> None:
    store = coco_store[0]
    with pytest.raises(ConfigError, match="^targets must be one of boxes, masks, got .keypoints.$"):
        Loader(store, 4, targets="keypoints")
    with pytest.raises(ConfigError, match="targets_layout"):
        Loader(store, 4, targets="boxes", targets_layout="ragged")
    with Loader(store, 4, targets="boxes", **OPTS) as loader:
        state = loader.state_dict()
    with Loader(store, 4, **OPTS) as loader, pytest.raises(ConfigError, match="targets"):
        loader.load_state_dict(state)
    plain = tmp_path / "plain"
    preprocess(make_image_folder(tmp_path / "classes", classes=2, per_class=2, sizes=((64, 48),)), plain,
               TileSettings(tile=T), workers=1)
    with pytest.raises(ConfigError, match="holds no boxes or masks"):
        Loader(plain, 4, targets="boxes")


@pytest.mark.parametrize("stored", [False, True])
def test_the_contact_sheet_draws_each_box_in_its_categorys_colour(coco_store: tuple[Path, ...],
                                                                   stored: bool) -> None:
    """``tilefeed show`` on a store with targets: each box's outline in its category's colour,
    where the Loader (or, ``--stored``, the store) puts it; the masks coloured over the pixels."""
    from tilefeed.pipeline.sheet import contact_sheet, palette

    store = coco_store[0]
    with StoreReader(store) as reader:
        sheet = contact_sheet(reader, samples=list(range(6)), show_stored=stored)
        with Loader(reader, 6, targets=("boxes", "masks"), with_index=True, shuffle=False,
                    indices=list(range(6))) as loader:
            _, targets, indices = next(iter(loader))
        pixels = np.asarray(sheet.image)
        drawn = 0
        for k, sample in enumerate(indices.tolist()):
            x, y = sheet.cells[sheet.indices.index(sample)]
            rows = reader.targets.rows([sample])[0] if stored else None
            boxes = rows[:, :4] if rows is not None else targets[k]["boxes"].double().numpy()
            labels = rows[:, 4] if rows is not None else targets[k]["labels"].numpy()
            for (x0, y0, x1, _), label in zip(boxes.tolist(), labels.tolist(), strict=True):
                # the top edge's middle, where no later box's outline crosses in these shapes
                px = x + (round(x0 * sheet.scale) + round(x1 * sheet.scale) - 1) // 2
                colour = tuple(pixels[y + round(y0 * sheet.scale), px])
                drawn += colour == palette(int(label))
        assert drawn >= 0.8 * sum(len(t["boxes"]) for t in targets) > 0


def test_semantic_masks_follow_the_crop_as_torchvisions(tmp_path: Path) -> None:
    """A semantic store: ``targets="masks"`` gives each image's class-id mask, torchvision's
    nearest resized crop and flip of the stored mask tile on the Loader's own window."""
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F

    from tests.preprocess.targets_data import write_semantic

    sem = write_semantic(tmp_path)
    store = tmp_path / "store"
    preprocess(sem.src, store, TileSettings(tile=T, fit="pad"), workers=1,
               targets=TargetOptions(masks=str(sem.masks)))
    with Loader(store, 4, targets="masks", **OPTS) as loader:
        with pytest.raises(ConfigError, match="holds none"):
            Loader(store, 4, targets="boxes")
        compared = 0
        for _, targets, indices in loader:
            samples = indices.numpy()
            start, end, flip = loader.windows(0, samples)
            stored = np.empty((len(samples), T, T), dtype=np.uint8)
            loader.reader.targets.read_masks_into(samples, stored)
            for k in range(len(samples)):
                (top, left), (bottom, right) = start[k].astype(int), end[k].astype(int)
                mask = tv_tensors.Mask(torch.from_numpy(stored[k][None]))
                want = F.resized_crop(mask, top, left, bottom - top, right - left, [48, 48])[0]
                if flip[k]:
                    want = want.flip(-1)
                assert torch.equal(targets[k]["masks"], want)
                compared += int((want != 0).sum() > 0)
        assert compared > 0


@pytest.mark.parametrize("side", device_sides())
@pytest.mark.parametrize("policy", [None, "ta_wide"])
def test_targets_from_the_device_graph_are_the_host_paths(coco_store: tuple[Path, ...], policy: str | None,
                                                          side: str) -> None:
    """The batch's images from the device graph (on DALI's CPU backend, and on a GPU), its masks
    made on the images' device from the same draws (with a policy: moved there too): every
    target comes on that device and equals the host path's bit for bit, in both layouts."""
    store = coco_store[0]
    recipe = {} if policy is None else {"recipe": Recipe(auto_augment=AutoAugment.parse(policy))}
    out: dict[str, dict[int, Any]] = {}
    padded: dict[str, list[Any]] = {}
    for which in ("host", side):
        with on_side(which) as device:
            with Loader(store, 4, targets=("boxes", "masks"), device=device, **recipe, **OPTS) as loader:
                batches = list(loader)
                for _, targets, _ in batches:
                    for target in targets:
                        assert all(value.device.type == device for value in target.values())
                out[which] = {i: {k: v.cpu() for k, v in t.items()} for i, t in by_sample(batches).items()}
            with Loader(store, 4, targets=("boxes", "masks"), targets_layout="padded", device=device, **recipe,
                        **OPTS) as loader:
                padded[which] = []
                for _, targets, _ in loader:
                    assert all(value.device.type == device for value in targets.values())
                    padded[which].append({k: v.cpu() for k, v in targets.items()})
    assert out["host"].keys() == out[side].keys()
    assert all(same_target(out["host"][i], out[side][i]) for i in out["host"])
    assert sum(int(t["masks"].sum()) for t in out["host"].values()) > 0  # masks with pixels compared
    assert len(padded["host"]) == len(padded[side]) > 0
    assert all(same_target(a, b) for a, b in zip(padded["host"], padded[side], strict=True))


@pytest.mark.parametrize("side", device_sides())
@pytest.mark.parametrize("codec", ["lz4", "jpeg"])
@pytest.mark.parametrize("crop", ["lsj", "zoom_iou"])
def test_windows_past_the_picture_in_the_device_graph_are_the_host_paths(
        request: pytest.FixtureRequest, crop: str, codec: str, side: str) -> None:
    """The device graph's paste (``fn.slice`` padding with the fill, the part inside resized by
    DALI) against the host path's (PIL resize, then a paste): the targets bit for bit, the
    pixels past the picture exactly the fill on both, the rest within the two resizes' gap, on
    JPEG tiles (fractional cuts of a whole decode) as on lz4."""
    store = request.getfixturevalue("coco_store")[0]
    if codec == "jpeg":
        store = request.getfixturevalue("coco_jpeg_store")
    fill = (123, 117, 104)
    options = dict(OPTS, dtype=torch.uint8, layout="NHWC")
    seen: dict[str, dict[int, tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {}
    for which in ("host", side):
        with on_side(which) as device, Loader(store, 4, targets=("boxes", "masks"),
                                               recipe=Recipe(crop=crop, fill=fill), device=device,
                                               **options) as loader:
            seen[which] = {int(i): (images[k].cpu(), {n: v.cpu() for n, v in targets[k].items()})
                           for images, targets, indices in loader for k, i in enumerate(indices.tolist())}
    assert seen["host"].keys() == seen[side].keys()
    filled = 0
    for i, (pixels, target) in seen["host"].items():
        device_pixels, device_target = seen[side][i]
        assert same_target(target, device_target)
        at_fill = (pixels == torch.tensor(fill, dtype=torch.uint8)).all(-1)
        filled += int(at_fill.sum())
        # a picture pixel may equal the fill by chance; the CPU's fill area is the device's too
        if at_fill.any():
            assert (device_pixels[at_fill] == torch.tensor(fill, dtype=torch.uint8)).float().mean() > 0.99
        assert (device_pixels.float() - pixels.float()).abs().mean() < 3.0
    assert filled > 0


def test_no_crop_trains_on_the_whole_letterbox_with_the_flips(coco_store: tuple[Path, ...]) -> None:
    """``Recipe(crop="none")``, detection's hflip preset: each sample's window is its whole tile,
    so its boxes are the stored ones scaled to the output side and mirrored where it is flipped,
    with the flips the random-resized crop would have drawn."""
    store = coco_store[0]
    with Loader(store, 4, targets="boxes", recipe=Recipe(crop="none"), **OPTS) as loader:
        flips = 0
        for _, targets, indices in loader:
            samples = indices.numpy()
            start, end, flip = loader.windows(0, samples)
            assert (start == 0).all() and (end == T).all()
            for k, sample in enumerate(samples.tolist()):
                rows = loader.reader.targets.rows([sample])[0]
                want = rows[:, :4] * 48 / T
                if flip[k]:
                    want = np.stack([48 - want[:, 2], want[:, 1], 48 - want[:, 0], want[:, 3]], axis=1)
                assert np.allclose(targets[k]["boxes"].double().numpy(), want, atol=1e-3)
                flips += int(flip[k])
    with Loader(store, 4, targets="boxes", **OPTS) as cropped:
        assert np.array_equal(cropped.windows(0, np.arange(12))[2], loader.windows(0, np.arange(12))[2])
    assert 0 < flips < 12
    with pytest.raises(ConfigError, match="crop must be one of"):
        Recipe(crop="centre")


def test_ssds_iou_crop_keeps_the_boxes_whose_centres_it_holds(coco_store: tuple[Path, ...],
                                                              tmp_path: Path, shape: str) -> None:
    """``Recipe(crop="iou")``: each window is RandomIoUCrop's rule's against the sample's stored
    boxes; the boxes whose centres lie in it go through torchvision's resized crop and flip, the
    rest are dropped; a store without boxes is refused for it."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    store = coco_store[0]
    cropped = 0
    with Loader(store, 4, targets="boxes", recipe=Recipe(crop="iou"), **OPTS) as loader:
        for _, targets, indices in loader:
            samples = indices.numpy()
            start, end, flip = loader.windows(0, samples)
            for k, sample in enumerate(samples.tolist()):
                rows = loader.reader.targets.rows([sample])[0]
                (top, left), (bottom, right) = start[k], end[k]
                cx, cy = (rows[:, 0] + rows[:, 2]) / 2, (rows[:, 1] + rows[:, 3]) / 2
                held = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                picture = loader.reader.boxes[sample]
                whole = (top, left, bottom - top, right - left) == tuple(float(v) for v in picture)
                if not whole:
                    cropped += 1
                    assert held.any()  # a window is taken only where some box's centre lies in it
                kept = rows[held if not whole else np.ones(len(rows), bool)]
                boxes = tv_tensors.BoundingBoxes(torch.from_numpy(kept[:, :4].copy()), format="XYXY",
                                                 canvas_size=(T, T))
                window = (int(top), int(left), int(bottom - top), int(right - left))
                out = {"boxes": F.resized_crop(boxes, *window, [48, 48]),
                       "labels": torch.from_numpy(kept[:, 4].astype(np.int64))}
                if flip[k]:
                    out["boxes"] = F.horizontal_flip(out["boxes"])
                want = v2.Compose([v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes()])(out)
                assert torch.equal(targets[k]["labels"], want["labels"])
                assert torch.allclose(targets[k]["boxes"].double(), want["boxes"].double(), atol=1e-3, rtol=0)
    assert cropped > 0
    plain = tmp_path / "plain"
    preprocess(make_image_folder(tmp_path / "classes", classes=2, per_class=2, sizes=((64, 48),)), plain,
               TileSettings(tile=T), workers=1)
    with pytest.raises(ConfigError, match="crop='iou'"):
        Loader(plain, 4, train=True, recipe=Recipe(crop="iou"))


@pytest.mark.parametrize("crop", ["iou", "zoom_iou"])
def test_a_batchs_iou_crop_is_drawn_once_for_its_windows_and_its_boxes(
        coco_store: tuple[Path, ...], crop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``BatchTargets.framed`` under an IoU crop draws the crop once (its windows frame the
    pixels, its keep marks the boxes) and gives the boxes the Loader handed over."""
    import threading

    from tilefeed.pipeline.engine import crops
    from tilefeed.pipeline.loader.targets import BatchTargets
    from tilefeed.pipeline.options import Targets, TargetsLayout

    store = coco_store[0]
    with Loader(store, 4, targets="boxes", recipe=Recipe(crop=crop), **OPTS) as loader:
        handed = by_sample(list(loader))
        made = BatchTargets(frozenset({Targets.BOXES}), TargetsLayout.DICTS, loader.augment, loader.seed, 0,
                            48, 4, reader=loader.reader, positions=loader.epoch_positions(0).numpy())
        here = threading.get_ident()
        calls = []
        real = crops.iou_windows

        def counted(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == here:  # not the Loader's own feeding thread
                calls.append(args[2])
            return real(*args, **kwargs)

        # the one name the crop is drawn by: the window inputs' (the targets read its keep mask)
        monkeypatch.setattr(crops, "iou_windows", counted)
        samples = np.array(sorted(handed)[:4], dtype=np.int64)
        framed = made.framed(samples, samples).as_dicts(torch.device("cpu"))
    assert len(calls) == 1
    for target, sample in zip(framed, samples.tolist(), strict=True):
        assert torch.equal(target["boxes"], handed[sample]["boxes"])
        assert torch.equal(target["labels"], handed[sample]["labels"])


def test_a_store_with_boxes_in_a_bucket_hands_over_the_same_targets(tmp_path: Path) -> None:
    """A store read from object storage (a real S3 server) gives the boxes its local copy gives,
    a store with masks too (its masks: test_bucket_targets)."""
    from tilefeed.store.object_storage import ObjectStorage
    from tests.helpers import s3_environment

    coco = write_coco(tmp_path / "set", images=8, planted=False)
    boxes, masks = tmp_path / "boxes", tmp_path / "masks"
    preprocess(coco.src, boxes, TileSettings(tile=T), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations)))
    preprocess(coco.src, masks, TileSettings(tile=T), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    with s3_environment(tmp_path / "cache"):
        for local, url in ((boxes, "s3://tilefeed/targets/boxes"), (masks, "s3://tilefeed/targets/masks")):
            ObjectStorage(url).upload_tree(local, last="zarr.json")
        with Loader(boxes, 4, targets="boxes", **OPTS) as here, \
                Loader("s3://tilefeed/targets/boxes", 4, targets="boxes", **OPTS) as there:
            near, far = by_sample(list(here)), by_sample(list(there))
        assert near.keys() == far.keys() and all(same_target(near[i], far[i]) for i in near)
        with Loader("s3://tilefeed/targets/masks", 4, targets="boxes", **OPTS) as there:
            far = by_sample(list(there))
        assert near.keys() == far.keys() and all(same_target(near[i], far[i]) for i in near)


@pytest.mark.parametrize("crop", ["lsj", "zoom_iou"])
def test_windows_past_the_picture_show_the_fill_and_move_the_boxes_as_torchvision(
        coco_store: tuple[Path, ...], crop: str, shape: str) -> None:
    """``Recipe(crop="lsj")`` (ScaleJitter to the output side, then the reference's
    FixedSizeCrop) and ``"zoom_iou"`` (RandomZoomOut, then RandomIoUCrop of the canvas): every
    output pixel past the picture is the fill, the boxes are torchvision's moved through the
    same parameters, instance masks are 0 there; end to end in both graph shapes."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    from tilefeed.pipeline.targets.windows import (ScaleJitter, ZoomOut, pasted, scale_jitter_framing,
                                                   zoom_out_canvases)

    store, fill, size = coco_store[0], (123, 117, 104), 48
    padded = 0
    options = dict(OPTS, dtype=torch.uint8, layout="NHWC")
    with Loader(store, 4, targets=("boxes", "masks"), recipe=Recipe(crop=crop, fill=fill), **options) as loader:
        for images, targets, indices in loader:
            samples = indices.numpy()
            start, end, flip = loader.windows(0, samples)
            pictures = loader.reader.boxes[samples].astype(np.float64)
            cut = pasted(start, end, pictures, size)
            for k, sample in enumerate(samples.tolist()):
                pixels = images[k].numpy()
                shown = np.zeros((size, size), bool)
                (py, px), (ch, cw) = cut.place[k].astype(int), cut.cut_size[k].astype(int)
                shown[py:py + ch, px:px + cw] = True
                if flip[k]:
                    shown = shown[:, ::-1]
                assert (pixels[~shown] == fill).all()
                padded += int((~shown).any())
                assert (targets[k]["masks"].numpy()[:, ~shown] == 0).all()
                rows = loader.reader.targets.rows([sample])[0]
                top0, left0, h, w = pictures[k]
                boxes = tv_tensors.BoundingBoxes(torch.from_numpy(rows[:, :4] - [left0, top0, left0, top0]),
                                                 format="XYXY", canvas_size=(int(h), int(w)))
                labels = torch.from_numpy(rows[:, 4].astype(np.int64))
                if crop == "lsj":  # torchvision's resize to the drawn size, then the cut
                    framing = scale_jitter_framing(ScaleJitter((size, size)), 7, 0, samples[k:k + 1],
                                                   pictures[k:k + 1], size)
                    (new_h, new_w), (top, left) = framing.resized[0].astype(int), framing.anchor[0].astype(int)
                    moved = F.crop(F.resize(boxes, [int(new_h), int(new_w)]), int(top), int(left), size, size)
                else:  # the IoU crop of the canvas: the boxes whose centres it holds (all where the
                    # window is the whole canvas, RandomIoUCrop's leave-as-is), resized
                    canvas = zoom_out_canvases(ZoomOut(), 7, 0, samples[k:k + 1], pictures[k:k + 1])[0]
                    (top, left), (bottom, right) = start[k] - [top0, left0], end[k] - [top0, left0]
                    cx, cy = (rows[:, 0] + rows[:, 2]) / 2 - left0, (rows[:, 1] + rows[:, 3]) / 2 - top0
                    held = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                    if np.array_equal(np.concatenate([start[k], end[k] - start[k]]), canvas):
                        held[:] = True
                    kept = tv_tensors.wrap(boxes[torch.from_numpy(held)], like=boxes)
                    moved = F.resized_crop(kept, int(top), int(left), int(bottom - top), int(right - left),
                                           [size, size])
                    labels = labels[torch.from_numpy(held)]
                out = {"boxes": F.horizontal_flip(moved) if flip[k] else moved, "labels": labels}
                want = v2.Compose([v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes()])(out)
                assert torch.equal(targets[k]["labels"], want["labels"])
                assert torch.allclose(targets[k]["boxes"].double(), want["boxes"].double(), atol=1e-3, rtol=0)
    assert padded > 0
