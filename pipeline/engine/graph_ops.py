"""The DALI pipeline of a graph: batch source -> (nvJPEG) decode -> augment -> normalise, on the device.

One graph for both devices: with a GPU it decodes with nvJPEG and works on the device; in the
device shape on a CPU machine (``TILEFEED_DEVICE_GRAPH=1``) the very same operators run on
DALI's CPU backend. Only the decoder's device and the lossless tiles' upload differ
(``engine.cuda``); labels and indices stay on the host, where the hand-over reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nvidia.dali import fn, pipeline_def, types

from tilefeed.pipeline.engine import cuda
from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.batch_source import BatchSource
from tilefeed.pipeline.recipe import ops
from tilefeed.pipeline.engine import operations

# the numpy dtypes the operations declare their inputs in, as DALI's types
DALI_TYPES = {np.dtype(np.int32): types.INT32, np.dtype(np.float32): types.FLOAT}


def build_pipeline(source: BatchSource, augment: Augment, *, batch_size: int, threads: int,
                   device_id: int | None, prefetch: int, jpeg: bool) -> Any:
    """The graph, for every output size: sizes arrive per sample with the windows and flips."""
    gpu = device_id is not None
    names = source.graph_names
    # each input as its operation declares it (``operations.inputs``)
    declared = operations.inputs(augment)
    kinds = {name: DALI_TYPES[declared[name].dtype] for name in names}
    # evaluation: the filter alone; on the host-resize path the batch source applies the
    # recipe's pixel operations (recipe.host_ops) and the graph only flips and normalises
    recipe = augment.recipe if augment.train and not (source.host_resize and augment.windows) else None

    # no DALI randomness: crops and every recipe parameter come from the host; conditionals
    # only where colour jitter or the photometric distortion picks each sample's order of
    # adjustments or a policy its ops
    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=prefetch, enable_conditionals=ops.conditional(recipe, augment.train))
    def tiles() -> Any:
        raw, labels, indices, *extras = fn.external_source(
            source=source, num_outputs=3 + len(names), batch=True,
            dtype=[types.UINT8, types.INT64, types.INT64, *(kinds[n] for n in names)],
            layout=[None if jpeg else "HWC", None, None, *[None] * len(names)],
            no_copy=not source.dali_copies,
        )
        # by position: as many as num_outputs (AutoGraph, with conditionals on, has no zip(strict=))
        inputs = {name: extras[k] for k, name in enumerate(names)}
        if not source.host_resize:  # else the pixels arrive cut and resized to the epoch's size
            raw = _decode_and_resize(raw, inputs, augment, gpu=gpu, jpeg=jpeg)
        if recipe is not None:  # on the uint8 pixels at the output size, before normalising
            raw = ops.apply(raw, inputs, recipe)
        if "paste_anchor" in inputs:  # a window past the picture: its part inside, pasted on the fill
            raw = paste(raw, inputs, augment.recipe.fill if augment.recipe is not None else (0, 0, 0))
        return _finish(raw, inputs, augment), labels, indices

    return tiles()


def _finish(images: Any, inputs: dict[str, Any], a: Augment) -> Any:
    """Evaluation centre crop (its size an input), flip, normalise, cast and lay out; uint8
    eval output skips every per-pixel op it can."""
    centre = {} if a.windows else {"crop": inputs["crop"]}
    if a.passthrough:
        return fn.crop(images, **centre)
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT16 if a.half else (types.FLOAT if a.normalize else types.UINT8),
        output_layout="CHW" if a.channels_first else "HWC",
        mean=list(a.mean) if a.normalize else [0.0, 0.0, 0.0],
        std=list(a.std) if a.normalize else [1.0, 1.0, 1.0],
        mirror=inputs["flip"] if a.windows else 0,
        **centre,
    )


def _decode_and_resize(raw: Any, inputs: dict[str, Any], a: Augment, *, gpu: bool, jpeg: bool) -> Any:
    """Each tile decoded whole (nvJPEG with a GPU; chroma upsampled as libjpeg-turbo and PIL do
    it, where nvJPEG's default differs) or uploaded, then its window resized to its output size.

    The window is cut by the resize (``roi_start``/``roi_end``, fractional) on JPEG tiles as on
    lossless ones: the decoder's own window (``image_slice``) rounds a fractional window to
    whole pixels and, at whole pixels too, decodes its edges apart from a whole decode (0.55
    levels from the host shape on training crops, against 0.2), so pixels would sit off the
    boxes and masks placed on the same window."""
    # a recipe's filter per sample (DALI's interp codes, sent as int32); else DALI's default, linear
    filters = ({"interp_type": fn.reinterpret(inputs["interp"], dtype=types.INTERP_TYPE)}
               if "interp" in inputs else {})
    images = (fn.decoders.image(raw, device=cuda.decoder(gpu), output_type=types.RGB, use_fast_idct=a.fast_idct,
                                jpeg_fancy_upsampling=True)
              if jpeg else cuda.upload(raw, gpu))
    if not a.windows:  # at the tile's own size this is the identity, pixel for pixel (so is the centre crop)
        return fn.resize(images, size=inputs["resize"], antialias=True, **filters)
    if "cut_start" in inputs:  # a window past the picture: only its part inside it, at its share
        start, end, size = inputs["cut_start"], inputs["cut_end"], inputs["cut_size"]
    else:
        start, end, size = inputs["start"], inputs["end"], inputs["size"]
    return fn.resize(images, size=size, roi_start=start, roi_end=end, roi_relative=False, antialias=True,
                     **filters)


def paste(images: Any, inputs: dict[str, Any], fill: tuple[int, int, int]) -> Any:
    """Each sample's resized cut (``cut_size``) on an output of ``size`` filled with ``fill``,
    at its place: a slice from ``paste_anchor`` (minus the place, so negative) of ``size``,
    padding what lies past the cut (torchvision pads with the fill after resizing the
    picture: no fill blends into the picture's edge)."""
    return fn.slice(images, inputs["paste_anchor"], inputs["size"], axis_names="HW", normalized_anchor=False,
                    normalized_shape=False, out_of_bounds_policy="pad", fill_values=[float(v) for v in fill])
