"""Generated detection and segmentation sets, written by the tests: a COCO-format folder, a YOLO
folder and a folder of semantic masks, each of shapes with known boxes and masks drawn on noise
or gradient backgrounds, in several sizes and aspect ratios, with planted bad entries whose
reject reasons are known."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

SIZES = [(96, 64), (64, 96), (80, 80), (120, 45), (37, 71), (150, 100)]  # width, height
CATEGORIES = [{"id": 1, "name": "square"}, {"id": 4, "name": "disc"}, {"id": 90, "name": "triangle"}]


def background(rng: np.random.Generator, width: int, height: int, kind: int) -> Image.Image:
    """Noise, or a gradient with a little noise."""
    if kind % 2 == 0:
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1),
                     (xx + yy) * 255 // max(width + height - 2, 1)], axis=-1)
    noisy = base + rng.integers(-10, 11, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


@dataclass
class CocoSet:
    """The folder, its annotation file, every valid object per image, and the planted rejects
    (file name -> the reason's first words)."""

    src: Path
    annotations: Path
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)


def _shape(rng: np.random.Generator, width: int, height: int,
           k: int) -> tuple[int, list[float], dict[str, Any]]:
    """(category, bbox, segmentation) of one shape that lies inside the picture: a square or a
    triangle as a polygon, a disc as a compressed RLE (a crowd region as uncompressed RLE)."""
    category = CATEGORIES[k % 3]["id"]
    bw, bh = rng.uniform(6, width / 2), rng.uniform(6, height / 2)
    x, y = rng.uniform(0, width - bw), rng.uniform(0, height - bh)
    if category == 1:
        poly = [x, y, x + bw, y, x + bw, y + bh, x, y + bh]
        return category, [x, y, bw, bh], {"polygons": [poly]}
    if category == 90:
        poly = [x, y + bh, x + bw / 2, y, x + bw, y + bh]
        return category, [x, y, bw, bh], {"polygons": [poly]}
    disc = Image.new("L", (width, height), 0)
    ImageDraw.Draw(disc).ellipse([x, y, x + bw, y + bh], fill=1)
    m = np.asfortranarray(np.array(disc, dtype=np.uint8))
    rle = mask_utils.encode(m)
    box = [float(v) for v in mask_utils.toBbox(rle)]
    return category, box, {"rle": {"size": rle["size"], "counts": rle["counts"].decode()}, "array": m}


def write_coco(root: Path, seed: int = 0, images: int = 12, planted: bool = True) -> CocoSet:
    """A COCO-format folder: ``images`` valid pictures with 0 to 5 shapes each (one crowd
    region among them), and with ``planted`` one image per kind of bad annotation."""
    rng = np.random.default_rng(seed)
    src = root / "coco"
    (src / "sub").mkdir(parents=True)
    out = CocoSet(src, root / "instances.json")
    image_entries: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []

    def image(name: str, width: int, height: int, kind: int, entry_size: tuple[int, int] | None = None) -> int:
        background(rng, width, height, kind).save(src / name)
        image_id = len(image_entries) + 1
        w, h = entry_size or (width, height)
        image_entries.append({"id": image_id, "file_name": name, "width": w, "height": h})
        return image_id

    def ann(image_id: int, category: int, bbox: list[float], segmentation: Any,
            crowd: int = 0) -> dict[str, Any]:
        entry = {"id": len(anns) + 100, "image_id": image_id, "category_id": category, "bbox": bbox,
                 "iscrowd": crowd, "area": float(bbox[2] * bbox[3]), "segmentation": segmentation}
        anns.append(entry)
        return entry

    for i in range(images):
        width, height = SIZES[i % len(SIZES)]
        name = f"sub/img{i:02d}.png" if i % 4 == 3 else f"img{i:02d}.png"
        image_id = image(name, width, height, i)
        out.sizes[name] = (width, height)
        out.objects[name] = []
        for k in range(int(rng.integers(0, 6))):
            category, bbox, shape = _shape(rng, width, height, k + i)
            crowd = int(i == 2 and k == 0 and "array" in shape)
            if "polygons" in shape:
                segmentation: Any = shape["polygons"]
            elif crowd:  # a crowd region, as COCO writes them: uncompressed RLE
                segmentation = {"size": [height, width], "counts": _uncompressed(shape["array"])}
            else:
                segmentation = shape["rle"]
            entry = ann(image_id, category, bbox, segmentation, crowd)
            out.objects[name].append({**entry, "mask": _decode(entry["segmentation"], height, width)})
        pixels = np.array(Image.open(src / name).convert("RGB"))  # the shapes drawn, each a colour
        for k, obj in enumerate(out.objects[name]):
            pixels[obj["mask"] != 0] = (60 * k % 256, 255 - 40 * k, 128)
        Image.fromarray(pixels).save(src / name)
    # a wide picture whose crop leaves one square wholly outside the centre square, one partly
    name = "edge.png"
    image_id = image(name, 120, 45, 1)
    out.sizes[name], out.objects[name] = (120, 45), []
    for bbox in ([2.0, 5.0, 15.0, 10.0], [30.0, 5.0, 20.0, 10.0]):
        x, y, w, h = bbox
        entry = ann(image_id, 1, bbox, [[x, y, x + w, y, x + w, y + h, x, y + h]])
        out.objects[name].append({**entry, "mask": _decode(entry["segmentation"], 45, 120)})
    if planted:
        bad = [
            ("bad_outside.png", [60.0, 10.0, 50.0, 20.0], 1, None, "box outside image"),
            ("bad_degenerate.png", [10.0, 10.0, 0.0, 20.0], 1, None, "degenerate box"),
            ("bad_category.png", [10.0, 10.0, 20.0, 20.0], 2, None, "unknown category"),
            ("bad_rle_size.png", [10.0, 10.0, 20.0, 20.0], 4, {"size": [10, 10], "counts": [100]}, "mask size"),
            ("bad_crowd.png", [10.0, 10.0, 20.0, 20.0], 1, "crowd", "bad annotation"),
        ]
        for name, bbox, category, segmentation, reason in bad:
            image_id = image(name, 80, 60, 0)
            x, y, w, h = bbox
            poly = [[x, y, x + max(w, 1), y, x + max(w, 1), y + h, x, y + h]]
            entry = ann(image_id, category, bbox, poly if segmentation in (None, "crowd") else segmentation)
            if segmentation == "crowd":
                entry["iscrowd"] = 2
            out.bad[name] = reason
        image_id = image("bad_many.png", 80, 60, 1)
        for _ in range(255):
            ann(image_id, 1, [1.0, 1.0, 5.0, 5.0], [[1, 1, 6, 1, 6, 6, 1, 6]])
        out.bad["bad_many.png"] = "too many objects"
        image("bad_size.png", 80, 60, 0, entry_size=(81, 60))
        out.bad["bad_size.png"] = "image size"
    document = {"images": image_entries, "annotations": anns, "categories": CATEGORIES}
    out.annotations.write_text(json.dumps(document))
    return out


def _uncompressed(m: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts of a mask: runs in column-major order, starting with 0s."""
    flat = m.flatten(order="F")
    counts, last, run = [], 0, 0
    for v in flat.tolist():
        if v != last:
            counts.append(run)
            run, last = 0, v
        run += 1
    counts.append(run)
    return counts


def _decode(segmentation: Any, height: int, width: int) -> np.ndarray:
    """The object's mask by pycocotools, as the test's own reference."""
    if isinstance(segmentation, list):
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation["counts"], list):
        rle = mask_utils.frPyObjects(segmentation, height, width)
    else:
        rle = {"size": segmentation["size"], "counts": segmentation["counts"].encode()}
    return np.asarray(mask_utils.decode(rle), dtype=np.uint8)


@dataclass
class YoloSet:
    src: Path
    boxes: dict[str, list[tuple[int, float, float, float, float]]] = field(default_factory=dict)  # XYXY px
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)


def write_yolo(root: Path, seed: int = 1, images: int = 10) -> YoloSet:
    """A YOLO folder: images/ and labels/ with data.yaml naming three classes; one image with no
    label file (a background image), and planted bad label files."""
    rng = np.random.default_rng(seed)
    src = root / "yolo"
    (src / "images").mkdir(parents=True)
    (src / "labels").mkdir()
    (src / "data.yaml").write_text("names:\n  0: square\n  1: disc\n  2: triangle\n")
    out = YoloSet(src)
    for i in range(images):
        width, height = SIZES[i % len(SIZES)]
        name = f"{i:03d}.jpg"
        background(rng, width, height, i).save(src / "images" / name, quality=95)
        out.sizes[name] = (width, height)
        out.boxes[name] = []
        if i == 0:
            continue  # no label file: no objects
        lines = []
        for k in range(int(rng.integers(0, 5))):
            bw, bh = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{k % 3} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
            cx, cy, bw, bh = (float(v) for v in lines[-1].split()[1:])
            out.boxes[name].append((k % 3, (cx - bw / 2) * width, (cy - bh / 2) * height,
                                    (cx + bw / 2) * width, (cy + bh / 2) * height))
        (src / "labels" / f"{i:03d}.txt").write_text("\n".join(lines) + "\n")
    planted = {
        "bad_line.jpg": ("0 0.5 0.5 0.2\n", "bad label line"),
        "bad_number.jpg": ("0 0.5 x 0.2 0.2\n", "bad label line"),
        "bad_class.jpg": ("7 0.5 0.5 0.2 0.2\n", "unknown category"),
        "bad_outside.jpg": ("1 0.95 0.5 0.3 0.2\n", "box outside image"),
        "bad_degenerate.jpg": ("1 0.5 0.5 0.0 0.2\n", "degenerate box"),
    }
    for name, (text, reason) in planted.items():
        background(rng, 64, 48, 0).save(src / "images" / name, quality=95)
        (src / "labels" / name.replace(".jpg", ".txt")).write_text(text)
        out.bad[name] = reason
    return out


@dataclass
class SemanticSet:
    src: Path
    masks: Path
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)


def write_semantic(root: Path, seed: int = 2, images: int = 8) -> SemanticSet:
    """An image folder and a masks folder (a PNG of class ids 0..4 and 255 per image, as
    Cityscapes' and ADE20K's label images), classes.txt naming five classes; planted: a mask of
    another size, an RGB mask, a missing mask, a class id not in classes.txt."""
    rng = np.random.default_rng(seed)
    src, masks = root / "sem" / "images", root / "sem" / "masks"
    (src / "a").mkdir(parents=True)
    (masks / "a").mkdir(parents=True)
    (masks / "classes.txt").write_text("road\ncar\nsky\ntree\nperson\n")
    out = SemanticSet(src, masks)
    for i in range(images):
        width, height = SIZES[i % len(SIZES)]
        name = f"a/{i:02d}.jpg" if i % 3 == 0 else f"{i:02d}.jpg"
        background(rng, width, height, i).save(src / name, quality=95)
        label = Image.new("L", (width, height), 0)
        draw = ImageDraw.Draw(label)
        for k in range(4):
            x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
            x1, y1 = x0 + rng.uniform(3, width), y0 + rng.uniform(3, height)
            draw.rectangle([x0, y0, x1, y1], fill=[1, 2, 3, 255][k])
        draw.ellipse([width / 4, height / 4, width / 2, height / 2], fill=4)
        label.save(masks / name.replace(".jpg", ".png"))
        out.sizes[name] = (width, height)
    for name, reason in (("bad_size.jpg", "mask size"), ("bad_rgb.jpg", "mask mode"),
                         ("bad_missing.jpg", "no mask"), ("bad_class.jpg", "unknown category")):
        background(rng, 40, 30, 0).save(src / name, quality=95)
        if reason == "mask size":
            Image.new("L", (41, 30), 0).save(masks / name.replace(".jpg", ".png"))
        elif reason == "mask mode":
            Image.new("RGB", (40, 30), (1, 1, 1)).save(masks / name.replace(".jpg", ".png"))
        elif reason == "unknown category":
            Image.new("L", (40, 30), 9).save(masks / name.replace(".jpg", ".png"))
        out.bad[name] = reason
    return out
