"""Sources with targets: every valid generated object stored, every planted bad one rejected
with its reason, boxes mapped into the tile and back to the source within 1e-3 px, masks equal
to PIL's nearest resize of the source mask on the same geometry (PIL's ``Image.resize(NEAREST,
box=...)``, pasted as the fit pastes the picture)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from PIL import Image

from tests.helpers import run_cli, tree_bytes
from tests.preprocess.targets_data import CATEGORIES, CocoSet, write_coco, write_semantic, write_yolo
from tilefeed.pipeline import StoreReader
from tilefeed.preprocess import TargetOptions, TileSettings, preprocess
from tilefeed.preprocess.targets import place_targets
from tilefeed.store import format as fmt
from tilefeed.store.arrays import read_small_array
from tilefeed.store.documents import open_store
from tilefeed.store.errors import ConfigError, SourceError
from tilefeed.store.inspection import info, verify

T = 48


def _geometry(width: int, height: int, fit: str, t: int = T) -> tuple[tuple[float, float, float, float],
                                                                       tuple[int, int], tuple[int, int]]:
    """The fit's source box, resized size and place in the tile, restated from the fits' rules."""
    if fit == "stretch":
        return (0.0, 0.0, float(width), float(height)), (t, t), (0, 0)
    if fit == "crop":
        side = min(width, height)
        return ((width - side) / 2, (height - side) / 2, float(side), float(side)), (t, t), (0, 0)
    scale = t / max(width, height)
    nw, nh = max(1, round(width * scale)), max(1, round(height * scale))
    return (0.0, 0.0, float(width), float(height)), (nw, nh), ((t - nw) // 2, (t - nh) // 2)


def _pil_nearest(mask: np.ndarray, width: int, height: int, fit: str, fill: int) -> np.ndarray:
    (x, y, w, h), size, at = _geometry(width, height, fit)
    resized = Image.fromarray(mask).resize(size, Image.Resampling.NEAREST, box=(x, y, x + w, y + h))
    canvas = Image.new("L", (T, T), fill)
    canvas.paste(resized, at)
    return np.asarray(canvas)


def _samples(out: Path) -> list[str]:
    """Each tile's source path."""
    _, meta = open_store(out)
    paths = zarr.open_group(str(out), mode="r")[fmt.SOURCE_PATHS][:]
    return [str(paths[i]) for i in read_small_array(out, meta, fmt.SOURCES)]


def _rejects(out: Path, src: Path) -> dict[str, str]:
    attrs, _ = open_store(out)
    return {os.path.relpath(r["path"], src): r["reason"] for r in attrs["rejects"]}


def _to_source(rows: np.ndarray, frame: np.ndarray) -> np.ndarray:
    sx, sy, tx, ty = frame
    back = rows[:, :4].copy()
    back[:, 0::2] = (back[:, 0::2] - tx) / sx
    back[:, 1::2] = (back[:, 1::2] - ty) / sy
    return back


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> CocoSet:
    return write_coco(tmp_path_factory.mktemp("coco"))


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
def test_coco_boxes_and_instance_masks_follow_the_fit(coco: CocoSet, tmp_path: Path, fit: str) -> None:
    out = tmp_path / "store"
    summary = preprocess(coco.src, out, TileSettings(tile=T, fit=fit), workers=2,
                         targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    rejects = _rejects(out, coco.src)
    assert {name: reason.split(":")[0] for name, reason in rejects.items()} == coco.bad
    assert summary.accepted == len(coco.objects) and summary.rejected == len(coco.bad)

    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None and targets.masks is fmt.MaskKind.INSTANCE
        assert targets.record.categories == tuple((c["id"], c["name"]) for c in CATEGORIES)
        sources = _samples(out)
        masks = np.empty((len(sources), T, T), dtype=np.uint8)
        targets.read_masks_into(np.arange(len(sources)), masks)
        stored = outside = 0
        for sample, path in enumerate(sources):
            name = os.path.relpath(path, coco.src)
            width, height = coco.sizes[name]
            objs = coco.objects[name]
            rows, frame = targets.rows([sample])[0], targets.frames_of([sample])[0]
            (x, y, w, h), _, _ = _geometry(width, height, fit)
            # the objects a crop leaves wholly outside the centre square are the ones not stored
            kept = [o for o in objs if min(o["bbox"][0] + o["bbox"][2], x + w) > max(o["bbox"][0], x)
                    and min(o["bbox"][1] + o["bbox"][3], y + h) > max(o["bbox"][1], y)]
            outside += len(objs) - len(kept)
            stored += len(rows)
            assert len(rows) == len(kept), name
            expected = np.array([[o["bbox"][0], o["bbox"][1], o["bbox"][0] + o["bbox"][2],
                                  o["bbox"][1] + o["bbox"][3]] for o in kept]).reshape(-1, 4)
            expected[:, 0::2] = np.clip(expected[:, 0::2], x, x + w)  # pad, stretch: the whole image
            expected[:, 1::2] = np.clip(expected[:, 1::2], y, y + h)
            np.testing.assert_allclose(_to_source(rows, frame), expected, atol=1e-3, rtol=0)
            assert rows[:, 4].tolist() == [o["category_id"] for o in kept]
            assert rows[:, 5].tolist() == [o["iscrowd"] for o in kept]
            assert ((rows[:, :4] >= 0) & (rows[:, :4] <= T)).all() and (rows[:, 2] > rows[:, 0]).all()
            canvas = np.zeros((height, width), dtype=np.uint8)
            for k, o in enumerate(kept, 1):  # the one listed last wins a shared pixel
                canvas[o["mask"] != 0] = k
            reference = _pil_nearest(canvas, width, height, fit, 0)
            np.testing.assert_array_equal(masks[sample], reference, err_msg=name)
        assert stored == summary.objects == targets.record.objects
        assert outside == summary.outside
        assert fit == "crop" or outside == 0
        assert fit != "crop" or outside > 0  # the set leaves some objects outside the centre square
        assert (masks > 0).any()
    assert verify(out, deep=True) == []
    described = info(out).targets
    assert described is not None and described["masks"] == "instance" and described["objects"] == stored


def test_every_valid_coco_object_is_stored_with_boxes_only(coco: CocoSet, tmp_path: Path) -> None:
    """Without --instance-masks: no masks array; the too-many-objects image is then a valid one
    (the limit is the masks' ids), and every object of every accepted image is stored."""
    out = tmp_path / "store"
    summary = preprocess(coco.src, out, TileSettings(tile=T), workers=1,
                         targets=TargetOptions(annotations=str(coco.annotations)))
    rejects = {name: reason.split(":")[0] for name, reason in _rejects(out, coco.src).items()}
    assert rejects == {k: v for k, v in coco.bad.items() if k not in ("bad_many.png", "bad_rle_size.png")}
    # bad_many's 255 objects and bad_rle_size's one (its segmentation unread without masks)
    assert summary.objects == sum(len(v) for v in coco.objects.values()) + 255 + 1
    assert not (out / fmt.MASKS).exists()
    with StoreReader(out) as reader:
        assert reader.targets is not None and reader.targets.masks is None
        with pytest.raises(ValueError, match="no masks"):
            reader.targets.read_masks_into([0], np.empty((1, T, T), dtype=np.uint8))


def test_a_reject_names_the_annotation(coco: CocoSet, tmp_path: Path) -> None:
    out = tmp_path / "store"
    preprocess(coco.src, out, TileSettings(tile=T), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    reasons = _rejects(out, coco.src)
    annotations = json.loads(coco.annotations.read_text())
    ids = {img["file_name"]: img["id"] for img in annotations["images"]}
    for name in ("bad_outside.png", "bad_degenerate.png", "bad_category.png", "bad_rle_size.png",
                 "bad_crowd.png"):
        ann = next(a for a in annotations["annotations"] if a["image_id"] == ids[name])
        assert f"annotation {ann['id']}" in reasons[name], reasons[name]
    assert "the image is 80x60, the annotations say 81x60" in reasons["bad_size.png"]


def _run_refused(tmp_path: Path, src: Path, document: Any, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(SourceError, match=match) as e:
        preprocess(src, tmp_path / "out", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(path)))
    assert "\n" not in str(e.value)


def test_a_file_the_run_cannot_be_made_from_is_refused_in_one_line(coco: CocoSet, tmp_path: Path) -> None:
    good = json.loads(coco.annotations.read_text())
    _run_refused(tmp_path, coco.src, "{not json", "not JSON")
    _run_refused(tmp_path, coco.src, {"images": []}, "not a COCO instances file")
    _run_refused(tmp_path, coco.src, {**good, "categories": [*good["categories"], {"id": 4, "name": "again"}]},
                 "category id 4 is listed twice")
    _run_refused(tmp_path, coco.src, {**good, "categories": [{"id": "1", "name": "square"}]},
                 "category 0 needs")
    stray = {"id": 99999, "image_id": 12345, "category_id": 1, "bbox": [1, 1, 2, 2]}
    _run_refused(tmp_path, coco.src, {**good, "annotations": [*good["annotations"], stray]},
                 "annotation 99999 names image_id 12345")
    _run_refused(tmp_path, coco.src, {**good, "images": [*good["images"], {**good["images"][0], "id": 777}]},
                 "is listed twice")
    escape = {**good["images"][0], "id": 778, "file_name": "../elsewhere.png"}
    _run_refused(tmp_path, coco.src, {**good, "images": [*good["images"], escape]}, "leads out of SRC")


def test_an_annotations_file_over_its_size_limit_is_refused_unread(coco: CocoSet, tmp_path: Path) -> None:
    """The limit is the file's size in bytes: at its size the run is made, one byte under it is
    refused in one line naming the file, its size and the option, before the file is read."""
    size = coco.annotations.stat().st_size
    at = preprocess(coco.src, tmp_path / "at", TileSettings(tile=T), workers=1,
                    targets=TargetOptions(annotations=str(coco.annotations), max_annotations_size=size))
    assert at.sources == len(coco.objects) + len(coco.bad) and at.accepted >= len(coco.objects)
    with pytest.raises(SourceError) as e:
        preprocess(coco.src, tmp_path / "under", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(coco.annotations), max_annotations_size=size - 1))
    line = str(e.value)
    assert "\n" not in line and str(coco.annotations) in line and f"{size} bytes" in line
    assert "--max-annotations-size" in line
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer held open, so opening it to read does not wait
    try:
        _run_refused_file(tmp_path, coco.src, fifo, "not a regular file")
    finally:
        os.close(held)
    with pytest.raises(ConfigError, match="--max-annotations-size"):
        TargetOptions(annotations="a.json", max_annotations_size=0)
    run = run_cli("preprocess", str(coco.src), str(tmp_path / "cli"), "--annotations", str(coco.annotations),
                  "--max-annotations-size", "1K", "--tile", str(T), "--processes", "1", "--quiet")
    assert run.returncode == 1 and "over the 1.0 KiB limit; --max-annotations-size raises it" in run.stderr


def _run_refused_file(tmp_path: Path, src: Path, path: Path, match: str) -> None:
    with pytest.raises(SourceError, match=match):
        preprocess(src, tmp_path / "out", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(path)))


def _category_masks(coco: CocoSet, root: Path) -> Path:
    """A semantic mask per image of the set: 255 (unlabelled), each object's pixels its category
    id, painted in the file's order; the planted images' masks all 255."""
    masks = root / "category-masks"
    for path in sorted(coco.src.rglob("*.png")):
        name = str(path.relative_to(coco.src))
        width, height = Image.open(path).size
        mask = np.full((height, width), 255, dtype=np.uint8)
        for o in coco.objects.get(name, []):
            mask[o["mask"] != 0] = o["category_id"]
        (masks / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(mask, "L").save(masks / name)
    return masks


@pytest.mark.parametrize("mode", ["resize", "grid"])
def test_coco_boxes_with_a_semantic_mask_per_image(coco: CocoSet, tmp_path: Path, mode: str) -> None:
    """--annotations with --masks: the boxes of a boxes-only run, and each tile's mask the source
    mask's, nearest-resized on the fit's geometry (resize) or cut by the tile's window (grid)."""
    masks = _category_masks(coco, tmp_path)
    settings = TileSettings(tile=T, mode=mode)
    boxes_only, both = tmp_path / "boxes", tmp_path / "both"
    preprocess(coco.src, boxes_only, settings, workers=1,
               targets=TargetOptions(annotations=str(coco.annotations)))
    summary = preprocess(coco.src, both, settings, workers=2,
                         targets=TargetOptions(annotations=str(coco.annotations), masks=str(masks)))
    assert _rejects(both, coco.src) == _rejects(boxes_only, coco.src)
    assert summary.objects > 0
    _, meta = open_store(both)
    rows, cols = (read_small_array(both, meta, name) if mode == "grid" else None
                  for name in (fmt.ROWS, fmt.COLS))
    with StoreReader(boxes_only) as plain, StoreReader(both) as reader:
        targets = reader.targets
        assert targets is not None and plain.targets is not None
        assert targets.masks is fmt.MaskKind.SEMANTIC and targets.objects is not None
        assert targets.record.categories == tuple((c["id"], c["name"]) for c in CATEGORIES)
        np.testing.assert_array_equal(targets.objects, plain.targets.objects)
        np.testing.assert_array_equal(targets.frames, plain.targets.frames)
        sources = _samples(both)
        tiles = np.empty((len(sources), T, T), dtype=np.uint8)
        targets.read_masks_into(np.arange(len(sources)), tiles)
        for sample, path in enumerate(sources):
            name = os.path.relpath(path, coco.src)
            source = np.asarray(Image.open(masks / name))
            height, width = source.shape
            if mode == "resize":
                reference = _pil_nearest(source, width, height, "pad", 255)
            else:
                assert rows is not None and cols is not None
                y, x = int(rows[sample]) * T, int(cols[sample]) * T
                cut = source[y:y + T, x:x + T]
                reference = np.full((T, T), 255, dtype=np.uint8)
                reference[:cut.shape[0], :cut.shape[1]] = cut
            np.testing.assert_array_equal(tiles[sample], reference, err_msg=name)
        assert set(np.unique(tiles).tolist()) == {1, 4, 90, 255}
    assert verify(both, deep=True) == []


def test_masks_beside_a_coco_file_hold_its_category_ids(coco: CocoSet, tmp_path: Path) -> None:
    masks = _category_masks(coco, tmp_path)
    Image.new("L", coco.sizes["img00.png"], 0).save(masks / "img00.png")  # 0: not a category of the file
    out = tmp_path / "store"
    preprocess(coco.src, out, TileSettings(tile=T), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), masks=str(masks)))
    reasons = _rejects(out, coco.src)
    assert reasons["img00.png"].startswith("unknown category: ") and "class id 0" in reasons["img00.png"]
    assert reasons["img00.png"].endswith("not in the annotations file's categories")
    # the masks are part of the run's identity: the same ones find the store complete, a mask
    # changed (here in size) makes it another store, and so do boxes alone
    from tilefeed.store.errors import StoreExistsError

    both = TargetOptions(annotations=str(coco.annotations), masks=str(masks))
    assert preprocess(coco.src, out, TileSettings(tile=T), workers=1, targets=both).up_to_date
    noisy = np.random.default_rng(0).choice(np.array([1, 4], dtype=np.uint8), coco.sizes["img00.png"][::-1])
    Image.fromarray(noisy).save(masks / "img00.png")
    with pytest.raises(StoreExistsError, match="made from other sources or settings"):
        preprocess(coco.src, out, TileSettings(tile=T), workers=1, targets=both)
    with pytest.raises(StoreExistsError, match="made from other sources or settings"):
        preprocess(coco.src, out, TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(coco.annotations)))
    (masks / "classes.txt").write_text("road\n")
    with pytest.raises(SourceError, match="the annotation file's category ids"):
        preprocess(coco.src, tmp_path / "again", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(coco.annotations), masks=str(masks)))
    (masks / "classes.txt").unlink()
    wide = json.loads(coco.annotations.read_text())
    wide["categories"].append({"id": 300, "name": "wide"})
    (tmp_path / "wide.json").write_text(json.dumps(wide))
    with pytest.raises(SourceError, match="category id 300 cannot be a mask's class id"):
        preprocess(coco.src, tmp_path / "wide", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(annotations=str(tmp_path / "wide.json"), masks=str(masks)))
    with pytest.raises(ConfigError, match="one kind of mask"):
        TargetOptions(annotations="a.json", masks=str(masks), instance_masks=True)
    with pytest.raises(ConfigError, match="--yolo and --masks"):
        TargetOptions(yolo=True, masks=str(masks))


def test_targets_from_two_sources_or_masks_without_a_file_are_refused() -> None:
    with pytest.raises(ConfigError, match="one source"):
        TargetOptions(annotations="a.json", yolo=True)
    with pytest.raises(ConfigError, match="--instance-masks"):
        TargetOptions(instance_masks=True)


@pytest.mark.parametrize("fit", ["pad", "crop"])
def test_a_yolo_folder_through_the_command(tmp_path: Path, fit: str) -> None:
    yolo = write_yolo(tmp_path)
    out = tmp_path / "store"
    run = run_cli("preprocess", str(yolo.src), str(out), "--yolo", "--tile", str(T), "--fit", fit,
                  "--processes", "1", "--quiet")
    assert run.returncode == 0, run.stderr
    images = yolo.src / "images"
    rejects = {name: reason.split(":")[0] for name, reason in _rejects(out, images).items()}
    assert rejects == yolo.bad
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None
        assert targets.record.categories == ((0, "square"), (1, "disc"), (2, "triangle"))
        sources = _samples(out)
        assert len(sources) == len(yolo.boxes)
        for sample, path in enumerate(sources):
            name = os.path.relpath(path, images)
            width, height = yolo.sizes[name]
            (x, y, w, h), _, _ = _geometry(width, height, fit)
            expected = np.array([b[1:] for b in yolo.boxes[name]]).reshape(-1, 4)
            expected[:, 0::2] = np.clip(expected[:, 0::2], max(x, 0), min(x + w, width))
            expected[:, 1::2] = np.clip(expected[:, 1::2], max(y, 0), min(y + h, height))
            keep = (expected[:, 2] > expected[:, 0]) & (expected[:, 3] > expected[:, 1])
            rows = targets.rows([sample])[0]
            back = _to_source(rows, targets.frames_of([sample])[0])
            np.testing.assert_allclose(back, expected[keep], atol=1e-3, rtol=0)
            assert rows[:, 4].tolist() == [b[0] for b, k in zip(yolo.boxes[name], keep, strict=True) if k]
    assert verify(out) == []
    shown = run_cli("info", str(out))
    assert "targets    boxes:" in shown.stdout and "3 categories (square, disc, triangle)" in shown.stdout


def test_a_yolo_folder_without_class_names_is_refused(tmp_path: Path) -> None:
    yolo = write_yolo(tmp_path)
    (yolo.src / "data.yaml").unlink()
    with pytest.raises(SourceError, match="names its classes in neither"):
        preprocess(yolo.src, tmp_path / "out", TileSettings(tile=T), workers=1,
                   targets=TargetOptions(yolo=True))
    (yolo.src / "classes.txt").write_text("a\nb\nc\n")
    summary = preprocess(yolo.src, tmp_path / "out", TileSettings(tile=T), workers=1,
                         targets=TargetOptions(yolo=True))
    assert summary.accepted == len(yolo.boxes)


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
def test_semantic_masks_equal_pil_nearest_on_the_same_geometry(tmp_path: Path, fit: str) -> None:
    sem = write_semantic(tmp_path)
    out = tmp_path / "store"
    preprocess(sem.src, out, TileSettings(tile=T, fit=fit), workers=2,
               targets=TargetOptions(masks=str(sem.masks)))
    assert {n: r.split(":")[0] for n, r in _rejects(out, sem.src).items()} == sem.bad
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None and targets.masks is fmt.MaskKind.SEMANTIC and targets.objects is None
        sources = _samples(out)
        masks = np.empty((len(sources), T, T), dtype=np.uint8)
        targets.read_masks_into(np.arange(len(sources)), masks)
        for sample, path in enumerate(sources):
            name = os.path.relpath(path, sem.src)
            width, height = sem.sizes[name]
            source = np.asarray(Image.open(sem.masks / name.replace(".jpg", ".png")))
            np.testing.assert_array_equal(masks[sample], _pil_nearest(source, width, height, fit, 255))
            # the frame maps the source's corners onto the picture's place in the tile
            (x, y, w, h), (nw, nh), (left, top) = _geometry(width, height, fit)
            sx, sy, tx, ty = targets.frames_of([sample])[0]
            assert abs(x * sx + tx - left) < 1e-9 and abs((x + w) * sx + tx - left - nw) < 1e-9
            assert abs(y * sy + ty - top) < 1e-9 and abs((y + h) * sy + ty - top - nh) < 1e-9
    assert verify(out, deep=True) == []


def test_a_run_stopped_before_its_metadata_resumes_to_the_same_bytes(coco: CocoSet, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts and image shards done, the run stopped before the masks' shards and the metadata: the
    rerun takes every part from the work folder and ends in the bytes of an uninterrupted run;
    a third run finds the store complete and reports its objects."""
    from tilefeed.preprocess import writer

    targets = TargetOptions(annotations=str(coco.annotations), instance_masks=True)
    settings = TileSettings(tile=T)
    whole = tmp_path / "whole"
    preprocess(coco.src, whole, settings, workers=1, targets=targets)

    def stop(*args: object) -> None:
        raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        patch.setattr(writer, "publish", stop)
        with pytest.raises(KeyboardInterrupt):
            preprocess(coco.src, out, settings, workers=1, targets=targets)
    assert (out / fmt.WORK_DIR).is_dir() and not (out / "zarr.json").exists()
    summary = preprocess(coco.src, out, settings, workers=1, targets=targets)
    assert summary.resumed_parts > 0
    assert tree_bytes(out) == tree_bytes(whole)
    again = preprocess(coco.src, out, settings, workers=1, targets=targets)
    assert again.up_to_date and again.objects == summary.objects > 0


def test_the_targets_are_part_of_the_run_s_identity(coco: CocoSet, tmp_path: Path) -> None:
    """A store is up to date only for the same targets: a YOLO label file or a mask that changed
    size, or another annotation file, makes OUT's store another one (refused without
    --overwrite), and the same ones find it complete."""
    from tilefeed.store.errors import StoreExistsError

    yolo = write_yolo(tmp_path)
    out = tmp_path / "yolo-store"
    settings, targets = TileSettings(tile=T), TargetOptions(yolo=True)
    preprocess(yolo.src, out, settings, workers=1, targets=targets)
    assert preprocess(yolo.src, out, settings, workers=1, targets=targets).up_to_date
    with open(yolo.src / "labels" / "001.txt", "a") as f:
        f.write("2 0.5 0.5 0.1 0.1\n")
    with pytest.raises(StoreExistsError, match="made from other sources or settings"):
        preprocess(yolo.src, out, settings, workers=1, targets=targets)
    (yolo.src / "labels" / "002.txt").unlink(missing_ok=True)  # a label file gone: its size is -1
    summary = preprocess(yolo.src, out, settings, workers=1, targets=targets, overwrite=True)
    assert not summary.up_to_date

    store = tmp_path / "coco-store"
    preprocess(coco.src, store, settings, workers=1, targets=TargetOptions(annotations=str(coco.annotations)))
    other = tmp_path / "other.json"
    document = json.loads(coco.annotations.read_text())
    document["annotations"][0]["bbox"][0] += 1.0
    other.write_text(json.dumps(document))
    with pytest.raises(StoreExistsError, match="made from other sources or settings"):
        preprocess(coco.src, store, settings, workers=1, targets=TargetOptions(annotations=str(other)))


def test_instance_masks_without_pycocotools_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pycocotools" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'tilefeed\[coco\]'"):
        TargetOptions(annotations="a.json", instance_masks=True)
    TargetOptions(annotations="a.json")  # boxes alone need no pycocotools



_CALLS = [0]


def _every_other_raises(*args: Any) -> Any:
    """place_targets, but every second image's raises what no reader names."""
    _CALLS[0] += 1
    if _CALLS[0] % 2 == 0:
        raise KeyError("segmentation")
    return place_targets(*args)


def test_any_failure_of_one_images_annotations_rejects_that_image(coco: CocoSet, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only the failures the readers name: whatever an image's annotations raise makes that
    image a reject with the reason, and the run still writes its store."""
    import tilefeed.preprocess.tasks as tasks
    import tilefeed.preprocess.worker_pool as worker_pool

    monkeypatch.setattr(tasks, "place_targets", _every_other_raises)
    monkeypatch.setattr(worker_pool, "client_started", lambda: False)  # workers forked with the patch
    out = tmp_path / "out"
    summary = preprocess(coco.src, out, TileSettings(tile=T), workers=1,
                         targets=TargetOptions(annotations=str(coco.annotations)))
    reasons = _rejects(out, coco.src)
    broken = {name for name, reason in reasons.items() if reason == "bad annotation: KeyError: 'segmentation'"}
    assert broken and summary.accepted > 0
    assert summary.accepted + len(reasons) == len(coco.objects) + len(coco.bad)  # every image somewhere
