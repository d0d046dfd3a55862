"""Detection's crop windows, drawn on the host from (seed, epoch, sample key): SSD's
IoU-constrained crop (torchvision v2's ``RandomIoUCrop``) and large-scale jitter
(``ScaleJitter``, then a fixed-size cut of the output's side).

Each draws on a stream of its own (``stream_seed``), so the random-resized crops and flips of
today's recipe keep their draws. The IoU crop gives windows in tile pixels, as
``crops.window_inputs`` does (the graph cuts and resizes them to the output size;
``Framing.windows`` moves the boxes and masks with them); large-scale jitter gives a
``Framing`` (resize, then cut), whose ``window()`` is the graph's crop window.
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
    then cut from the resized picture at a uniformly drawn whole-pixel offset, or, where the
    resized picture is smaller, from its top-left corner with the rest past the picture's
    bottom and right (LSJ's fixed-size crop, padding there).

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
    ``size`` square cut from it at a drawn whole-pixel offset (``RandomCrop``'s
    ``randint(0, resized - size + 1)``), from the top-left corner where the resized picture is
    smaller (the rest past its bottom and right: padding). Boxes and masks through it equal
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
    off_y = np.floor(u[:, 1] * (np.maximum(new_h - size, 0) + 1))
    off_x = np.floor(u[:, 2] * (np.maximum(new_w - size, 0) + 1))
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
