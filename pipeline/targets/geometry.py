"""Boxes through the Loader's geometry: each sample's framing of its tile, then clamping and
sanitising as torchvision v2's ``ClampBoundingBoxes`` and ``SanitizeBoundingBoxes``.

A ``Framing`` says, per sample, which part of its tile the output shows and how: the tile
shifted by ``origin`` (tile pixels), scaled from ``region`` tile pixels to ``resized`` output
pixels, shifted by ``anchor`` (output pixels, the evaluation centre crop), cut to ``size``,
then flipped. Training (and evaluation of tiles with padding) frames a window: origin = the
window's start, region = its extent, resized = size, anchor = 0, torchvision's
``F.resized_crop``; evaluation of whole tiles resizes the tile and centre-crops it, as the
graph does (DALI's anchor, ``(resized - size) / 2`` rounded half up; torchvision's
``center_crop`` rounds half to even). The operations run in torchvision's order with its
float rounding (the resize ratio as a float32, what ``resize_bounding_boxes`` multiplies by),
so which boxes survive matches it box for box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError


def _pairs(value: np.ndarray | float, n: int) -> np.ndarray:
    """(n, 2) float64 [y, x] from a scalar (a square), an (n,) array (squares) or (n, 2) pairs."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim == 0:
        return np.full((n, 2), float(a))
    if a.ndim == 1:
        return np.repeat(a.reshape(n)[:, None], 2, axis=1)
    return a.reshape(n, 2).copy()


def _bits(value: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n, dtype=bool) if value is None else np.broadcast_to(np.asarray(value) != 0, (n,)).copy()


@dataclass(frozen=True)
class Framing:
    """Per sample, the part of its tile an output shows, and its flips.

    Output pixel coordinates follow from tile pixel coordinates as
    ``(tile - origin) * resized / region - anchor``, in ``[0, size]``, then mirrored where
    flipped. All arrays are (n, 2) [y, x] pairs, float64, except the flips, (n,) bool.

    Attributes
    ----------
    origin : numpy.ndarray
        Tile pixels subtracted first (the window's start; 0 for a whole tile).
    region : numpy.ndarray
        Tile pixels that map onto ``resized`` output pixels (the window's extent; the tile side).
    resized : numpy.ndarray
        Output pixels ``region`` becomes (the output size; the side before a centre crop).
    anchor : numpy.ndarray
        Output pixels cut off at the top and left after resizing (the centre crop's offset).
    size : numpy.ndarray
        The output's height and width.
    hflip : numpy.ndarray
        Mirrored left to right.
    vflip : numpy.ndarray
        Mirrored top to bottom.
    """

    origin: np.ndarray
    region: np.ndarray
    resized: np.ndarray
    anchor: np.ndarray
    size: np.ndarray
    hflip: np.ndarray
    vflip: np.ndarray

    @classmethod
    def windows(cls, start: np.ndarray, end: np.ndarray, size: np.ndarray | int,
                hflip: np.ndarray | None = None, vflip: np.ndarray | None = None) -> Framing:
        """Crop windows resized to ``size``: what the graph does with ``crops.window_inputs``.

        Parameters
        ----------
        start, end : numpy.ndarray
            (n, 2) [y, x] window corners in tile pixels, as the graph takes them (float32 is
            fine: the values are used as sent). Training windows are whole pixels; evaluation
            windows of tiles with padding may be fractional.
        size : int or numpy.ndarray
            The output side, (n,) sides, or (n, 2) [h, w] sizes (``frame_inputs``' ``size``).
        hflip, vflip : numpy.ndarray, optional
            (n,) per sample, nonzero = mirrored: the flip the graph receives (``graph_inputs``'
            third input, which a recipe's ``hflip`` may have replaced) and the recipe's ``vflip``.

        Returns
        -------
        Framing
            One framing per window.
        """
        start = np.asarray(start, dtype=np.float64).reshape(-1, 2)
        n = len(start)
        size2 = _pairs(size, n)
        return cls(start, np.asarray(end, dtype=np.float64).reshape(n, 2) - start, size2, np.zeros((n, 2)),
                   size2, _bits(hflip, n), _bits(vflip, n))

    @classmethod
    def centre(cls, n: int, tile: int, resized: int, size: int) -> Framing:
        """Evaluation of whole tiles: each ``tile`` square resized to ``resized`` and centre-cropped
        to ``size`` (``Augment.resize_to(size)`` gives ``resized``), as the graph's fixed ops do.

        Parameters
        ----------
        n : int
            Samples.
        tile : int
            The store's tile side.
        resized : int
            The side the tile is resized to.
        size : int
            The output side.

        Returns
        -------
        Framing
            ``n`` equal framings.
        """
        if size > resized:
            raise ConfigError(f"eval framing: size {size} is larger than the resized side {resized}")
        anchor = np.floor((resized - size) * 0.5 + 0.5)  # DALI's crop rounds the anchor half up
        return cls(np.zeros((n, 2)), np.full((n, 2), float(tile)), np.full((n, 2), float(resized)),
                   np.full((n, 2), anchor), np.full((n, 2), float(size)), np.zeros(n, bool), np.zeros(n, bool))

    def __len__(self) -> int:
        """The number of samples."""
        return len(self.origin)

    def ratio(self) -> np.ndarray:
        """(n, 2) [y, x] output pixels per tile pixel, rounded to float32 as torchvision's
        ``resize_bounding_boxes`` multiplies by it (so removal decisions agree at the margin)."""
        return (self.resized / self.region).astype(np.float32).astype(np.float64)

    def affines(self) -> np.ndarray:
        """(n, 4) ``sx, sy, tx, ty``: output = tile * s + t, flips included (negative scales).

        Returns
        -------
        numpy.ndarray
            float64 rows, the same convention as the store's ``frames``.
        """
        r = self.ratio()
        s = r[:, ::-1].copy()  # [x, y]
        t = (-self.origin * r - self.anchor)[:, ::-1].copy()
        flips = np.stack([self.hflip, self.vflip], axis=1)
        size = self.size[:, ::-1]
        s = np.where(flips, -s, s)
        t = np.where(flips, size - t, t)
        return np.concatenate([s, t], axis=1)

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end): (n, 2) float64 [y, x], the part of the tile the output shows, as a crop
        window for the graph (fractional, and past the tile where the output is padded).

        Returns
        -------
        tuple of numpy.ndarray
            The window's corners in tile pixels.
        """
        per_pixel = self.region / self.resized  # tile pixels per output pixel
        start = self.origin + self.anchor * per_pixel
        return start, start + self.size * per_pixel

    def select(self, rows: np.ndarray) -> Framing:
        """The framings of ``rows`` (an index array, one entry per returned framing)."""
        return Framing(self.origin[rows], self.region[rows], self.resized[rows], self.anchor[rows],
                       self.size[rows], self.hflip[rows], self.vflip[rows])


def frame_boxes(framing: Framing, objects: Objects) -> Objects:
    """Boxes moved with the pixels and clamped to each output (torchvision's ``resized_crop``,
    ``horizontal_flip``, ``vertical_flip`` on ``BoundingBoxes``, then ``ClampBoundingBoxes``);
    nothing removed (``sanitize`` does that).

    Parameters
    ----------
    framing : Framing
        One framing per sample.
    objects : Objects
        The batch's boxes in tile pixels.

    Returns
    -------
    Objects
        The same rows in output pixels.
    """
    if len(framing) != len(objects):
        raise ConfigError(f"frame_boxes: {len(framing)} framings for {len(objects)} samples")
    rows = objects.samples()
    b = objects.boxes.astype(np.float64, copy=True)

    def xy(pairs: np.ndarray) -> np.ndarray:  # per-sample [y, x] -> per-row x, y, x, y
        return np.concatenate([pairs[rows][:, ::-1]] * 2, axis=1)

    # the crop: shift, clamp to the region (crop_bounding_boxes), then scale (resize_bounding_boxes)
    b -= xy(framing.origin)
    b = np.clip(b, 0.0, xy(framing.region))
    b *= xy(framing.ratio())
    # the centre crop after the resize (anchor 0 for windows), and the clamp of crop / Clamp
    size = xy(framing.size)
    b = np.clip(b - xy(framing.anchor), 0.0, size)
    h, v = framing.hflip[rows], framing.vflip[rows]
    b[h, 0], b[h, 2] = size[h, 0] - b[h, 2], size[h, 0] - b[h, 0]
    b[v, 1], b[v, 3] = size[v, 1] - b[v, 3], size[v, 1] - b[v, 1]
    return objects.with_boxes(np.clip(b, 0.0, size))


def valid_boxes(boxes: np.ndarray, size: np.ndarray, min_size: float = 1.0,
                min_area: float = 1.0) -> np.ndarray:
    """torchvision v2's ``SanitizeBoundingBoxes`` test, per box: width and height at least
    ``min_size``, area at least ``min_area``, every coordinate within its canvas.

    Parameters
    ----------
    boxes : numpy.ndarray
        (M, 4) XYXY.
    size : numpy.ndarray
        (M, 2) [h, w] of each box's canvas.
    min_size, min_area : float
        torchvision's thresholds (each at least 1, as torchvision requires).

    Returns
    -------
    numpy.ndarray
        (M,) bool, true for a box to keep.
    """
    check_thresholds(min_size, min_area)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    ok = (w >= min_size) & (h >= min_size) & (boxes >= 0).all(axis=1) & (w * h >= min_area)
    ok &= (boxes[:, 0] <= size[:, 1]) & (boxes[:, 2] <= size[:, 1])
    return ok & (boxes[:, 1] <= size[:, 0]) & (boxes[:, 3] <= size[:, 0])


def check_thresholds(min_size: float, min_area: float) -> None:
    """Refuse what torchvision's ``SanitizeBoundingBoxes`` refuses: ``min_size`` or ``min_area``
    below 1.

    Parameters
    ----------
    min_size, min_area : float
        The thresholds.
    """
    if min_size < 1:
        raise ConfigError(f"min_size must be >= 1 (as torchvision's SanitizeBoundingBoxes), got {min_size}")
    if min_area < 1:
        raise ConfigError(f"min_area must be >= 1 (as torchvision's SanitizeBoundingBoxes), got {min_area}")


def sanitize(objects: Objects, size: np.ndarray, min_size: float = 1.0, min_area: float = 1.0) -> Objects:
    """The rows ``valid_boxes`` keeps, with their labels, crowd flags and ids.

    Parameters
    ----------
    objects : Objects
        Boxes in output pixels.
    size : numpy.ndarray
        (n, 2) [h, w] per sample (``Framing.size``).
    min_size, min_area : float
        torchvision's thresholds.

    Returns
    -------
    Objects
        The kept rows.
    """
    keep = valid_boxes(objects.boxes, np.asarray(size, np.float64)[objects.samples()], min_size, min_area)
    return objects.select(keep)


def transform_boxes(framing: Framing, objects: Objects, min_size: float = 1.0,
                    min_area: float = 1.0) -> Objects:
    """A batch's boxes through its framing, clamped and sanitised: what torchvision v2's
    ``resized_crop``, flips, ``ClampBoundingBoxes`` and ``SanitizeBoundingBoxes(min_size,
    min_area)`` give, for every sample at once.

    Parameters
    ----------
    framing : Framing
        One framing per sample (``Framing.windows`` for training).
    objects : Objects
        The batch's boxes in tile pixels.
    min_size, min_area : float
        ``SanitizeBoundingBoxes``' thresholds (default 1, as there).

    Returns
    -------
    Objects
        The surviving boxes in output pixels; ``ids`` name each one's instance mask.
    """
    check_thresholds(min_size, min_area)
    return sanitize(frame_boxes(framing, objects), framing.size, min_size, min_area)
