"""Boxes and masks through an auto-augment policy's geometric ops (shears, translations and
rotations), as torchvision v2's ``affine`` and ``rotate`` move ``BoundingBoxes`` and ``Mask``.

The policy gives each sample, per op slot, the 2x3 map from output to input pixel coordinates
(origin at the first pixel's corner) that its image is warped by. Boxes take the inverse map:
each box's four corners move, the box becomes the one enclosing them, clamped to the image
(torchvision's ``_affine_bounding_boxes_with_expand`` without expansion, then its clamp).
Masks are resampled as torchvision's tensor kernel resamples a ``Mask`` (``grid_sample``,
nearest, in its float32 steps): each output pixel's centre is mapped into the source and takes
the nearest source pixel; a centre that lands outside the source takes the fill. Where a centre
lands on a tie between two source pixels (a 45 degree turn's diagonal, every fifth row of a
0.2 shear), torchvision's float32 rounding decides, and its matrix multiply's summation order
is not reproduced: such pixels may take the other neighbour (tested: at most a few percent of
a mask, each at a tie).

torchvision's policies themselves (``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``)
refuse boxes and masks; these are the moves its functional kernels make with the arguments
those policies pass for the image, so boxes and masks stay on the pixels they describe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError


@dataclass(frozen=True)
class Affines:
    """Per sample, the geometric ops a policy applies after the crop and resize, in order.

    Attributes
    ----------
    matrices : numpy.ndarray
        (n, slots, 2, 3) float64: per op slot, the map from output to input pixel coordinates
        (origin at the first pixel's corner), what the image is warped by.
    moved : numpy.ndarray
        (n, slots) bool: the slot's op is geometric (others leave boxes and masks alone).
    """

    matrices: np.ndarray
    moved: np.ndarray

    def __post_init__(self) -> None:
        if self.matrices.ndim != 4 or self.matrices.shape[2:] != (2, 3) or \
                self.moved.shape != self.matrices.shape[:2]:
            raise ConfigError(f"affines: (n, slots, 2, 3) matrices with (n, slots) flags, got "
                              f"{self.matrices.shape} and {self.moved.shape}")

    @classmethod
    def of(cls, matrices: np.ndarray, moved: np.ndarray) -> Affines:
        """Affines from the policy's drawn matrices (any float dtype, as sent to the graph).

        Parameters
        ----------
        matrices : numpy.ndarray
            (n, slots, 2, 3) output-to-input maps.
        moved : numpy.ndarray
            (n, slots), nonzero where the slot's op is geometric.

        Returns
        -------
        Affines
            float64 matrices, bool flags.
        """
        m = np.asarray(matrices, dtype=np.float64)
        return cls(m, np.asarray(moved).astype(bool).reshape(m.shape[:2]))

    def __len__(self) -> int:
        """The number of samples."""
        return len(self.matrices)

    def forward(self, i: int, k: int) -> np.ndarray:
        """Sample ``i``'s slot ``k`` as the 2x3 map from input to output pixel coordinates.

        Parameters
        ----------
        i, k : int
            Sample and op slot.

        Returns
        -------
        numpy.ndarray
            (2, 3) float64, the inverse of ``matrices[i, k]``.
        """
        square = np.vstack([self.matrices[i, k], [0.0, 0.0, 1.0]])
        return np.linalg.inv(square)[:2]


def affine_boxes(objects: Objects, affines: Affines, size: np.ndarray) -> Objects:
    """Each sample's boxes through its geometric ops, slot after slot: corners moved, the
    enclosing box, clamped to the output (torchvision v2's ``affine`` and ``rotate`` on
    ``BoundingBoxes``). Nothing is removed: sanitising comes after the whole chain.

    Parameters
    ----------
    objects : Objects
        The batch's boxes (XYXY) in output pixels, after the crop and resize.
    affines : Affines
        One row per sample.
    size : numpy.ndarray
        (n, 2) [h, w] of each output.

    Returns
    -------
    Objects
        The same rows, moved.
    """
    if len(affines) != len(objects):
        raise ConfigError(f"affine_boxes: {len(affines)} affines for {len(objects)} samples")
    b = objects.boxes.astype(np.float64, copy=True)
    size = np.asarray(size, dtype=np.float64)
    for i in range(len(objects)):
        rows = slice(int(objects.offsets[i]), int(objects.offsets[i + 1]))
        if rows.start == rows.stop:
            continue
        h, w = size[i]
        for k in np.flatnonzero(affines.moved[i]).tolist():
            a = affines.forward(i, k)
            x0, y0, x1, y1 = b[rows].T
            # top-left, top-right, bottom-right, bottom-left, as torchvision lists them
            xs = np.stack([x0, x1, x1, x0], axis=1)
            ys = np.stack([y0, y0, y1, y1], axis=1)
            px = a[0, 0] * xs + a[0, 1] * ys + a[0, 2]
            py = a[1, 0] * xs + a[1, 1] * ys + a[1, 2]
            moved = np.stack([px.min(axis=1), py.min(axis=1), px.max(axis=1), py.max(axis=1)], axis=1)
            b[rows] = np.clip(moved, 0.0, [w, h, w, h])
    return objects.with_boxes(b)


def affine_masks(masks: np.ndarray, affines: Affines, fill: int = 0) -> np.ndarray:
    """Each sample's mask through its geometric ops, slot after slot, with nearest sampling as
    torchvision's tensor kernel samples a ``Mask``: output pixel ``(x, y)`` takes the source
    pixel nearest to ``M (x + 0.5, y + 0.5) - 0.5`` (a tie rounds to even, as ``grid_sample``'s
    ``nearbyint``); outside the source, ``fill``.

    Parameters
    ----------
    masks : numpy.ndarray
        (n, H, W) uint8 masks in output pixels (class ids or instance ids).
    affines : Affines
        One row per sample.
    fill : int
        The value of output pixels whose source lies outside the mask.

    Returns
    -------
    numpy.ndarray
        (n, H, W) uint8.
    """
    masks = np.asarray(masks)
    if masks.ndim != 3 or len(masks) != len(affines):
        raise ConfigError(f"affine_masks: expected ({len(affines)}, H, W) masks, got {masks.shape}")
    out = masks.copy()
    n, h, w = masks.shape
    for i in range(n):
        for k in np.flatnonzero(affines.moved[i]).tolist():
            sx, sy = _nearest(affines.matrices[i, k], h, w)
            inside = (sx >= 0) & (sx <= w - 1) & (sy >= 0) & (sy <= h - 1)
            warped = np.full((h, w), fill, dtype=masks.dtype)
            warped[inside] = out[i][sy[inside], sx[inside]]
            out[i] = warped
    return out


def _nearest(matrix: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(h, w) int64 source columns and rows nearest sampling reads for each output pixel, in
    the float32 steps of torchvision's ``_affine_grid`` and ``grid_sample`` (centred
    coordinates, the matrix divided by the half sides, then unnormalised), so pixel centres that
    land on a tie mostly round as there."""
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


def hflip_boxes(objects: Objects, hflip: np.ndarray, size: np.ndarray) -> Objects:
    """Boxes mirrored left to right where ``hflip`` (torchvision's ``horizontal_flip``).

    Parameters
    ----------
    objects : Objects
        Boxes in output pixels.
    hflip : numpy.ndarray
        (n,) bool per sample.
    size : numpy.ndarray
        (n, 2) [h, w] of each output.

    Returns
    -------
    Objects
        The same rows, mirrored where flipped.
    """
    rows = objects.samples()
    flip = np.asarray(hflip, dtype=bool)[rows]
    w = np.asarray(size, dtype=np.float64)[rows, 1]
    b = objects.boxes.astype(np.float64, copy=True)
    b[flip, 0], b[flip, 2] = w[flip] - b[flip, 2], w[flip] - b[flip, 0]
    return objects.with_boxes(b)
