"""Grid mode with targets: each tile of an image holds the objects its window shows, clipped to
it (kept when a width and a height are left, the crop fit's rule), with a frame that maps them
back to the source within 1e-3 px; an object several tiles cut is in each; instance and semantic
mask tiles equal the source mask's cut. The expected values are computed here from the generated
set's own boxes and masks, not by the code under test."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from PIL import Image

from tests.helpers import run_cli
from tests.preprocess.targets_data import CocoSet, write_coco, write_semantic, write_yolo
from tilefeed.pipeline import StoreReader
from tilefeed.preprocess import TargetOptions, TileSettings, preprocess
from tilefeed.store import format as fmt
from tilefeed.store.arrays import read_small_array
from tilefeed.store.documents import open_store
from tilefeed.store.inspection import verify

T = 32


def _tiles(out: Path) -> list[tuple[str, int, int]]:
    """Each sample's source path, grid row and column."""
    _, meta = open_store(out)
    paths = zarr.open_group(str(out), mode="r")[fmt.SOURCE_PATHS][:]
    sources = read_small_array(out, meta, fmt.SOURCES)
    rows, cols = read_small_array(out, meta, fmt.ROWS), read_small_array(out, meta, fmt.COLS)
    return [(str(paths[s]), int(r), int(c)) for s, r, c in zip(sources, rows, cols, strict=True)]


def _rejects(out: Path, src: Path) -> dict[str, str]:
    attrs, _ = open_store(out)
    return {os.path.relpath(r["path"], src): r["reason"].split(":")[0] for r in attrs["rejects"]}


def _window(row: int, col: int, stride: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The tile's window of the source: x0, y0, x1, y1, the picture's edge clipping it."""
    x, y = col * stride, row * stride
    return x, y, min(x + T, size[0]), min(y + T, size[1])


def _seen(objs: list[dict[str, Any]],
          window: tuple[int, int, int, int]) -> list[tuple[dict[str, Any], list[float]]]:
    """The objects whose box, clipped to the window, keeps a width and a height, with that box."""
    x0, y0, x1, y1 = window
    out = []
    for o in objs:
        bx, by, bw, bh = o["bbox"]
        box = [max(bx, x0), max(by, y0), min(bx + bw, x1), min(by + bh, y1)]
        if box[2] > box[0] and box[3] > box[1]:
            out.append((o, box))
    return out


SLIVERS = ([31.75, 40.0, 10.0, 10.0], [60.0, 31.8, 10.0, 10.0])  # a quarter and a fifth of a pixel in tile 0


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> CocoSet:
    """The generated set, one object of each of its two largest pictures made a crowd region,
    and img05.png given two squares that pass a tile edge at stride 32 by under a pixel."""
    from pycocotools import mask as mask_utils

    made = write_coco(tmp_path_factory.mktemp("coco"))
    document = json.loads(made.annotations.read_text())
    crowd = {objs[0]["id"] for name, objs in made.objects.items() if objs and made.sizes[name] == (150, 100)}
    assert crowd
    for ann in document["annotations"]:
        ann["iscrowd"] = 1 if ann["id"] in crowd else ann["iscrowd"]
    for objs in made.objects.values():
        for o in objs:
            o["iscrowd"] = 1 if o["id"] in crowd else o["iscrowd"]
    image_id = next(i["id"] for i in document["images"] if i["file_name"] == "img05.png")
    for n, (x, y, w, h) in enumerate(SLIVERS):
        polygon = [[x, y, x + w, y, x + w, y + h, x, y + h]]
        ann = {"id": 5000 + n, "image_id": image_id, "category_id": 1, "iscrowd": 0, "bbox": [x, y, w, h],
               "area": w * h, "segmentation": polygon}
        document["annotations"].append(ann)
        rle = mask_utils.merge(mask_utils.frPyObjects(polygon, 100, 150))
        made.objects["img05.png"].append({**ann, "mask": np.asarray(mask_utils.decode(rle), dtype=np.uint8)})
    made.annotations.write_text(json.dumps(document))
    return made


@pytest.mark.parametrize("stride", [T, 24, 56])
def test_each_grid_tile_holds_the_objects_its_window_shows(coco: CocoSet, tmp_path: Path, stride: int) -> None:
    """Strides at, under (tiles overlap) and over (gaps between tiles) the tile side."""
    out = tmp_path / "store"
    summary = preprocess(coco.src, out, TileSettings(tile=T, mode="grid", stride=stride), workers=2,
                         targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    rejects = _rejects(out, coco.src)
    assert rejects == coco.bad  # bad_many: its 255 objects all lie in its first tile
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None and targets.masks is fmt.MaskKind.INSTANCE
        tiles = _tiles(out)
        masks = np.empty((len(tiles), T, T), dtype=np.uint8)
        targets.read_masks_into(np.arange(len(tiles)), masks)
        stored, shown_in = 0, {}  # annotation id -> tiles it is stored in
        for sample, (path, row, col) in enumerate(tiles):
            name = os.path.relpath(path, coco.src)
            size = coco.sizes[name]
            window = _window(row, col, stride, size)
            seen = _seen(coco.objects[name], window)
            rows = targets.rows([sample])[0]
            stored += len(rows)
            assert len(rows) == len(seen), (name, row, col)
            for o, _ in seen:
                shown_in.setdefault(o["id"], []).append(sample)
            np.testing.assert_array_equal(targets.frames_of([sample])[0], [1.0, 1.0, -window[0], -window[1]])
            expected = np.array([box for _, box in seen]).reshape(-1, 4)
            np.testing.assert_allclose(targets.to_source(rows[:, :4], sample), expected, atol=1e-3, rtol=0)
            assert rows[:, 4].tolist() == [o["category_id"] for o, _ in seen]
            assert rows[:, 5].tolist() == [o["iscrowd"] for o, _ in seen]
            # the mask: the tile's own objects numbered 1, 2, ... painted in order, then cut
            x0, y0, x1, y1 = window
            canvas = np.zeros((size[1], size[0]), dtype=np.uint8)
            for k, (o, _) in enumerate(seen, 1):
                canvas[o["mask"] != 0] = k
            reference = np.zeros((T, T), dtype=np.uint8)
            reference[:y1 - y0, :x1 - x0] = canvas[y0:y1, x0:x1]
            np.testing.assert_array_equal(masks[sample], reference, err_msg=f"{name} tile {row},{col}")
        assert stored == summary.objects == targets.record.objects
        every = {o["id"] for objs in coco.objects.values() for o in objs}
        assert summary.outside == len(every - set(shown_in))
        assert stride <= T or summary.outside > 0  # the gaps of stride 56 hold some objects
        assert stride > T or summary.outside == 0
        assert any(len(v) > 1 for v in shown_in.values())  # objects cut by several tiles
        assert any(o["iscrowd"] for objs in coco.objects.values() for o in objs if o["id"] in shown_in)
    assert verify(out, deep=True) == []


def test_an_object_straddling_two_tiles_is_clipped_into_each(coco: CocoSet, tmp_path: Path) -> None:
    """edge.png (120 x 45) holds a square from x 30 to 50: tile column 0 keeps its 30..32,
    column 1 its 32..50 (0..18 there); both map back to their halves of the source box."""
    out = tmp_path / "store"
    preprocess(coco.src, out, TileSettings(tile=T, mode="grid"), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    square = next(o for o in coco.objects["edge.png"] if o["bbox"][0] == 30.0)
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None
        tiles = _tiles(out)
        found = {}
        for sample, (path, row, col) in enumerate(tiles):
            if path.endswith("edge.png") and row == 0 and col in (0, 1):
                rows = targets.rows([sample])[0]
                which = np.flatnonzero(targets.to_source(rows[:, :4], sample)[:, 2] > 30)  # the square's
                assert len(which) == 1, rows
                k = int(which[0]) + 1
                found[col] = (rows[k - 1, :4], targets.to_source(rows[k - 1:k, :4], sample)[0])
                masks = np.empty((1, T, T), dtype=np.uint8)
                targets.read_masks_into([sample], masks)
                cut = square["mask"][0:T, col * T:col * T + T]
                np.testing.assert_array_equal(masks[0] == k, cut != 0)
        # slivers under a pixel are kept: the rule is a width and a height left, as the crop fit's
        slivers = {(0, 1): [60 - 32, 31.8, 32, 32], (1, 0): [31.75, 40 - 32, 32, 50 - 32]}
        for sample, (path, row, col) in enumerate(tiles):
            if path.endswith("img05.png") and (row, col) in slivers:
                assert slivers.pop((row, col)) in np.round(targets.rows([sample])[0][:, :4], 9).tolist()
        assert not slivers
    np.testing.assert_allclose(found[0][0], [30, 5, 32, 15], atol=1e-9)
    np.testing.assert_allclose(found[1][0], [0, 5, 18, 15], atol=1e-9)
    np.testing.assert_allclose(found[0][1], [30, 5, 32, 15], atol=1e-3)
    np.testing.assert_allclose(found[1][1], [32, 5, 50, 15], atol=1e-3)


def test_semantic_mask_tiles_are_the_source_masks_cut(tmp_path: Path) -> None:
    sem = write_semantic(tmp_path)
    out = tmp_path / "store"
    preprocess(sem.src, out, TileSettings(tile=T, mode="grid", stride=24), workers=2,
               targets=TargetOptions(masks=str(sem.masks)))
    assert _rejects(out, sem.src) == sem.bad
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None and targets.masks is fmt.MaskKind.SEMANTIC
        tiles = _tiles(out)
        masks = np.empty((len(tiles), T, T), dtype=np.uint8)
        targets.read_masks_into(np.arange(len(tiles)), masks)
        assert len(tiles) > len(sem.sizes)
        for sample, (path, row, col) in enumerate(tiles):
            name = os.path.relpath(path, sem.src)
            source = np.asarray(Image.open(sem.masks / name.replace(".jpg", ".png")))
            x0, y0, x1, y1 = _window(row, col, 24, sem.sizes[name])
            reference = np.full((T, T), fmt.MASK_IGNORE, dtype=np.uint8)  # past the edge: ignored
            reference[:y1 - y0, :x1 - x0] = source[y0:y1, x0:x1]
            np.testing.assert_array_equal(masks[sample], reference, err_msg=f"{name} tile {row},{col}")
    assert verify(out, deep=True) == []


def test_a_yolo_folder_in_grid_mode_through_the_command(tmp_path: Path) -> None:
    yolo = write_yolo(tmp_path)
    out = tmp_path / "store"
    done = run_cli("preprocess", str(yolo.src), str(out), "--yolo", "--mode", "grid", "--tile", str(T),
                   "--processes", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    assert _rejects(out, yolo.src / "images") == yolo.bad
    with StoreReader(out) as reader:
        targets = reader.targets
        assert targets is not None and targets.masks is None
        for sample, (path, row, col) in enumerate(_tiles(out)):
            name = os.path.basename(path)
            objs = [{"bbox": [x0, y0, x1 - x0, y1 - y0], "category_id": c}
                    for c, x0, y0, x1, y1 in yolo.boxes[name]]
            seen = _seen(objs, _window(row, col, T, yolo.sizes[name]))
            rows = targets.rows([sample])[0]
            assert rows[:, 4].tolist() == [o["category_id"] for o, _ in seen]
            np.testing.assert_allclose(targets.to_source(rows[:, :4], sample),
                                       np.array([b for _, b in seen]).reshape(-1, 4), atol=1e-3, rtol=0)
