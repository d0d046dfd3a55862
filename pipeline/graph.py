"""The DALI graph: batch source -> (nvJPEG) decode -> augment -> normalise, on the device."""

from __future__ import annotations

from typing import Any

from nvidia.dali import fn, pipeline_def, types

from tilefeed.pipeline.augment import Augment
from tilefeed.pipeline.source import BatchSource


def build_pipeline(source: BatchSource, augment: Augment, *, batch_size: int, threads: int,
                   device_id: int | None, prefetch: int, jpeg: bool) -> Any:
    gpu = device_id is not None
    resized = source.resize_to is not None  # then the source sends the flips alone, no windows
    crop_types = ([types.INT32] if resized else [types.FLOAT, types.FLOAT, types.INT32]) \
        if augment.windows else []

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=prefetch)  # no DALI randomness: crops come from the host
    def tiles() -> Any:
        raw, labels, indices, *crop = fn.external_source(
            source=source, num_outputs=3 + len(crop_types), batch=True,
            dtype=[types.UINT8, types.INT64, types.INT64, *crop_types],
            layout=[None if jpeg else "HWC", None, None, *[None] * len(crop_types)],
            no_copy=not source.dali_copies,
        )
        if not resized:
            raw = _decode_and_crop(raw, crop, augment, gpu=gpu, jpeg=jpeg)
        images = _finish(raw, crop, augment)
        if gpu:
            labels, indices = labels.gpu(), indices.gpu()
        return images, labels, indices

    return tiles()


def _finish(images: Any, crop: list[Any], a: Augment) -> Any:
    """Evaluation centre crop, flip, normalise, cast and lay out; uint8 eval output skips every
    per-pixel op it can."""
    centre = {} if a.windows or a.resize_to == a.size else {"crop": [a.size, a.size]}
    if a.passthrough:
        return fn.crop(images, **centre) if centre else images
    if not (a.normalize or a.windows or centre):
        return fn.transpose(images, perm=[2, 0, 1])  # uint8 NCHW: layout only
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT16 if a.half else (types.FLOAT if a.normalize else types.UINT8),
        output_layout="CHW" if a.channels_first else "HWC",
        mean=list(a.mean) if a.normalize else [0.0, 0.0, 0.0],
        std=list(a.std) if a.normalize else [1.0, 1.0, 1.0],
        mirror=crop[-1] if a.windows else 0,  # the flips come last
        **centre,
    )


def _decode_and_crop(raw: Any, crop: list[Any], a: Augment, *, gpu: bool, jpeg: bool) -> Any:
    size = [a.size, a.size]
    if a.windows:
        start, end = crop[0], crop[1]
        if jpeg:  # decode only the window (nvJPEG when there is a GPU)
            images = fn.decoders.image_slice(
                raw, start, end - start, axis_names="HW", normalized_anchor=False,
                normalized_shape=False, device="mixed" if gpu else "cpu", output_type=types.RGB,
                use_fast_idct=a.fast_idct)
            return fn.resize(images, size=size, antialias=True)
        images = raw.gpu() if gpu else raw  # lossless tiles: one host-to-device copy per batch
        return fn.resize(images, size=size, roi_start=start, roi_end=end, roi_relative=False,
                         antialias=True)
    if jpeg:
        images = fn.decoders.image(raw, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                   use_fast_idct=a.fast_idct)
    else:
        images = raw.gpu() if gpu else raw
    side = a.resize_to
    return images if side == a.tile else fn.resize(images, size=[side, side], antialias=True)
