"""One image's targets, read and checked in the worker that decodes the image, then moved into
its tile by the same geometry as its pixels.

Reading (``read_targets``): a COCO record (the image's annotations, as the scan wrote them), a
YOLO label file, or a semantic mask PNG. Whatever is wrong with one image's targets rejects
that image, with a reason naming the object (COCO's annotation id, the label file's line):
a box outside its image (by more than BOX_TOLERANCE pixels; within it, the box is clipped to
the image, as annotation tools round), a box of no width or height, a category id not in the
table, a crowd flag other than 0 or 1, a mask of another size than its image, more than
MAX_MASK_OBJECTS objects with instance masks in a tile, a label line that is not five numbers,
a label file over MAX_LABEL_BYTES.

Placing (``place_targets``): boxes are mapped by the placement's affine (``Placement.frame``),
then clipped to the tile; a box left with no width or height (crop fit: an object wholly
outside the centre square) is not stored and is counted (``TileTargets.outside``, summed in
the run's summary). Masks are resized with nearest sampling, pixel centres mapped as PIL's
``Image.resize(NEAREST, box=...)`` maps them; the pad area is 0 (background) in an instance
mask, MASK_IGNORE in a semantic one. Instance masks are painted object by object in the
order of the objects' rows, so a pixel that several objects cover goes to the one listed last.

Grid mode (``place_grid``): each tile is a window of the picture, not resized, so its frame is a
shift by whole pixels (1, 1, -x, -y). Every tile gets the objects whose box, clipped to the
tile, keeps a width and a height (the crop fit's rule), each clipped there: an object cut by
several tiles is in each. Masks are the window's cut of the source mask, the padding past the
picture's edge filled as the pad fit's; an instance mask numbers the tile's own objects 1, 2, ...
in their rows' order, painted as above, and a tile holds at most MAX_MASK_OBJECTS of them. The
objects in no tile (only where a stride over the tile side leaves gaps) are counted as
``outside``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

from tilefeed.preprocess.images import Placement, Rejected
from tilefeed.preprocess.settings import TargetKind
from tilefeed.preprocess.sources.targets import YOLO_IMAGES, YOLO_LABELS, TargetJob, TooLarge, read_bounded
from tilefeed.store.format import MASK_IGNORE, MAX_MASK_OBJECTS, MaskKind

BOX_TOLERANCE: Final = 0.5  # pixels a box may pass its image's edge by (clipped), as tools round
# A YOLO label file is read whole: 16 MiB is some 400,000 label lines, far past any image's objects
MAX_LABEL_BYTES: Final = 16 << 20
MASK_SUFFIX: Final = ".png"


@dataclass(frozen=True)
class SourceTargets:
    """One image's objects in its own pixels: ``boxes`` (k, 4) float64 XYXY, clipped to the
    image; ``categories`` (k,); ``crowd`` (k,) 0 or 1; ``masks`` each object's RLE (instance
    masks) or None; ``semantic`` the (H, W) class-id mask, or None."""

    boxes: np.ndarray
    categories: np.ndarray
    crowd: np.ndarray
    masks: list[tuple[str, dict[str, Any]]] | None = None  # (the object named for a reason, its RLE)
    semantic: np.ndarray | None = None


@dataclass(frozen=True)
class TileTargets:
    """One tile's targets: ``objects`` (k, 6) float64 rows (x0, y0, x1, y1, category, iscrowd),
    ``frame`` (sx, sy, tx, ty), ``mask`` the (T, T) uint8 mask tile or None, ``outside`` the
    objects not stored because no part of their box lies in the tile."""

    objects: np.ndarray
    frame: tuple[float, float, float, float]
    mask: np.ndarray | None
    outside: int


def split_records(data: bytes, count: int) -> list[bytes]:
    """A part's COCO records (one JSON line per source) one per source; ``count`` empty ones
    when there are none (YOLO, semantic)."""
    if not data:
        return [b""] * count
    lines = data.split(b"\n")[:-1]
    if len(lines) != count:
        raise ValueError(f"the part's records hold {len(lines)} lines for {count} sources")
    return lines


def read_targets(job: TargetJob, path: str, record: bytes, size: tuple[int, int],
                 tiles: int = 1) -> SourceTargets:
    """The targets of the image at ``path``, decoded at ``size`` (width, height) and cut into
    ``tiles`` tiles; Rejected with the reason when they cannot be stored."""
    if job.kind is TargetKind.COCO:
        boxes = _coco(job, record, size, tiles)
        if job.mask_dir:  # a semantic mask beside the boxes
            return replace(boxes, semantic=_semantic(job, path, size).semantic)
        return boxes
    if job.kind is TargetKind.YOLO:
        return _yolo(job, path, size)
    return _semantic(job, path, size)


def target_file(job: TargetJob, path: str) -> tuple[str, str]:
    """The file that holds the targets of the image at ``path`` (YOLO: its label file;
    semantic: its mask, beside a COCO file too), and its name as a reason shows it ('', '' for
    COCO alone, whose targets are in the one annotation file)."""
    if job.kind is TargetKind.YOLO:
        stem = os.path.splitext(os.path.relpath(path, os.path.join(job.root, YOLO_IMAGES)))[0]
        return os.path.join(job.root, YOLO_LABELS, stem + ".txt"), os.path.join(YOLO_LABELS, stem + ".txt")
    if job.mask_dir:  # a mask set, or masks beside a COCO file
        mask = os.path.join(job.mask_dir, os.path.splitext(os.path.relpath(path, job.root))[0] + MASK_SUFFIX)
        return mask, mask
    return "", ""


def _empty() -> SourceTargets:
    return SourceTargets(np.zeros((0, 4)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _box(x0: float, y0: float, x1: float, y1: float, size: tuple[int, int], what: str) -> tuple[float, ...]:
    """The box clipped to the image, or Rejected: of no width or height, or outside the image."""
    w, h = size
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
        raise Rejected(f"bad annotation: {what}: box coordinates are not finite numbers")
    if x1 <= x0 or y1 <= y0:
        raise Rejected(f"degenerate box: {what}: box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) has no width or height")
    t = BOX_TOLERANCE
    if x0 < -t or y0 < -t or x1 > w + t or y1 > h + t:
        raise Rejected(f"box outside image: {what}: box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) (XYXY) lies outside "
                       f"the {w}x{h} image")
    return max(x0, 0.0), max(y0, 0.0), min(x1, float(w)), min(y1, float(h))


# -- COCO -----------------------------------------------------------------------------------------
def _coco(job: TargetJob, record: bytes, size: tuple[int, int], tiles: int) -> SourceTargets:
    entry = json.loads(record)
    w, h = size
    if (entry["w"], entry["h"]) != (w, h):
        raise Rejected(f"image size: the image is {w}x{h}, the annotations say {entry['w']}x{entry['h']}")
    anns = entry["a"]
    with_masks = job.masks is MaskKind.INSTANCE
    # each object's mask is decoded at the image's size: bounded before any is (per tile in
    # grid mode, where place_grid holds each tile to the limit)
    if with_masks and len(anns) > MAX_MASK_OBJECTS * tiles:
        where = "an image" if tiles == 1 else f"a tile, {tiles} tiles"
        raise Rejected(f"too many objects: {len(anns)} objects with masks, at most {MAX_MASK_OBJECTS} {where}")
    ids = set(job.category_ids)
    boxes, categories, crowd, masks = [], [], [], []
    for ann in anns:
        what = f"annotation {ann['id']}"
        bbox = ann.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
            raise Rejected(f"bad annotation: {what}: bbox is not four numbers [x, y, width, height]")
        x, y, bw, bh = (float(v) for v in bbox)
        boxes.append(_box(x, y, x + bw, y + bh, size, what))  # COCO's XYWH -> XYXY
        category = ann.get("category_id")
        if not isinstance(category, int) or isinstance(category, bool) or category not in ids:
            raise Rejected(f"unknown category: {what}: category_id {category!r} is not in the file's "
                           "categories")
        categories.append(category)
        flag = ann.get("iscrowd", 0)
        if flag not in (0, 1) or isinstance(flag, bool):
            raise Rejected(f"bad annotation: {what}: iscrowd is {flag!r}, not 0 or 1")
        crowd.append(int(flag))
        if with_masks:
            masks.append((what, _rle(ann.get("segmentation"), size, what)))
    if not boxes:
        return SourceTargets(_empty().boxes, _empty().categories, _empty().crowd, [] if with_masks else None)
    return SourceTargets(np.array(boxes, dtype=np.float64), np.array(categories, dtype=np.int64),
                         np.array(crowd, dtype=np.int64), masks if with_masks else None)


def _rle(segmentation: Any, size: tuple[int, int], what: str) -> dict[str, Any]:
    """An object's segmentation (polygons, or RLE: counts as a list or COCO's compressed text)
    as one pycocotools RLE of the image's size."""
    from pycocotools import mask as mask_utils

    w, h = size
    if isinstance(segmentation, list):
        if not segmentation or not all(
                isinstance(poly, list) and len(poly) >= 6 and len(poly) % 2 == 0
                and all(_number(v) for v in poly)
                for poly in segmentation):
            raise Rejected(f"bad annotation: {what}: segmentation polygons must each be 3 or more x, y pairs")
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
        return dict(rle)
    if isinstance(segmentation, dict):
        shape, counts = segmentation.get("size"), segmentation.get("counts")
        if shape != [h, w]:
            raise Rejected(f"mask size: {what}: its RLE mask is {_shape(shape)}, the image {h}x{w} "
                           "(height x width)")
        if isinstance(counts, list):
            whole = all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
            if not whole or sum(counts) != h * w:
                raise Rejected(f"bad annotation: {what}: RLE counts must be whole numbers covering the "
                               f"{h}x{w} image")
            return dict(mask_utils.frPyObjects(segmentation, h, w))
        if isinstance(counts, str):
            return {"size": [h, w], "counts": counts.encode("ascii", "replace")}
    raise Rejected(f"bad annotation: {what}: no segmentation (polygons or RLE), which --instance-masks needs")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape)) if isinstance(shape, list) else repr(shape)


def _decode(rle: dict[str, Any], what: str) -> np.ndarray:
    from pycocotools import mask as mask_utils

    try:
        return np.asarray(mask_utils.decode(rle), dtype=np.uint8)
    except Exception as e:  # noqa: BLE001 - pycocotools raises several kinds on a bad RLE string
        raise Rejected(f"bad annotation: {what}: its RLE does not decode ({type(e).__name__})") from None


# -- YOLO -----------------------------------------------------------------------------------------
def _yolo(job: TargetJob, path: str, size: tuple[int, int]) -> SourceTargets:
    """``labels/<rel>.txt`` for ``images/<rel>.<ext>``: a line ``class cx cy w h`` per object,
    normalised to the image's size. No label file means no objects (YOLO's background image)."""
    label, shown = target_file(job, path)
    try:
        text = read_bounded(label, MAX_LABEL_BYTES)
    except FileNotFoundError:
        return _empty()
    except TooLarge as e:
        declared = "" if e.size is None else f" is {e.size} bytes,"
        raise Rejected(f"labels too large: {shown}{declared} over the {MAX_LABEL_BYTES >> 20} MiB a label file "
                       "may hold") from None
    except OSError as e:
        raise Rejected(f"unreadable labels: {shown}: {e.strerror or e}") from None
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise Rejected(f"bad label line: {shown}: not UTF-8 text") from None
    w, h = size
    ids = set(job.category_ids)
    boxes, categories = [], []
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        what = f"{shown} line {number}"
        if len(fields) != 5:
            raise Rejected(f"bad label line: {what}: {len(fields)} values, expected 5 (class cx cy w h; "
                           "boxes only)")
        try:
            category = int(fields[0])
            cx, cy, bw, bh = (float(v) for v in fields[1:])
        except ValueError:
            raise Rejected(f"bad label line: {what}: not a class id and four numbers") from None
        if category not in ids:
            raise Rejected(f"unknown category: {what}: class {category} is not in the set's names")
        x0, y0, x1, y1 = (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h
        boxes.append(_box(x0, y0, x1, y1, size, what))
        categories.append(category)
    if not boxes:
        return _empty()
    return SourceTargets(np.array(boxes, dtype=np.float64), np.array(categories, dtype=np.int64),
                         np.zeros(len(boxes), dtype=np.int64))


# -- semantic masks -------------------------------------------------------------------------------
def _semantic(job: TargetJob, path: str, size: tuple[int, int]) -> SourceTargets:
    """``MASKS/<rel>.png`` for ``SRC/<rel>.<ext>``: one 8-bit band (L, or P read as its
    indices) of class ids, MASK_IGNORE for no label, of the image's size."""
    from PIL import Image

    mask_path, _ = target_file(job, path)
    try:
        with Image.open(mask_path) as im:
            if im.mode not in ("L", "P"):
                raise Rejected(f"mask mode: {mask_path}: mode {im.mode}, not one 8-bit band of class ids "
                               "(L or P)")
            if im.size != size:
                raise Rejected(f"mask size: {mask_path} is {im.size[0]}x{im.size[1]}, the image "
                               f"{size[0]}x{size[1]}")
            mask = np.array(im, dtype=np.uint8)
    except FileNotFoundError:
        raise Rejected(f"no mask: {mask_path} does not exist") from None
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the PNG decoder: this image only
        raise Rejected(f"unreadable mask: {mask_path}: {type(e).__name__}: {str(e)[:120]}") from None
    if job.category_ids:
        allowed = np.zeros(256, dtype=bool)
        allowed[[i for i in job.category_ids if i < 256]] = True
        allowed[MASK_IGNORE] = True
        bad = ~allowed[mask]
        if bad.any():
            table = "the annotations file's categories" if job.kind is TargetKind.COCO else "classes.txt"
            raise Rejected(f"unknown category: {mask_path} holds class id {int(mask[bad][0])}, not in "
                           f"{table}")
    empty = _empty()
    return SourceTargets(empty.boxes, empty.categories, empty.crowd, semantic=mask)


# -- into the tile --------------------------------------------------------------------------------
def nearest(mask: np.ndarray, where: Placement, tile: int, fill: int) -> np.ndarray:
    """``mask`` (H, W) placed in a (tile, tile) uint8 tile as ``where`` places the picture,
    resized with nearest sampling: output pixel i samples the source pixel under its centre,
    x + (i + 0.5) * w / nw, rounded down; ``fill`` outside the picture. The centres are
    stepped as PIL's ``Image.resize(NEAREST, box=...)`` steps them (a running sum from
    x + w / nw / 2), so the tile equals PIL's pixel for pixel, where a product per pixel would
    round some centres that fall on a pixel edge the other way."""
    x, y, w, h = where.box
    (nw, nh), (left, top) = where.size, where.at
    rows, cols = mask.shape
    xs = np.clip(_centres(x, w / nw, nw), 0, cols - 1)
    ys = np.clip(_centres(y, h / nh, nh), 0, rows - 1)
    out = np.full((tile, tile), fill, dtype=np.uint8)
    out[top:top + nh, left:left + nw] = mask[ys[:, None], xs[None, :]]
    return out


def _centres(start: float, step: float, count: int) -> np.ndarray:
    """floor of start + step / 2, then + step each pixel, summed one after another."""
    steps = np.full(count, step)
    steps[0] = start + step * 0.5
    return np.add.accumulate(steps).astype(np.int64)  # positive values: truncation is floor


def _mapped(source: SourceTargets, frame: tuple[float, float, float, float],
            tile: int) -> tuple[np.ndarray, np.ndarray]:
    """The object rows mapped by ``frame`` and clipped to the tile, and which of them keep a
    width and a height there (the rows returned are those)."""
    sx, sy, tx, ty = frame
    boxes = source.boxes
    mapped = np.empty_like(boxes)
    mapped[:, 0::2] = np.clip(boxes[:, 0::2] * sx + tx, 0.0, tile)
    mapped[:, 1::2] = np.clip(boxes[:, 1::2] * sy + ty, 0.0, tile)
    kept = (mapped[:, 2] > mapped[:, 0]) & (mapped[:, 3] > mapped[:, 1])
    objects = np.column_stack([mapped, source.categories.astype(np.float64),
                               source.crowd.astype(np.float64)])[kept]
    return objects, kept


def place_targets(source: SourceTargets, where: Placement, size: tuple[int, int], tile: int,
                  masks: MaskKind | None) -> TileTargets:
    """``source`` mapped into the tile (see the module docstring)."""
    frame = where.frame
    objects, kept = _mapped(source, frame, tile)
    mask = None
    if masks is MaskKind.SEMANTIC:
        assert source.semantic is not None
        mask = nearest(source.semantic, where, tile, MASK_IGNORE)
    elif masks is MaskKind.INSTANCE:
        assert source.masks is not None
        w, h = size
        canvas = np.zeros((h, w), dtype=np.uint8)
        for k, j in enumerate(np.flatnonzero(kept).tolist(), 1):  # the last listed paints last
            what, rle = source.masks[j]
            canvas[_decode(rle, what) != 0] = k
        mask = nearest(canvas, where, tile, 0)
    return TileTargets(objects, frame, mask, int((~kept).sum()))


def place_grid(source: SourceTargets, windows: tuple[Placement, ...], tile: int,
               masks: MaskKind | None) -> list[TileTargets]:
    """``source`` cut into the grid's tiles, one ``TileTargets`` per window in tile order (see
    the module docstring); the first tile's ``outside`` counts the objects in no tile."""
    pieces = _pieces(source) if masks is MaskKind.INSTANCE else []
    placed: list[TileTargets] = []
    anywhere = np.zeros(len(source.boxes), dtype=bool)
    for n, where in enumerate(windows):
        x, y, w, h = (int(v) for v in where.box)
        frame = (1.0, 1.0, float(-x), float(-y))  # a shift by whole pixels: exact both ways
        objects, kept = _mapped(source, frame, tile)
        anywhere |= kept
        mask = None
        if masks is MaskKind.SEMANTIC:
            assert source.semantic is not None
            mask = np.full((tile, tile), MASK_IGNORE, dtype=np.uint8)
            mask[:h, :w] = source.semantic[y:y + h, x:x + w]
        elif masks is MaskKind.INSTANCE:
            if len(objects) > MAX_MASK_OBJECTS:
                raise Rejected(f"too many objects: tile {n} of the image holds {len(objects)} objects with "
                               f"masks, at most {MAX_MASK_OBJECTS} a tile")
            mask = np.zeros((tile, tile), dtype=np.uint8)
            for k, j in enumerate(np.flatnonzero(kept).tolist(), 1):  # the last listed paints last
                _paint(mask, pieces[j], (x, y, w, h), k)
        placed.append(TileTargets(objects, frame, mask, 0))
    if placed:
        first = placed[0]
        placed[0] = TileTargets(first.objects, first.frame, first.mask, int((~anywhere).sum()))
    return placed


def _pieces(source: SourceTargets) -> list[tuple[int, int, np.ndarray] | None]:
    """Each object's instance mask decoded once, kept as the (x, y) of its pixels' bounding
    rectangle and the boolean mask within it (None: no pixel), so the image's tiles cut it
    without a whole-image copy per object."""
    assert source.masks is not None
    out: list[tuple[int, int, np.ndarray] | None] = []
    for what, rle in source.masks:
        m = _decode(rle, what) != 0
        rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if not rows.size:
            out.append(None)
            continue
        y0, y1, x0, x1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        out.append((x0, y0, m[y0:y1, x0:x1].copy()))
    return out


def _paint(mask: np.ndarray, piece: tuple[int, int, np.ndarray] | None, window: tuple[int, int, int, int],
           value: int) -> None:
    """``value`` into ``mask`` (the tile of ``window``: x, y, width, height in the source) where
    ``piece`` covers it."""
    if piece is None:
        return
    px, py, bits = piece
    x, y, w, h = window
    x0, y0 = max(px, x), max(py, y)
    x1, y1 = min(px + bits.shape[1], x + w), min(py + bits.shape[0], y + h)
    if x1 <= x0 or y1 <= y0:
        return
    mask[y0 - y:y1 - y, x0 - x:x1 - x][bits[y0 - py:y1 - py, x0 - px:x1 - px]] = value
