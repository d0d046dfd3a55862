"""Masks through the Loader's geometry with nearest sampling, for a batch.

torchvision v2 resizes a ``Mask`` with ``nearest`` (``resized_crop`` ignores the filter it is
given for masks): output pixel ``j`` takes source pixel ``floor(j * in / out)``, the scale and
the product in float32 as torch's kernel computes them, capped at the last pixel. That sampling
is exact here, for crop windows and for the evaluation resize and centre crop (``Framing``);
it sits up to half a source pixel from the image's own resampling, which maps pixel centres,
exactly as torchvision's does. Instance masks hold ids (``k`` = the tile's object ``k - 1``):
the id map is resampled once, and each surviving object's binary mask follows from it.
"""

from __future__ import annotations

import numpy as np

from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError


def source_indices(framing: Framing, axis: int, tile: int) -> np.ndarray:
    """(n, size) int64: for each sample and output row (``axis`` 0) or column (1), the tile
    pixel nearest sampling reads, before any flip; -1 past the tile (padding).

    Parameters
    ----------
    framing : Framing
        One framing per sample; every output of the batch has the same size.
    axis : int
        0 for rows (y), 1 for columns (x).
    tile : int
        The tile's side (indices stay inside it).

    Returns
    -------
    numpy.ndarray
        Tile pixel indices.
    """
    side = _side(framing, axis)
    # torch's nearest_idx: scale = (float)in / out, src = min(floorf(dst * scale), in - 1)
    scale = (framing.region[:, axis].astype(np.float32) / framing.resized[:, axis].astype(np.float32))
    dst = np.arange(side, dtype=np.float32)[None, :] + framing.anchor[:, axis, None].astype(np.float32)
    product = (dst * scale[:, None]).astype(np.float32).astype(np.float64)
    origin = framing.origin[:, axis, None]
    last = np.ceil(origin + framing.region[:, axis, None]) - 1
    src = np.minimum(np.floor(origin + product), last)
    # past the resized region (a cut larger than it) or past the tile: padding
    outside = (dst < 0) | (dst >= framing.resized[:, axis, None]) | (src < 0) | (src > tile - 1)
    return np.where(outside, -1, src).astype(np.int64)


def _side(framing: Framing, axis: int) -> int:
    sides = np.unique(framing.size[:, axis])
    if len(sides) != 1 or sides[0] != int(sides[0]):
        raise ConfigError(f"masks: a batch's outputs share one whole-pixel size, got {sides.tolist()}")
    return int(sides[0])


def transform_masks(framing: Framing, masks: np.ndarray, fill: int = 0) -> np.ndarray:
    """A batch's mask tiles through its framing: torchvision's ``F.resized_crop`` of a
    ``tv_tensors.Mask`` (nearest), then its flips, for every sample at once; output pixels
    past the tile (a padded output) take ``fill``.

    Parameters
    ----------
    framing : Framing
        One framing per sample.
    masks : numpy.ndarray
        (n, T, T) uint8 mask tiles (semantic class ids, or instance ids).
    fill : int
        The value of pixels past the tile: 255 (ignore) for semantic masks, 0 (background)
        for instance ids; torchvision pads masks with 0.

    Returns
    -------
    numpy.ndarray
        (n, S, S) uint8, the outputs' masks.
    """
    masks = np.asarray(masks)
    if masks.ndim != 3 or len(masks) != len(framing):
        raise ConfigError(f"masks: expected ({len(framing)}, T, T) mask tiles, got {masks.shape}")
    ys = source_indices(framing, 0, masks.shape[1])
    xs = source_indices(framing, 1, masks.shape[2])
    ys = np.where(framing.vflip[:, None], ys[:, ::-1], ys)
    xs = np.where(framing.hflip[:, None], xs[:, ::-1], xs)
    n = np.arange(len(masks))[:, None, None]
    out = masks[n, ys.clip(0)[:, :, None], xs.clip(0)[:, None, :]]
    out[(ys[:, :, None] < 0) | (xs[:, None, :] < 0)] = fill
    return np.ascontiguousarray(out)


def instance_masks(ids: np.ndarray, objects: Objects) -> list[np.ndarray]:
    """Each sample's per-object binary masks from its (framed) instance-id map, for the objects
    that survived (``Objects.ids``; the map's value ``k`` is the tile's object ``k - 1``).

    Parameters
    ----------
    ids : numpy.ndarray
        (n, S, S) uint8 instance-id maps (``transform_masks`` of the store's instance masks).
    objects : Objects
        The batch's surviving boxes (``transform_boxes``), in the order the masks follow.

    Returns
    -------
    list of numpy.ndarray
        Per sample, (k, S, S) uint8 of 0 and 1, object by object.
    """
    if len(ids) != len(objects):
        raise ConfigError(f"instance masks: {len(ids)} id maps for {len(objects)} samples")
    out = []
    for i in range(len(objects)):
        wanted = objects.ids[objects.offsets[i]:objects.offsets[i + 1]] + 1
        out.append((ids[i][None, :, :] == wanted[:, None, None]).astype(np.uint8))
    return out


def remap_ids(ids: np.ndarray, objects: Objects) -> np.ndarray:
    """Instance-id maps renumbered for the surviving objects: sample ``i``'s ``m``-th kept
    object becomes ``m + 1``; the pixels of objects dropped by sanitising become 0 (background).

    Parameters
    ----------
    ids : numpy.ndarray
        (n, S, S) uint8 instance-id maps in the tile's numbering.
    objects : Objects
        The surviving boxes.

    Returns
    -------
    numpy.ndarray
        (n, S, S) uint8 in the kept objects' numbering.
    """
    if len(ids) != len(objects):
        raise ConfigError(f"instance ids: {len(ids)} id maps for {len(objects)} samples")
    table = np.zeros((len(objects), 256), dtype=np.uint8)
    rows = objects.samples()
    table[rows, objects.ids + 1] = (np.arange(len(rows)) - objects.offsets[rows] + 1).astype(np.uint8)
    return np.ascontiguousarray(table[np.arange(len(ids))[:, None, None], ids])
