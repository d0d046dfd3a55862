"""Affines between source-image, tile and output pixels, and predictions mapped back.

Each affine is a row ``sx, sy, tx, ty`` with ``to = from * s + t`` per axis, the convention of
the store's ``frames`` (source -> tile) and of ``Framing.affines`` (tile -> output, flips as
negative scales). A model's boxes in output pixels go back to the source image through the
inverse of their composition: ``output_to_source``. Boxes stay XYXY through a negative scale
(a flip swaps the two corners back into order).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.store.errors import ConfigError


def _rows(affines: np.ndarray) -> np.ndarray:
    a = np.asarray(affines, dtype=np.float64)
    if a.shape[-1] != 4:
        raise ConfigError(f"an affine is a row sx, sy, tx, ty; got shape {a.shape}")
    return a.reshape(-1, 4)


def compose(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """The affine applying ``first``, then ``then`` (row by row, or one row broadcast).

    Parameters
    ----------
    first, then : numpy.ndarray
        (n, 4) or (4,) rows ``sx, sy, tx, ty``.

    Returns
    -------
    numpy.ndarray
        (n, 4) float64.
    """
    a, b = np.broadcast_arrays(_rows(first), _rows(then))
    return np.concatenate([a[:, :2] * b[:, :2], a[:, 2:] * b[:, :2] + b[:, 2:]], axis=1)


def invert(affines: np.ndarray) -> np.ndarray:
    """The inverse affines: ``from = (to - t) / s``.

    Parameters
    ----------
    affines : numpy.ndarray
        (n, 4) or (4,) rows with nonzero scales.

    Returns
    -------
    numpy.ndarray
        (n, 4) float64.
    """
    a = _rows(affines)
    if np.any(a[:, :2] == 0):
        raise ConfigError("an affine with a zero scale has no inverse")
    return np.concatenate([1.0 / a[:, :2], -a[:, 2:] / a[:, :2]], axis=1)


def map_boxes(boxes: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """XYXY ``boxes`` (k, 4) through one affine (4,), corners reordered where a scale is negative.

    Parameters
    ----------
    boxes : numpy.ndarray
        (k, 4) XYXY.
    affine : numpy.ndarray
        (4,) ``sx, sy, tx, ty``.

    Returns
    -------
    numpy.ndarray
        (k, 4) float64 XYXY.
    """
    sx, sy, tx, ty = _rows(affine)[0]
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x = b[:, 0::2] * sx + tx
    y = b[:, 1::2] * sy + ty
    return np.stack([x.min(axis=1), y.min(axis=1), x.max(axis=1), y.max(axis=1)], axis=1)


def source_to_output(framing: Framing, frames: np.ndarray) -> np.ndarray:
    """(n, 4): per sample, source-image pixels -> output pixels: the store's ``frames`` (the
    batch's rows), then the framing.

    Parameters
    ----------
    framing : Framing
        The batch's framing (``Framing.centre`` or ``Framing.windows`` in evaluation).
    frames : numpy.ndarray
        (n, 4) the store's ``frames`` rows of the batch's tiles.

    Returns
    -------
    numpy.ndarray
        (n, 4) float64 affines.
    """
    frames = _rows(frames)
    if len(frames) != len(framing):
        raise ConfigError(f"{len(frames)} frames for {len(framing)} framings")
    return compose(frames, framing.affines())


def output_to_source(framing: Framing, frames: np.ndarray) -> np.ndarray:
    """(n, 4): per sample, output pixels -> source-image pixels, what maps a model's
    predictions back to the image they came from (the inverse of ``source_to_output``).

    Parameters
    ----------
    framing : Framing
        The batch's framing.
    frames : numpy.ndarray
        (n, 4) the store's ``frames`` rows of the batch's tiles.

    Returns
    -------
    numpy.ndarray
        (n, 4) float64 affines.
    """
    return invert(source_to_output(framing, frames))


def boxes_to_source(boxes: Sequence[np.ndarray], framing: Framing, frames: np.ndarray) -> list[np.ndarray]:
    """Each sample's predicted boxes (XYXY, output pixels) in its source image's pixels.

    Parameters
    ----------
    boxes : sequence of array-like
        Per sample, (k, 4) boxes (numpy arrays or CPU tensors, e.g. a detection model's
        ``boxes``).
    framing : Framing
        The batch's framing.
    frames : numpy.ndarray
        (n, 4) the store's ``frames`` rows of the batch's tiles.

    Returns
    -------
    list of numpy.ndarray
        Per sample, (k, 4) float64 XYXY in source pixels.
    """
    back = output_to_source(framing, frames)
    if len(boxes) != len(back):
        raise ConfigError(f"{len(boxes)} samples of boxes for {len(back)} framings")
    return [map_boxes(np.asarray(b, dtype=np.float64), back[i]) for i, b in enumerate(boxes)]
