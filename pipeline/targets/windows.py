"""Detection's crop windows, drawn on the host from (seed, epoch, sample key): SSD's
IoU-constrained crop (torchvision v2's ``RandomIoUCrop``), SSD's zoom-out (``RandomZoomOut``:
a larger canvas around the picture, which the IoU crop then cuts) and large-scale jitter
(``ScaleJitter``, then a fixed-size cut of the output's side).

Each draws on a stream of its own (``stream_seed``), so the random-resized crops and flips of
today's recipe keep their draws. The IoU crop gives windows in tile pixels, as
``crops.window_inputs`` does (the graph cuts and resizes them to the output size;
``Framing.windows`` moves the boxes and masks with them); large-scale jitter gives a
``Framing`` (resize, then cut), whose ``window()`` is the graph's crop window. Windows of
the last two reach past the picture; ``Pasted`` says which part of each lies inside it and
where that part lands in the output, the rest being padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError

IOU_STREAM = "tilefeed.targets.iou_crop"
JITTER_STREAM = "tilefeed.targets.scale_jitter"
ZOOM_STREAM = "tilefeed.targets.zoom_out"
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)  # torchvision's sampler_options default


@dataclass(frozen=True)
class IoUCrop:
    """torchvision v2 ``RandomIoUCrop``'s settings, with its defaults and meanings.

    Each round draws a minimum IoU from ``sampler_options`` (1.0 or more: the picture as it is),
    then up to ``trials`` windows: width and height fractions uniform in [``min_scale``,
    ``max_scale``], aspect ratio (width / height) within [``min_aspect_ratio``,
    ``max_aspect_ratio``], a position uniform in the picture; a window is taken when a box's
    centre lies strictly inside it and some such box overlaps it with at least that IoU. Boxes
    whose centres lie outside the taken window are dropped (torchvision zeroes them for
    ``SanitizeBoundingBoxes``). torchvision draws rounds without end; here ``rounds`` bounds
    them (each round's draws a stream of their own), and a sample that finds no window in
    them keeps its whole picture, what option 1.0 gives (with the defaults, a chance below
    (6/7)^64 = 5e-5 a sample).

    Attributes
    ----------
    min_scale, max_scale : float
        The window's side fractions' range.
    min_aspect_ratio, max_aspect_ratio : float
        The window's width / height range.
    sampler_options : tuple of float
        The minimum IoUs drawn from, uniformly.
    trials : int
        Windows tried per round.
    rounds : int
        Rounds drawn before the whole picture is kept.
    """

    min_scale: float = 0.3
    max_scale: float = 1.0
    min_aspect_ratio: float = 0.5
    max_aspect_ratio: float = 2.0
    sampler_options: tuple[float, ...] = IOU_OPTIONS
    trials: int = 40
    rounds: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.min_scale <= self.max_scale:
            raise ConfigError(f"iou_crop: need 0 < min_scale <= max_scale, got {self.min_scale}, "
                              f"{self.max_scale}")
        if not 0 < self.min_aspect_ratio <= self.max_aspect_ratio:
            raise ConfigError("iou_crop: need 0 < min_aspect_ratio <= max_aspect_ratio, got "
                              f"{self.min_aspect_ratio}, {self.max_aspect_ratio}")
        if not self.sampler_options:
            raise ConfigError("iou_crop: sampler_options is empty")
        if self.trials < 1 or self.rounds < 1:
            raise ConfigError(f"iou_crop: trials and rounds must be positive, got {self.trials}, {self.rounds}")


@dataclass(frozen=True)
class DrawnWindows:
    """Per sample, a window in tile pixels, and which boxes stay with it.

    Attributes
    ----------
    start, end : numpy.ndarray
        (n, 2) float64 [y, x] corners, as ``crops.window_inputs`` gives the graph.
    keep : numpy.ndarray
        (M,) bool over the batch's boxes: false for a box the window leaves out by rule
        (``Objects.select(keep)`` before ``transform_boxes``).
    """

    start: np.ndarray
    end: np.ndarray
    keep: np.ndarray


def _pictures(pictures: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    p = np.asarray(pictures, dtype=np.float64).reshape(n, 4)
    return p[:, 0], p[:, 1], p[:, 2], p[:, 3]


def iou_crops(crop: IoUCrop, seed: int, epoch: int, keys: np.ndarray, pictures: np.ndarray,
              objects: Objects) -> DrawnWindows:
    """SSD's IoU-constrained crop of each sample's picture, torchvision v2 ``RandomIoUCrop``'s
    rule with draws from (seed, epoch, key).

    Parameters
    ----------
    crop : IoUCrop
        The settings.
    seed, epoch : int
        The Loader's seed and the epoch.
    keys : numpy.ndarray
        (n,) each sample's draw key (its sample index in the epoch's order).
    pictures : numpy.ndarray
        (n, 4) each tile's picture box: top, left, height, width in tile pixels.
    objects : Objects
        The batch's boxes in tile pixels.

    Returns
    -------
    DrawnWindows
        Windows (whole pixels of the picture, offset into the tile) and the boxes kept.
    """
    keys = np.asarray(keys)
    n = len(keys)
    if len(objects) != n:
        raise ConfigError(f"iou_crop: {len(objects)} samples of boxes for {n} keys")
    top0, left0, height, width = _pictures(pictures, n)
    start = np.stack([top0, left0], axis=1)
    end = start + np.stack([height, width], axis=1)
    keep = np.ones(len(objects.boxes), dtype=bool)
    rows_of = objects.samples()
    cx = (objects.boxes[:, 0] + objects.boxes[:, 2]) / 2
    cy = (objects.boxes[:, 1] + objects.boxes[:, 3]) / 2
    pending = np.arange(n)
    options = np.asarray(crop.sampler_options, dtype=np.float64)
    lo, span, t = crop.min_scale, crop.max_scale - crop.min_scale, crop.trials
    for r in range(crop.rounds):
        if len(pending) == 0:
            break
        u = uniforms(stream_seed(seed, f"{IOU_STREAM}:{r}"), epoch, keys[pending], 1 + 4 * t)
        # torch.randint(0, len(options)): each option equally likely
        minimum = options[np.minimum((u[:, 0] * len(options)).astype(np.int64), len(options) - 1)]
        tries = u[:, 1:].reshape(len(pending), t, 4)
        h, w = height[pending, None], width[pending, None]
        new_w = np.floor(w * (lo + span * tries[..., 0]))
        new_h = np.floor(h * (lo + span * tries[..., 1]))
        with np.errstate(divide="ignore", invalid="ignore"):
            aspect = new_w / new_h
        left = np.floor((w - new_w) * tries[..., 2])
        top = np.floor((h - new_h) * tries[..., 3])
        ok = (crop.min_aspect_ratio <= aspect) & (aspect <= crop.max_aspect_ratio) & (new_w > 0) & (new_h > 0)
        # the boxes of pending samples against each of their sample's windows, in tile pixels
        slot = np.full(n, -1)
        slot[pending] = np.arange(len(pending))
        mine = np.flatnonzero(slot[rows_of] >= 0)
        p = slot[rows_of[mine]]
        x0 = left[p] + left0[pending][p, None]
        y0 = top[p] + top0[pending][p, None]
        x1, y1 = x0 + new_w[p], y0 + new_h[p]
        inside = (x0 < cx[mine, None]) & (cx[mine, None] < x1) & (y0 < cy[mine, None]) & (cy[mine, None] < y1)
        b = objects.boxes[mine]
        iw = np.clip(np.minimum(b[:, 2, None], x1) - np.maximum(b[:, 0, None], x0), 0, None)
        ih = np.clip(np.minimum(b[:, 3, None], y1) - np.maximum(b[:, 1, None], y0), 0, None)
        inter = iw * ih
        union = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))[:, None] + new_w[p] * new_h[p] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = np.where(inside, inter / union, -np.inf)
        best = np.full((len(pending), t), -np.inf)
        np.maximum.at(best, p, iou)
        found = ok & np.isfinite(best) & (best >= minimum[:, None])
        whole = minimum >= 1.0  # torchvision's "leave as-is" option
        took = found.any(axis=1) & ~whole
        first = np.argmax(found, axis=1)
        for k in np.flatnonzero(took):  # the samples settled by a window this round
            i, j = pending[k], first[k]
            start[i] = (top0[i] + top[k, j], left0[i] + left[k, j])
            end[i] = start[i] + (new_h[k, j], new_w[k, j])
            rows = slice(objects.offsets[i], objects.offsets[i + 1])
            keep[rows] = inside[np.flatnonzero(p == k), j]
        pending = pending[~(took | whole)]
    return DrawnWindows(start, end, keep)


@dataclass(frozen=True)
class ScaleJitter:
    """torchvision v2 ``ScaleJitter``'s settings (large-scale jitter), with its meanings.

    The picture is resized by ``min(target_size[1] / height, target_size[0] / width) * s``,
    ``s`` uniform in ``scale_range``, to ``int(width * r)`` x ``int(height * r)``, as
    torchvision's ``make_params`` computes it; the output, a square of the Loader's size, is
    then cut from the resized picture as torchvision's detection reference's ``FixedSizeCrop``
    cuts it (what its ``lsj`` preset runs): offsets ``int(excess * r)`` with one uniform ``r``
    for both axes, from the top-left corner along an axis where the resized picture is
    smaller, with the rest past the picture's bottom and right (padding there).

    Attributes
    ----------
    target_size : tuple of int
        torchvision's ``target_size``.
    scale_range : tuple of float
        The range of ``s``.
    """

    target_size: tuple[int, int]
    scale_range: tuple[float, float] = (0.1, 2.0)

    def __post_init__(self) -> None:
        if len(self.target_size) != 2 or min(self.target_size) <= 0:
            raise ConfigError(f"scale_jitter: target_size must be two positive sides, got {self.target_size}")
        if not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ConfigError("scale_jitter: need 0 < scale_range[0] <= scale_range[1], got "
                              f"{self.scale_range}")


def scale_jitter_sizes(jitter: ScaleJitter, seed: int, epoch: int, keys: np.ndarray, heights: np.ndarray,
                       widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each picture's jittered size, ``ScaleJitter.make_params`` with draws from (seed, epoch, key).

    Parameters
    ----------
    jitter : ScaleJitter
        The settings.
    seed, epoch : int
        The Loader's seed and the epoch.
    keys : numpy.ndarray
        (n,) draw keys.
    heights, widths : numpy.ndarray
        (n,) picture sizes in tile pixels.

    Returns
    -------
    tuple of numpy.ndarray
        (n,) int64 new heights and widths.
    """
    u = uniforms(stream_seed(seed, JITTER_STREAM), epoch, np.asarray(keys), 3)
    lo, hi = jitter.scale_range
    h, w = np.asarray(heights, np.float64), np.asarray(widths, np.float64)
    r = np.minimum(jitter.target_size[1] / h, jitter.target_size[0] / w) * (lo + u[:, 0] * (hi - lo))
    return np.floor(h * r).astype(np.int64), np.floor(w * r).astype(np.int64)


def scale_jitter_framing(jitter: ScaleJitter, seed: int, epoch: int, keys: np.ndarray, pictures: np.ndarray,
                         size: int) -> Framing:
    """Large-scale jitter as a framing: each picture resized (``scale_jitter_sizes``), then a
    ``size`` square cut from it at a drawn whole-pixel offset (``FixedSizeCrop``'s
    ``int((resized - size) * r)``, one ``r`` for both axes), from the top-left corner where the
    resized picture is smaller (the rest past its bottom and right: padding). Boxes and masks through it equal
    torchvision's ``resize`` then ``crop`` (which pads); ``Framing.window`` gives the graph's
    crop window.

    Parameters
    ----------
    jitter : ScaleJitter
        The settings.
    seed, epoch : int
        The Loader's seed and the epoch.
    keys : numpy.ndarray
        (n,) draw keys.
    pictures : numpy.ndarray
        (n, 4) picture boxes: top, left, height, width in tile pixels.
    size : int
        The output side.

    Returns
    -------
    Framing
        One framing per sample, unflipped.
    """
    keys = np.asarray(keys)
    n = len(keys)
    top0, left0, height, width = _pictures(pictures, n)
    new_h, new_w = scale_jitter_sizes(jitter, seed, epoch, keys, height, width)
    if (new_h < 1).any() or (new_w < 1).any():
        raise ConfigError(f"scale_jitter: a picture resized to nothing (target_size {jitter.target_size})")
    u = uniforms(stream_seed(seed, JITTER_STREAM), epoch, keys, 3)
    # FixedSizeCrop: one torch.rand(1) scales both excesses (slot 2 stays unused)
    off_y = np.floor(u[:, 1] * np.maximum(new_h - size, 0))
    off_x = np.floor(u[:, 1] * np.maximum(new_w - size, 0))
    return Framing(_yx(top0, left0), _yx(height, width), _yx(new_h, new_w), _yx(off_y, off_x),
                   np.full((n, 2), float(size)), np.zeros(n, bool), np.zeros(n, bool))


def _yx(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.stack([y, x], axis=1).astype(np.float64)


def scale_jitter_windows(jitter: ScaleJitter, seed: int, epoch: int, keys: np.ndarray, pictures: np.ndarray,
                         size: int) -> DrawnWindows:
    """``scale_jitter_framing``'s windows, as the graph takes them (fractional, and past the
    picture where the output is padded); every box kept (clamping and sanitising decide).

    Parameters
    ----------
    jitter : ScaleJitter
        The settings.
    seed, epoch : int
        The Loader's seed and the epoch.
    keys : numpy.ndarray
        (n,) draw keys.
    pictures : numpy.ndarray
        (n, 4) picture boxes: top, left, height, width in tile pixels.
    size : int
        The output side.

    Returns
    -------
    DrawnWindows
        The windows.
    """
    start, end = scale_jitter_framing(jitter, seed, epoch, keys, pictures, size).window()
    return DrawnWindows(start, end, np.ones(0, dtype=bool))


@dataclass(frozen=True)
class ZoomOut:
    """torchvision v2 ``RandomZoomOut``'s settings, with its defaults and meanings.

    With probability ``p`` the picture is placed on a canvas ``int(side * r)`` a side, ``r``
    uniform in ``side_range``, at offsets ``int((canvas - side) * u)`` (one uniform per axis);
    the rest of the canvas is the fill. Otherwise the canvas is the picture itself.

    Attributes
    ----------
    side_range : tuple of float
        The range of ``r`` (at least 1).
    p : float
        The probability of zooming out.
    """

    side_range: tuple[float, float] = (1.0, 4.0)
    p: float = 0.5

    def __post_init__(self) -> None:
        if not 1.0 <= self.side_range[0] <= self.side_range[1]:
            raise ConfigError(f"zoom_out: need 1 <= side_range[0] <= side_range[1], got {self.side_range}")
        if not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"zoom_out: p must be in [0, 1], got {self.p}")


def zoom_out_canvases(zoom: ZoomOut, seed: int, epoch: int, keys: np.ndarray,
                      pictures: np.ndarray) -> np.ndarray:
    """Each picture's canvas, ``RandomZoomOut.make_params`` with draws from (seed, epoch, key).

    The canvas is a box in tile pixels (it reaches past the tile where it is larger than the
    picture), so boxes keep their tile coordinates and an IoU crop drawn on the canvas gives
    windows in tile pixels.

    Parameters
    ----------
    zoom : ZoomOut
        The settings.
    seed, epoch : int
        The Loader's seed and the epoch.
    keys : numpy.ndarray
        (n,) draw keys.
    pictures : numpy.ndarray
        (n, 4) picture boxes: top, left, height, width in tile pixels.

    Returns
    -------
    numpy.ndarray
        (n, 4) float64 canvases: top, left, height, width in tile pixels (the picture where
        the zoom-out is not applied).
    """
    keys = np.asarray(keys)
    n = len(keys)
    top0, left0, height, width = _pictures(pictures, n)
    u = uniforms(stream_seed(seed, ZOOM_STREAM), epoch, keys, 4)
    applied = u[:, 0] < zoom.p  # torchvision skips where rand(1) >= p
    # torch's float32 arithmetic: r = lo + rand * (hi - lo), then int(side * r)
    lo, hi = np.float32(zoom.side_range[0]), np.float32(zoom.side_range[1])
    r = lo + u[:, 1].astype(np.float32) * (hi - lo)
    canvas_h = np.floor(height.astype(np.float32) * r).astype(np.float64)
    canvas_w = np.floor(width.astype(np.float32) * r).astype(np.float64)
    left = np.floor(((canvas_w - width).astype(np.float32) * u[:, 2].astype(np.float32)).astype(np.float64))
    top = np.floor(((canvas_h - height).astype(np.float32) * u[:, 3].astype(np.float32)).astype(np.float64))
    canvases = np.stack([top0 - top, left0 - left, canvas_h, canvas_w], axis=1)
    return np.where(applied[:, None], canvases, np.stack([top0, left0, height, width], axis=1))


@dataclass(frozen=True)
class Pasted:
    """Per sample, the part of a window inside its picture and where it lands in the output:
    the graph resizes ``cut_start``..``cut_end`` to ``cut_size`` and pastes it at ``place`` on
    an output of the fill colour.

    Attributes
    ----------
    cut_start, cut_end : numpy.ndarray
        (n, 2) float64 [y, x] corners of the window's part inside the picture, tile pixels.
    cut_size : numpy.ndarray
        (n, 2) whole output pixels [h, w] that part becomes (at least 1).
    place : numpy.ndarray
        (n, 2) whole output pixels [y, x] of its top-left corner.
    """

    cut_start: np.ndarray
    cut_end: np.ndarray
    cut_size: np.ndarray
    place: np.ndarray


def pasted(start: np.ndarray, end: np.ndarray, pictures: np.ndarray, size: int) -> Pasted:
    """The part of each window inside its picture, and its place in a ``size`` output.

    The window maps linearly onto the output (``Framing.windows``); the picture's edges land
    at ``(edge - start) * size / (end - start)``, rounded to whole output pixels (half up):
    exact where they are whole already (large-scale jitter's, and any window at one output
    pixel per tile pixel), else within half an output pixel of the boxes; a sliver of picture
    narrower than that still paints one whole output pixel (a cut is at least one pixel wide).
    A window that misses its picture keeps one pixel of it, placed past the output: the output
    is all fill.

    Parameters
    ----------
    start, end : numpy.ndarray
        (n, 2) [y, x] window corners in tile pixels.
    pictures : numpy.ndarray
        (n, 4) picture boxes: top, left, height, width in tile pixels.
    size : int
        The output side.

    Returns
    -------
    Pasted
        Cuts and places.
    """
    start = np.asarray(start, np.float64).reshape(-1, 2)
    end = np.asarray(end, np.float64).reshape(-1, 2)
    n = len(start)
    top0, left0, height, width = _pictures(pictures, n)
    first = np.stack([top0, left0], axis=1)
    last = first + np.stack([height, width], axis=1)
    cut_start, cut_end = np.maximum(start, first), np.minimum(end, last)
    per_tile_pixel = size / (end - start)
    place = np.floor((cut_start - start) * per_tile_pixel + 0.5)
    place_end = np.floor((cut_end - start) * per_tile_pixel + 0.5)
    missed = (cut_end <= cut_start).any(axis=1)
    cut_start = np.where(missed[:, None], first, cut_start)
    cut_end = np.where(missed[:, None], first + 1, cut_end)
    place = np.where(missed[:, None], float(size), np.clip(place, 0, size - 1))
    cut_size = np.maximum(np.where(missed[:, None], 1.0, place_end - place), 1.0)
    return Pasted(cut_start, cut_end, cut_size, place)
