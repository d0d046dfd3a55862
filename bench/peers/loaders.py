"""The loaders the harness compares, built on equal terms from one set of settings."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tilefeed.bench.peers.baseline import (MEAN, STD, JpegFolder, jpeg_dataloader, random_resized_box,
                                           seed_worker)
from tilefeed.pipeline import Loader, TileDataset
from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD
from tilefeed.pipeline.device import dali_device_id
from tilefeed.store.errors import ConfigError

LOADERS = ("baseline", "dali-files", "tiles-dataloader", "tilefeed")
# what the batches are: every loader gives float32 NCHW; the others are tilefeed's alone
OUTPUTS = {"float32": (torch.float32, "NCHW"), "channels_last": (torch.float32, "channels_last"),
           "uint8": (torch.uint8, "NHWC")}


@dataclass(frozen=True)
class RowSettings:
    images: Path | None  # source JPEG folder (baseline, dali-files)
    store: Path | None  # tilefeed store made from it (tiles-dataloader, tilefeed)
    batch_size: int = 64
    workers: int = 2
    size: int = 224
    train: bool = True  # random-resized crop + flip + normalise; else centre/resize + normalise
    device: torch.device = torch.device("cpu")
    output: str = "float32"  # a key of OUTPUTS

    @property
    def augmentation(self) -> str:
        return ("train: random-resized crop, flip, normalise" if self.train
                else "eval: centre crop / resize, normalise")


def build_loader(name: str, s: RowSettings) -> Iterable[Any]:
    """The named loader, yielding (images, int64 labels) batches: float32 NCHW, or for
    tilefeed the ``output`` asked for."""
    if name not in LOADERS:
        raise ConfigError(f"unknown loader {name!r}; choose from {', '.join(LOADERS)}")
    if s.output != "float32" and name != "tilefeed":
        raise ConfigError(f"--output {s.output} is tilefeed's alone: loader {name!r} gives float32 "
                          "NCHW, and a comparison needs the same output on every side")
    needs = "images" if name in ("baseline", "dali-files") else "store"
    path = getattr(s, needs)
    if path is None:
        raise ConfigError(f"loader {name!r} needs --{needs}")
    if name == "baseline":
        return jpeg_dataloader(path, s.batch_size, workers=s.workers, train=s.train, size=s.size,
                               pin_memory=s.device.type == "cuda")
    if name == "tilefeed":
        dtype, layout = OUTPUTS[s.output]
        return Loader(path, s.batch_size, train=s.train, size=s.size, workers=s.workers,
                      device=s.device, dtype=dtype, layout=layout)
    if name == "tiles-dataloader":
        return DataLoader(TileDataset(path, transform=TileTransform(s.size, s.train)),
                          batch_size=s.batch_size, shuffle=True, num_workers=s.workers,
                          pin_memory=s.device.type == "cuda", worker_init_fn=seed_worker,
                          persistent_workers=s.workers > 0)
    return DaliFiles(path, s)


class TileTransform:
    """The same augmentation family as the baseline, on a (T, T, 3) uint8 tile tensor.

    Its random stream comes from ``torch.initial_seed()`` in the process that calls it, first use:
    each DataLoader worker gets a seed of its own, so workers do not repeat each other's crops.
    """

    def __init__(self, size: int, train: bool) -> None:
        self.size, self.train = size, train
        self._rng: random.Random | None = None

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(torch.initial_seed())
        return self._rng

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_rng": None}  # each worker process draws its own stream

    def __call__(self, tile: torch.Tensor) -> torch.Tensor:
        chw = tile.permute(2, 0, 1)
        if self.train:
            left, top, right, bottom = random_resized_box(chw.shape[2], chw.shape[1], self.rng)
            chw = chw[:, top:bottom, left:right]
        x = chw.unsqueeze(0).float()
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True,
                              align_corners=False)
        x = x[0]
        if self.train and self.rng.random() < 0.5:
            x = x.flip(-1)
        return (x - MEAN) / STD


class DaliFiles:
    """DALI's own file reader and decoder over the source JPEG folder (nvJPEG on a GPU)."""

    def __init__(self, images: Path, s: RowSettings) -> None:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files = JpegFolder(images)  # the same file list and labels as the baseline
        gpu = s.device.type == "cuda"
        device_id = dali_device_id(s.device)

        @pipeline_def(batch_size=s.batch_size, num_threads=s.workers, device_id=device_id,
                      prefetch_queue_depth=2, seed=0)
        def pipe() -> Any:
            jpegs, labels = fn.readers.file(files=files.paths, labels=files.labels,
                                            random_shuffle=True, name="reader")
            decoder = "mixed" if gpu else "cpu"
            if s.train:
                images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB)
                images = fn.resize(images, size=[s.size, s.size], antialias=True)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=s.size, antialias=True)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", crop=[s.size, s.size],
                mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD), mirror=mirror)
            return images, (labels.gpu() if gpu else labels)

        self._pipe = pipe()
        self._pipe.build()
        self._iter = DALIGenericIterator([self._pipe], ["images", "labels"], reader_name="reader",
                                         last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self._iter:
            yield out[0]["images"], out[0]["labels"].reshape(-1).long()

    def __len__(self) -> int:
        return len(self._iter)
