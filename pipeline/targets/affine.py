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
import torch

from tilefeed.pipeline.targets.masks import MaskBatch, as_masks, to_device
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


def affine_masks(masks: MaskBatch, affines: Affines, fill: int = 0) -> torch.Tensor:
    """Each sample's mask through its geometric ops, slot after slot, with nearest sampling as
    torchvision's tensor kernel samples a ``Mask``: output pixel ``(x, y)`` takes the source
    pixel nearest to ``M (x + 0.5, y + 0.5) - 0.5`` (a tie rounds to even, as ``grid_sample``'s
    ``nearbyint``); outside the source, ``fill``.

    Parameters
    ----------
    masks : torch.Tensor or numpy.ndarray
        (n, H, W) uint8 masks in output pixels (class ids or instance ids), on any device.
    affines : Affines
        One row per sample.
    fill : int
        The value of output pixels whose source lies outside the mask.

    Returns
    -------
    torch.Tensor
        (n, H, W) uint8 on the masks' device.
    """
    if len(masks) != len(affines):
        raise ConfigError(f"affine_masks: expected ({len(affines)}, H, W) masks, got {tuple(masks.shape)}")
    out = as_masks(masks, len(affines), "affine_masks").clone()
    _, h, w = out.shape
    for k in range(affines.moved.shape[1]):  # slot after slot; the samples a slot moves at once
        rows = np.flatnonzero(affines.moved[:, k])
        if len(rows):
            out[to_device(rows, out.device)] = _warp(out[to_device(rows, out.device)],
                                                     affines.matrices[rows, k], fill)
    return out


def _warp(masks: torch.Tensor, matrices: np.ndarray, fill: int) -> torch.Tensor:
    """(m, H, W) masks, each through its own (2, 3) matrix with nearest sampling.

    Each source position is ``(x * r0 + y * r1) + r2`` per axis, in the float32 steps of
    torchvision's ``_affine_grid`` and ``grid_sample`` (centred coordinates, the matrix divided by
    the half sides, then unnormalised), so centres that land on a tie mostly round as there. The
    two products are (m, W) and (m, H) numbers worked out on the host (``_grid_terms``); their
    sums, the unnormalising, the rounding and the gather run on the masks' device. A position
    outside the source is clamped onto a one-pixel border of ``fill`` around it, which the
    gather then reads: no mask of the outside is formed."""
    m, h, w = masks.shape
    device = masks.device
    x_terms, y_terms, constants = (to_device(a, device) for a in _grid_terms(matrices, h, w))
    sides = torch.tensor([w, h], dtype=torch.float32, device=device).view(1, 2, 1, 1)
    grid = x_terms[:, :, None, :] + y_terms[:, :, :, None]  # (m, 2, H, W): x then y source
    grid.add_(constants[:, :, None, None]).add_(1.0).mul_(sides).sub_(1.0).div_(2.0)
    grid.round_()  # half to even, as np.rint and grid_sample's nearbyint
    bordered = torch.nn.functional.pad(masks, (1, 1, 1, 1), value=fill)
    wide = torch.int64 if m * (h + 2) * (w + 2) >= 2**31 else torch.int32
    sx = grid[:, 0].clamp_(-1.0, float(w)).to(wide).add_(1)
    sy = grid[:, 1].clamp_(-1.0, float(h)).to(wide).add_(1)
    base = torch.arange(m, dtype=wide, device=device).mul_((h + 2) * (w + 2)).view(m, 1, 1)
    index = sy.mul_(w + 2).add_(sx).add_(base)
    return bordered.reshape(-1).index_select(0, index.view(-1)).view(m, h, w)


def _grid_terms(matrices: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For (m, 2, 3) output-to-input matrices: (m, 2, W) float32 ``x * r0``, (m, 2, H)
    ``y * r1`` and (m, 2) ``r2``, per axis (source x, source y) the terms of ``_warp``'s
    positions, with ``x``, ``y`` the centred output coordinates and ``r`` the matrix's row in
    ``_affine_grid``'s normalised form."""
    f = np.float32
    xs = np.arange(w, dtype=f) - f((w - 1) * 0.5)
    ys = np.arange(h, dtype=f) - f((h - 1) * 0.5)
    centre = np.array([w * 0.5, h * 0.5])
    m = len(matrices)
    x_terms = np.empty((m, 2, w), f)
    y_terms = np.empty((m, 2, h), f)
    constants = np.empty((m, 2), f)
    for j, matrix in enumerate(matrices):
        a = matrix[:, :2]
        theta = np.concatenate([a, (matrix[:, 2] + a @ centre - centre)[:, None]], axis=1).astype(f)
        for axis, side in ((0, w), (1, h)):
            row = theta[axis] / f(0.5 * side)
            x_terms[j, axis], y_terms[j, axis], constants[j, axis] = xs * row[0], ys * row[1], row[2]
    return x_terms, y_terms, constants


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
