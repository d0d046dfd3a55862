"""FFCV beside tilefeed in ``tilefeed bench loader --peer ffcv``: both sides of the exchange.

``FfcvPeer``, in tilefeed's Python, writes the tiles out and runs this very file with the Python
of FFCV's own venv: FFCV pulls plain Pillow and OpenCV, so it lives in an environment of its
own, and this file imports nothing of tilefeed when it runs (tilefeed's names are for typing
alone). The script reads the decoded tiles tilefeed measures (``tiles.npy``, ``labels.npy``
in DIR) and tilefeed's JPEG files of the same tiles (``jpeg.npy``, ``jpeg_ends.npy``), writes
FFCV's two datasets (raw pixels; and JPEG, with tilefeed's very files in place of FFCV's own
encoding, so that both loaders decode the same bytes), builds FFCV's loaders with its
recommended CPU pipeline for each figure, compiles them once (numba), prints ``ready``, then
measures one round of every figure per ``round`` line on stdin, one JSON line each.

    python ffcv.py DIR --batch-size 64 --workers 2 --min-seconds 1.5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tilefeed.pipeline.reading.reader import StoreReader

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


def _check_same_pictures(tiles: np.ndarray, raw: StoreReader, jpeg: StoreReader) -> None:
    """The JPEG store must hold the raw store's pictures, in the same order, as whole tiles."""
    if jpeg.codec.name != "jpeg" or jpeg.codec.shape != raw.codec.shape or len(jpeg) != len(raw) \
            or not np.array_equal(jpeg.labels, raw.labels):
        raise ValueError(f"{jpeg.location} is not a JPEG store of {raw.location}'s tiles")
    for i in range(len(raw)):
        error = np.abs(jpeg.read(i).astype(np.int16) - tiles[i]).mean()
        if error > 8:  # a q90 JPEG of the same tile is a level or two off on average
            raise ValueError(f"sample {i} of {jpeg.location} is not the picture of sample {i} "
                             f"of {raw.location} (mean difference {error:.1f} levels)")


class FfcvPeer:
    """FFCV's loaders in their own Python (``bench/peers/ffcv.py``), on this store's tiles: one
    measured round of every figure per ``round()``, interleaved with tilefeed's rounds."""

    def __init__(self, python: str, reader: StoreReader, jpeg: StoreReader, *, batch_size: int,
                 workers: int, min_seconds: float, log: bool) -> None:
        tiles = np.stack([reader.read(i) for i in range(len(reader))])
        _check_same_pictures(tiles, reader, jpeg)
        self.folder = Path(tempfile.mkdtemp(prefix="tilefeed-ffcv-"))
        np.save(self.folder / "tiles.npy", tiles)
        np.save(self.folder / "labels.npy", reader.labels)
        files = [np.frombuffer(p, np.uint8) for p in jpeg.payloads(range(len(jpeg)))]
        np.save(self.folder / "jpeg.npy", np.concatenate(files))  # FFCV stores these very files
        np.save(self.folder / "jpeg_ends.npy", np.cumsum([len(f) for f in files]))
        if log:
            print("FFCV: writing its datasets and compiling its pipelines...", flush=True)
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), str(self.folder),
             "--batch-size", str(batch_size), "--workers", str(workers),
             "--min-seconds", str(min_seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._read()  # {"ready": [...]}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the FFCV peer exited (status {self.proc.wait()}); run "
                               f"bench/peers/ffcv.py with that Python to see why")
        return json.loads(line)  # type: ignore[no-any-return]

    def round(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its measurements are in; a hung exit is not ours to wait on
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    # run as a script, this file's folder comes first on the path, and this file (ffcv.py) would
    # be found as the package ``ffcv`` it imports
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    code = main()
    sys.stdout.flush()
    os._exit(code)  # FFCV's loader threads can hold an ordinary interpreter exit forever
