"""Augmentation parameters as a function of the sample: crop windows and flips, on the host.

Each sample's random-resized-crop window and flip come from (seed, epoch, sample index) alone,
through the counter-based generator of ``pipeline.planning.counters``, so a run resumed
mid-epoch, or on another world size or batch size, sees exactly the crops an uninterrupted run
would. The window follows torchvision's ``RandomResizedCrop.get_params``: area fraction
uniform in ``scale``, aspect ratio log-uniform in ``ratio``, ten tries, then the centre fallback.
The graph then cuts and resizes on the device (DALI takes the windows as per-sample inputs).
SSD's IoU crop is drawn once with its windows, which objects it keeps beside them (``keep``,
read by the targets alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tilefeed.pipeline.planning.counters import uniforms
from tilefeed.store.errors import ConfigError
from tilefeed.pipeline.recipe.recipe import Crop
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.pipeline.targets.windows import (DrawnWindows, IoUCrop, ScaleJitter, ZoomOut, iou_crops, pasted,
                                               scale_jitter_windows, zoom_out_canvases)

# a store's boxes as the IoU crop draws against them: its object offsets (N + 1,) and rows (M, 6)
StoreObjects = tuple[np.ndarray, np.ndarray]

if TYPE_CHECKING:
    from tilefeed.pipeline.reading.mixed import MixedArray
    from tilefeed.pipeline.engine.augment import Augment

TRIES = 10
# what the graph takes besides the window for a crop that pads (``Crop.pads``): the window's
# part inside the picture, the output size it is resized to, and the slice's anchor that
# pastes it in place (minus its place)
PASTE_NAMES = ("cut_start", "cut_end", "cut_size", "paste_anchor")
_DRAWS = 4 * TRIES + 1  # per try: area, aspect, top, left; then the flip


@dataclass(frozen=True)
class Windows:
    """Per sample: crop window (top, left, height, width) in pixels of its image, and a flip."""

    top: np.ndarray
    left: np.ndarray
    height: np.ndarray
    width: np.ndarray
    flip: np.ndarray  # int32, 1 = mirror horizontally

    def roi(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) as float32 (n, 2) [y, x] pairs: what DALI's resize and slice take."""
        start = np.stack([self.top, self.left], axis=1).astype(np.float32)
        return start, start + np.stack([self.height, self.width], axis=1).astype(np.float32)


def random_resized_crops(seed: int, epoch: int, samples: np.ndarray, image_h: np.ndarray | int,
                         image_w: np.ndarray | int, scale: tuple[float, float],
                         ratio: tuple[float, float]) -> Windows:
    """torchvision's RandomResizedCrop.get_params for each sample, vectorised, plus a coin flip.

    ``image_h``/``image_w`` are each sample's image size (the valid box of its tile).
    """
    n = len(samples)
    u = uniforms(seed, epoch, samples, _DRAWS)
    h_img = np.broadcast_to(np.asarray(image_h, dtype=np.float64), (n,))
    w_img = np.broadcast_to(np.asarray(image_w, dtype=np.float64), (n,))
    area = (h_img * w_img)[:, None]
    tries = u[:, : 4 * TRIES].reshape(n, TRIES, 4)
    target = area * (scale[0] + (scale[1] - scale[0]) * tries[..., 0])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * tries[..., 1])
    w = np.rint(np.sqrt(target * aspect))
    h = np.rint(np.sqrt(target / aspect))
    ok = (w > 0) & (w <= w_img[:, None]) & (h > 0) & (h <= h_img[:, None])
    first = np.argmax(ok, axis=1)
    found = ok[np.arange(n), first]
    pick = np.arange(n), first
    height, width = h[pick], w[pick]
    top = np.floor(tries[..., 2][pick] * (h_img - height + 1))
    left = np.floor(tries[..., 3][pick] * (w_img - width + 1))
    if not found.all():  # torchvision's fallback: the whole image, clamped to the ratio range
        in_ratio = w_img / h_img
        fw = np.where(in_ratio > ratio[1], np.rint(h_img * ratio[1]), w_img)
        fh = np.where(in_ratio < ratio[0], np.rint(w_img / ratio[0]), h_img)
        miss = ~found
        height[miss], width[miss] = fh[miss], fw[miss]
        top[miss] = np.floor((h_img[miss] - fh[miss]) / 2)
        left[miss] = np.floor((w_img[miss] - fw[miss]) / 2)
    flip = (u[:, -1] < 0.5).astype(np.int32)
    return Windows(top.astype(np.int64), left.astype(np.int64), height.astype(np.int64),
                   width.astype(np.int64), flip)


def iou_windows(seed: int, epoch: int, samples: np.ndarray, keys: np.ndarray, pictures: np.ndarray,
                objects: StoreObjects | None, zoom: bool = False) -> DrawnWindows:
    """SSD's IoU-constrained crop (torchvision v2's ``RandomIoUCrop`` and its defaults) of each
    sample's picture, against its stored boxes, drawn from ``keys`` (the samples' positions):
    the windows, and which boxes they keep. With ``zoom``, of each picture's canvas after SSD's
    zoom-out (``RandomZoomOut``'s defaults)."""
    if objects is None:
        raise ConfigError(f"crop={'zoom_iou' if zoom else 'iou'!r} draws against each sample's stored boxes: "
                          "read a store made with boxes (--annotations or --yolo)")
    batch = Objects.gather(objects[0], objects[1], np.asarray(samples, dtype=np.int64))
    keyed = np.asarray(keys)
    if zoom:  # the canvas is a larger picture in tile pixels: the boxes keep their coordinates
        pictures = zoom_out_canvases(ZoomOut(), seed, epoch, keyed, pictures)
    return iou_crops(IoUCrop(), seed, epoch, keyed, pictures, batch)


def window_inputs(boxes: np.ndarray | MixedArray, a: Augment, seed: int, epoch: int,
                  samples: np.ndarray, keys: np.ndarray, size: int | None = None,
                  objects: StoreObjects | None = None,
                  iou: DrawnWindows | None = None) -> tuple[np.ndarray, ...]:
    """Per sample: crop window (start, end as float32 [y, x] in tile pixels) and flip, drawn
    from ``keys``, the samples' positions in the epoch (of one store, the samples themselves).

    ``boxes`` hold each tile's picture (top, left, height, width). Training: torchvision's
    random-resized crop of the picture (the same at every output size), or with a recipe's
    ``crop="none"`` the whole tile, or with ``crop="iou"`` SSD's IoU-constrained crop against
    the samples' stored boxes (``objects``: the store's object offsets and rows), with
    ``"zoom_iou"`` the same of each picture's zoomed-out canvas, with ``"lsj"`` large-scale
    jitter's cut (these two reach past the picture). Evaluation: its
    framing of the picture for output ``size`` (default the tile side: shorter side to
    ``size / crop_pct``, centre crop ``size``), no flip. ``iou``: the IoU crop's windows of these
    samples already drawn (``iou_windows``: ``frame_inputs`` draws them once, for the windows and
    the boxes they keep), taken as they are rather than drawn a second time.
    """
    top, left, height, width = boxes[samples].T
    if a.train:
        w = random_resized_crops(seed, epoch, keys, height, width, a.scale, a.ratio)
        if a.recipe is not None and a.recipe.crop is Crop.NONE:  # the whole tile; the same flips
            n = len(samples)
            return np.zeros((n, 2), np.float32), np.full((n, 2), a.tile, np.float32), w.flip
        if a.recipe is not None and a.recipe.crop.against_boxes:  # SSD's, against the stored boxes
            drawn = iou if iou is not None else iou_windows(seed, epoch, samples, keys, boxes[samples],
                                                            objects, zoom=a.recipe.crop is Crop.ZOOM_IOU)
            return drawn.start.astype(np.float32), drawn.end.astype(np.float32), w.flip
        if a.recipe is not None and a.recipe.crop is Crop.LSJ:  # ScaleJitter to the output side
            side = a.tile if size is None else size
            drawn = scale_jitter_windows(ScaleJitter((side, side)), seed, epoch, keys, boxes[samples], side)
            return drawn.start.astype(np.float32), drawn.end.astype(np.float32), w.flip
        start, end = w.roi()
        offset = np.stack([top, left], axis=1).astype(np.float32)
        return start + offset, end + offset, w.flip
    side = a.tile if size is None else size
    framed = np.minimum(height, width) * (side / a.resize_to(side))
    start = np.stack([top + (height - framed) / 2, left + (width - framed) / 2], axis=1)
    return (start.astype(np.float32), (start + framed[:, None]).astype(np.float32),
            np.zeros(len(samples), dtype=np.int32))


def frame_inputs(boxes: np.ndarray | MixedArray, a: Augment, seed: int, epoch: int, size: int,
                 samples: np.ndarray, keys: np.ndarray,
                 objects: StoreObjects | None = None) -> dict[str, np.ndarray]:
    """What the graph takes per sample to cut, frame and flip, for an epoch at ``size``, by name.

    With windows: ``start``, ``end``, ``flip`` and the output ``size`` [h, w], then for a crop
    that pads (``PASTE_NAMES``) the cut inside the picture, its output size and the paste's
    anchor, then for a crop against the stored boxes (``against_boxes``) its ``keep``: which of
    the samples' objects (concatenated in sample order) it keeps, one bool an object, for the
    targets. Without (evaluation framing of whole tiles by fixed ops): ``resize`` [h, w] and the
    centre ``crop`` [h, w]. The size travels as an input, so one graph serves every size.
    """
    n = len(samples)
    if not a.windows:
        return {"resize": np.full((n, 2), a.resize_to(size), np.float32),
                "crop": np.full((n, 2), size, np.float32)}
    # SSD's crop, drawn once: its windows frame the pixels, its keep marks the boxes
    zoom = a.recipe is not None and a.recipe.crop is Crop.ZOOM_IOU
    iou = iou_windows(seed, epoch, samples, keys, boxes[samples], objects, zoom) if against_boxes(a) else None
    start, end, flip = window_inputs(boxes, a, seed, epoch, samples, keys, size, objects, iou)
    framed = {"start": start, "end": end, "flip": flip, "size": np.full((n, 2), size, np.float32)}
    if pads(a):
        # the window's part inside the picture, resized to its share of the output, then
        # pasted in place on the fill (the slice's anchor is minus its place)
        cut = pasted(start, end, boxes[samples], size)
        paste = (cut.cut_start, cut.cut_end, cut.cut_size, -cut.place)
        framed.update(zip(PASTE_NAMES, (v.astype(np.float32) for v in paste), strict=True))
    if iou is not None:
        framed["keep"] = iou.keep
    return framed


def pads(a: Augment) -> bool:
    """``a``'s windows may reach past the picture: the graph pastes their part inside it on
    the recipe's fill (``Crop.pads``; training only)."""
    return a.windows and a.train and a.recipe is not None and a.recipe.crop.pads


def against_boxes(a: Augment) -> bool:
    """``a``'s windows are SSD's IoU crop, drawn against each sample's stored boxes
    (``Crop.against_boxes``; training only), which keeps some of its objects."""
    return a.windows and a.train and a.recipe is not None and a.recipe.crop.against_boxes
