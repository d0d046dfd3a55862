"""A plain numpy statement of the mask sampling, the oracle the torch implementation
(``pipeline.targets.masks`` and ``affine``) is held to bit for bit: one fancy-indexing gather per
batch for the framing, one per sample and op slot for a policy's moves, a comparison per sample
for the per-object masks, a lookup table for the renumbering."""

from __future__ import annotations

import numpy as np

from tilefeed.pipeline.targets.affine import Affines
from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.pipeline.targets.masks import source_indices
from tilefeed.pipeline.targets.objects import Objects


def transform_masks(framing: Framing, masks: np.ndarray, fill: int = 0) -> np.ndarray:
    """(n, S, S): the tiles through the framing with nearest sampling, then the flips."""
    ys = source_indices(framing, 0, masks.shape[1])
    xs = source_indices(framing, 1, masks.shape[2])
    ys = np.where(framing.vflip[:, None], ys[:, ::-1], ys)
    xs = np.where(framing.hflip[:, None], xs[:, ::-1], xs)
    n = np.arange(len(masks))[:, None, None]
    out = masks[n, ys.clip(0)[:, :, None], xs.clip(0)[:, None, :]]
    out[(ys[:, :, None] < 0) | (xs[:, None, :] < 0)] = fill
    return np.ascontiguousarray(out)


def instance_masks(ids: np.ndarray, objects: Objects) -> list[np.ndarray]:
    """Per sample, (k, S, S) 0/1: the pixels holding each surviving object's id."""
    out = []
    for i in range(len(objects)):
        wanted = objects.ids[objects.offsets[i]:objects.offsets[i + 1]] + 1
        out.append((ids[i][None, :, :] == wanted[:, None, None]).astype(np.uint8))
    return out


def remap_ids(ids: np.ndarray, objects: Objects) -> np.ndarray:
    """(n, S, S): sample ``i``'s ``m``-th kept object as ``m + 1``, dropped ones as 0."""
    table = np.zeros((len(objects), 256), dtype=np.uint8)
    rows = objects.samples()
    table[rows, objects.ids + 1] = (np.arange(len(rows)) - objects.offsets[rows] + 1).astype(np.uint8)
    return np.ascontiguousarray(table[np.arange(len(ids))[:, None, None], ids])


def affine_masks(masks: np.ndarray, affines: Affines, fill: int = 0) -> np.ndarray:
    """(n, H, W): each mask through its moved slots, nearest, ``fill`` outside the source."""
    out = masks.copy()
    n, h, w = masks.shape
    for i in range(n):
        for k in np.flatnonzero(affines.moved[i]).tolist():
            sx, sy = nearest(affines.matrices[i, k], h, w)
            inside = (sx >= 0) & (sx <= w - 1) & (sy >= 0) & (sy <= h - 1)
            warped = np.full((h, w), fill, dtype=masks.dtype)
            warped[inside] = out[i][sy[inside], sx[inside]]
            out[i] = warped
    return out


def nearest(matrix: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(h, w) source columns and rows, in the float32 steps of torchvision's ``_affine_grid``
    and ``grid_sample`` (nearest, ties to even)."""
    f = np.float32
    a = matrix[:, :2]
    centre = np.array([w * 0.5, h * 0.5])
    theta = np.concatenate([a, (matrix[:, 2] + a @ centre - centre)[:, None]], axis=1).astype(f)
    xs = np.arange(w, dtype=f) - f((w - 1) * 0.5)
    ys = np.arange(h, dtype=f) - f((h - 1) * 0.5)
    x, y = np.meshgrid(xs, ys)
    out = []
    for row, side in ((theta[0] / f(0.5 * w), w), (theta[1] / f(0.5 * h), h)):
        g = (x * row[0] + y * row[1]) + row[2]
        out.append(np.rint(((g + f(1)) * f(side) - f(1)) / f(2)).astype(np.int64))
    return out[0], out[1]
