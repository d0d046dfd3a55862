"""Masks through the Loader's geometry with nearest sampling, for a batch, on the masks' device.

torchvision v2 resizes a ``Mask`` with ``nearest`` (``resized_crop`` ignores the filter it is
given for masks): output pixel ``j`` takes source pixel ``floor(j * in / out)``, the scale and
the product in float32 as torch's kernel computes them, capped at the last pixel. That sampling
is exact here, for crop windows and for the evaluation resize and centre crop (``Framing``);
it sits up to half a source pixel from the image's own resampling, which maps pixel centres,
exactly as torchvision's does. Instance masks hold ids (``k`` = the tile's object ``k - 1``):
the id map is resampled once, and each surviving object's binary mask follows from it.

Which pixel each output row and column reads (``source_indices``) is worked out on the host,
(n, S) numbers a batch; the gathers, fills, renumbering and per-object masks are torch
operations on the tensors' own device (a GPU Loader's side stream, or the host's cores), one
implementation for both. Each avoids what is slow on the host: rows are gathered as whole rows,
columns with one ``gather``; pixels past the tile are filled by a multiply and add with a 0/1
row or column mask, and per-object masks come from a subtraction compared in place, never
through a boolean tensor of the whole batch.
"""

from __future__ import annotations

import numpy as np
import torch

from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import MAX_MASK_OBJECTS

MaskBatch = torch.Tensor | np.ndarray  # (n, H, W) uint8, a tensor on any device or a host array


def as_masks(masks: MaskBatch, n: int, what: str) -> torch.Tensor:
    """``masks`` as a (n, H, W) uint8 tensor (a host array is shared, not copied).

    Parameters
    ----------
    masks : torch.Tensor or numpy.ndarray
        The masks.
    n : int
        The samples they must hold.
    what : str
        The operation, for the error.

    Returns
    -------
    torch.Tensor
        On the device ``masks`` was on (the host for an array).
    """
    tensor = torch.from_numpy(np.ascontiguousarray(masks)) if isinstance(masks, np.ndarray) else masks
    if tensor.ndim != 3 or len(tensor) != n or tensor.dtype != torch.uint8:
        raise ConfigError(f"{what}: expected ({n}, H, W) uint8 masks, got {tuple(tensor.shape)} {tensor.dtype}")
    return tensor


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on ``device``, queued on its current stream (a host array as is)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


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


def fill_outside(out: torch.Tensor, inside: np.ndarray, fill: int, axis: int) -> None:
    """Set, in place, the rows (``axis`` 1) or columns (2) of ``out`` (n, H, W) uint8 that
    ``inside`` (n, H or W) marks False to ``fill``: a multiply by 0/1 and an add of 0/fill,
    exact in uint8."""
    if inside.all():
        return
    shape = (len(out), -1, 1) if axis == 1 else (len(out), 1, -1)
    keep = inside.astype(np.uint8)
    out.mul_(to_device(keep, out.device).view(shape))
    if fill:
        out.add_(to_device((1 - keep) * np.uint8(fill), out.device).view(shape))


def transform_masks(framing: Framing, masks: MaskBatch, fill: int = 0) -> torch.Tensor:
    """A batch's mask tiles through its framing: torchvision's ``F.resized_crop`` of a
    ``tv_tensors.Mask`` (nearest), then its flips, for every sample at once; output pixels
    past the tile (a padded output) take ``fill``.

    Parameters
    ----------
    framing : Framing
        One framing per sample.
    masks : torch.Tensor or numpy.ndarray
        (n, T, T) uint8 mask tiles (semantic class ids, or instance ids), on any device.
    fill : int
        The value of pixels past the tile: 255 (ignore) for semantic masks, 0 (background)
        for instance ids; torchvision pads masks with 0.

    Returns
    -------
    torch.Tensor
        (n, S, S) uint8 on the masks' device, the outputs' masks.
    """
    tiles = as_masks(masks, len(framing), "masks")
    n, t_h, t_w = tiles.shape
    ys = source_indices(framing, 0, t_h)
    xs = source_indices(framing, 1, t_w)
    ys = np.where(framing.vflip[:, None], ys[:, ::-1], ys)
    xs = np.where(framing.hflip[:, None], xs[:, ::-1], xs)
    device = tiles.device
    # whole rows first (a copy of each row read), then each row's columns
    rows = (np.arange(n)[:, None] * t_h + ys.clip(0)).reshape(-1)
    picked = tiles.reshape(n * t_h, t_w).index_select(0, to_device(rows, device)).view(n, -1, t_w)
    columns = to_device(xs.clip(0), device)[:, None, :].expand(n, picked.shape[1], -1)
    out = torch.gather(picked, 2, columns)
    fill_outside(out, ys >= 0, fill, 1)
    fill_outside(out, xs >= 0, fill, 2)
    return out


def instance_masks(ids: MaskBatch, objects: Objects) -> list[torch.Tensor]:
    """Each sample's per-object binary masks from its (framed) instance-id map, for the objects
    that survived (``Objects.ids``; the map's value ``k`` is the tile's object ``k - 1``).

    Parameters
    ----------
    ids : torch.Tensor or numpy.ndarray
        (n, S, S) uint8 instance-id maps (``transform_masks`` of the store's instance masks).
    objects : Objects
        The batch's surviving boxes (``transform_boxes``), in the order the masks follow.

    Returns
    -------
    list of torch.Tensor
        Per sample, (k, S, S) uint8 of 0 and 1, object by object, on the maps' device.
    """
    if len(ids) != len(objects):
        raise ConfigError(f"instance masks: {len(ids)} id maps for {len(objects)} samples")
    maps = as_masks(ids, len(objects), "instance masks")
    wanted = to_device(_wanted(objects.ids), maps.device)
    offsets = objects.offsets.tolist()
    # (map - id) == 0 in place on uint8: a comparison into bool is several times slower on the host
    return [maps[i].unsqueeze(0).sub(wanted[offsets[i]:offsets[i + 1]].view(-1, 1, 1)).eq_(0)
            for i in range(len(objects))]


def _wanted(ids: np.ndarray) -> np.ndarray:
    """The map values of objects ``ids`` (``id + 1``) as uint8: a tile with instance masks holds
    at most ``MAX_MASK_OBJECTS`` objects, so they fit."""
    if len(ids) and int(ids.max()) >= MAX_MASK_OBJECTS:
        raise ConfigError(f"instance masks: object {int(ids.max())} of a tile, more than its masks can hold "
                          f"({MAX_MASK_OBJECTS})")
    return (ids + 1).astype(np.uint8)


def remap_ids(ids: MaskBatch, objects: Objects) -> torch.Tensor:
    """Instance-id maps renumbered for the surviving objects: sample ``i``'s ``m``-th kept
    object becomes ``m + 1``; the pixels of objects dropped by sanitising become 0 (background).

    Parameters
    ----------
    ids : torch.Tensor or numpy.ndarray
        (n, S, S) uint8 instance-id maps in the tile's numbering.
    objects : Objects
        The surviving boxes.

    Returns
    -------
    torch.Tensor
        (n, S, S) uint8 in the kept objects' numbering, on the maps' device.
    """
    if len(ids) != len(objects):
        raise ConfigError(f"instance ids: {len(ids)} id maps for {len(objects)} samples")
    maps = as_masks(ids, len(objects), "instance ids")
    n = len(objects)
    table = np.zeros((n, 256), dtype=np.uint8)  # per sample, old id -> new id
    rows = objects.samples()
    table[rows, _wanted(objects.ids)] = (np.arange(len(rows)) - objects.offsets[rows] + 1).astype(np.uint8)
    # one lookup in the batch's tables; an int32 index (int64 costs twice the memory traffic)
    index = maps.to(torch.int32)
    index.add_(to_device(np.arange(n, dtype=np.int32) * 256, maps.device).view(n, 1, 1))
    return to_device(table, maps.device).view(-1).index_select(0, index.view(-1)).view(maps.shape)
