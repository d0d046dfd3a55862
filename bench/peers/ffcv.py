"""FFCV's side of ``tilefeed bench loader --peer ffcv``, run by the Python of FFCV's own venv.

FFCV pulls plain Pillow and OpenCV, so it lives in an environment of its own; this file imports
nothing of tilefeed. It reads the decoded tiles tilefeed measures (``tiles.npy``, ``labels.npy``
in DIR) and tilefeed's JPEG files of the same tiles (``jpeg.npy``, ``jpeg_ends.npy``), writes
FFCV's two datasets (raw pixels; and JPEG, with tilefeed's very files in place of FFCV's own
encoding, so that both loaders decode the same bytes), builds FFCV's loaders with its
recommended CPU pipeline for each figure, compiles them once (numba), prints ``ready``, then
measures one round of every figure per ``round`` line on stdin, one JSON line each.

    python ffcv_peer.py DIR --batch-size 64 --workers 2 --min-seconds 1.5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406]) * 255
STD = np.array([0.229, 0.224, 0.225]) * 255


class Tiles:
    def __init__(self, folder: Path) -> None:
        self.tiles = np.load(folder / "tiles.npy", mmap_mode="r")
        self.labels = np.load(folder / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.ascontiguousarray(self.tiles[i]), int(self.labels[i])


def the_same_jpeg_files(folder: Path, data: Tiles) -> None:
    """FFCV's JPEG writer encodes each tile itself (OpenCV, 4:2:0 chroma); here it stores
    tilefeed's file of that tile instead (found by the tile's pixels, which is all FFCV's
    ``encode_jpeg`` is given), so the two stores hold the same bytes."""
    import multiprocessing

    import ffcv.fields.rgb_image as rgb_image

    multiprocessing.set_start_method("fork", force=True)  # the writer's processes keep the patch
    files = np.load(folder / "jpeg.npy")
    ends = np.load(folder / "jpeg_ends.npy")
    starts = np.concatenate([[0], ends[:-1]])
    by_pixels = {hashlib.blake2b(data.tiles[i].tobytes()).digest(): files[starts[i] : ends[i]]
                 for i in range(len(data))}

    def encode_jpeg(image: np.ndarray, quality: int) -> np.ndarray:
        return by_pixels[hashlib.blake2b(np.ascontiguousarray(image).tobytes()).digest()]

    rgb_image.encode_jpeg = encode_jpeg


def write(folder: Path, data: Tiles, mode: str, workers: int) -> Path:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    path = folder / f"{mode}.beton"
    writer = DatasetWriter(str(path), {"image": RGBImageField(write_mode=mode), "label": IntField()},
                           num_workers=workers)
    writer.from_indexed_dataset(data)
    return path


def loaders(paths: dict[str, Path], batch_size: int, workers: int, size: int) -> dict[str, Any]:
    """FFCV's recommended CPU pipelines: decode (with random-resized crop) -> flip ->
    NormalizeImage (a lookup table, before ToTensor) -> ToTorchImage."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    def make(path: Path, image: list[Any]) -> Any:
        return Loader(str(path), batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                      os_cache=True, drop_last=False,
                      pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})

    def train(channels_last: bool) -> list[Any]:
        return [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(),
                NormalizeImage(MEAN, STD, np.float32), ToTensor(), ToTorchImage(channels_last=channels_last)]

    out = {}
    for store, path in paths.items():
        out[f"{store}, uint8"] = make(path, [SimpleRGBImageDecoder(), ToTensor()])
        out[f"{store}, train float32 NCHW"] = make(path, train(False))
        out[f"{store}, train float32 channels_last"] = make(path, train(True))
    return out


def rate(loader: Any, min_seconds: float) -> float:
    samples, start = 0, time.perf_counter()
    while True:
        for images, _ in loader:
            samples += len(images)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return samples / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--min-seconds", type=float, default=1.5)
    args = parser.parse_args()
    data = Tiles(args.folder)
    size = data.tiles.shape[1]
    the_same_jpeg_files(args.folder, data)
    paths = {"raw": write(args.folder, data, "raw", args.workers),
             "jpeg": write(args.folder, data, "jpg", args.workers)}
    figures = loaders(paths, args.batch_size, args.workers, size)
    for loader in figures.values():  # numba compiles each pipeline on its first epochs
        rate(loader, 0.5)
    print(json.dumps({"ready": list(figures)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps({name: rate(loader, args.min_seconds) for name, loader in figures.items()}),
              flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # FFCV's loader threads can hold an ordinary interpreter exit forever
