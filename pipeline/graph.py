"""The DALI graph: batch source -> (nvJPEG) decode -> augment -> normalise, on the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvidia.dali import fn, pipeline_def, types

from pipeline.source import BatchSource

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class Augment:
    """What the graph does to each tile. ``train=False`` is deterministic (resize only)."""

    train: bool
    size: int
    tile: int
    normalize: bool  # False for uint8 output: pixels pass through unscaled
    half: bool  # float16 output straight from DALI
    channels_first: bool
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    @property
    def passthrough(self) -> bool:
        """uint8 NHWC eval output: the (resized) tiles as they are, with no per-pixel op."""
        return not (self.train or self.normalize or self.channels_first)


def build_pipeline(source: BatchSource, augment: Augment, *, batch_size: int, threads: int,
                   device_id: int | None, prefetch: int, seed: int, jpeg: bool) -> Any:
    gpu = device_id is not None

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=prefetch, seed=seed)
    def tiles() -> Any:
        raw, labels, indices = fn.external_source(
            source=source, num_outputs=3, batch=True, dtype=[types.UINT8, types.INT64, types.INT64],
            layout=[None if jpeg else "HWC", None, None], no_copy=not source.copies_input,
        )
        images = _finish(_decode_and_crop(raw, augment, gpu=gpu, jpeg=jpeg), augment)
        if gpu:
            labels, indices = labels.gpu(), indices.gpu()
        return images, labels, indices

    return tiles()


def _finish(images: Any, a: Augment) -> Any:
    """Flip, normalise, cast and lay out; uint8 eval output skips every per-pixel op it can."""
    if a.passthrough:
        return images
    if not (a.normalize or a.train):
        return fn.transpose(images, perm=[2, 0, 1])  # uint8 NCHW: layout only
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT16 if a.half else (types.FLOAT if a.normalize else types.UINT8),
        output_layout="CHW" if a.channels_first else "HWC",
        mean=list(a.mean) if a.normalize else [0.0, 0.0, 0.0],
        std=list(a.std) if a.normalize else [1.0, 1.0, 1.0],
        mirror=fn.random.coin_flip(probability=0.5) if a.train else 0,
    )


def _decode_and_crop(raw: Any, a: Augment, *, gpu: bool, jpeg: bool) -> Any:
    size = [a.size, a.size]
    if jpeg:
        decoder = "mixed" if gpu else "cpu"  # nvJPEG when there is a GPU
        if a.train:
            cropped = fn.decoders.image_random_crop(
                raw, device=decoder, output_type=types.RGB,
                random_area=list(a.scale), random_aspect_ratio=list(a.ratio))
            return fn.resize(cropped, size=size, antialias=True)
        images = fn.decoders.image(raw, device=decoder, output_type=types.RGB)
    else:
        images = raw.gpu() if gpu else raw  # lossless tiles: one host-to-device copy per batch
        if a.train:
            return fn.random_resized_crop(images, size=size, random_area=list(a.scale),
                                          random_aspect_ratio=list(a.ratio), antialias=True)
    return images if a.size == a.tile else fn.resize(images, size=size, antialias=True)
