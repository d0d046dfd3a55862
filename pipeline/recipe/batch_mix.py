"""Mixup and cutmix of a normalised batch on its device, each batch's draw a function of its position.

timm's ``Mixup(mixup_alpha, cutmix_alpha, cutmix_minmax, prob, switch_prob, mode='batch',
correct_lam, label_smoothing, num_classes)`` and torchvision v2's ``MixUp(alpha, num_classes)``,
``CutMix(alpha, num_classes)`` and ``RandomChoice([MixUp, CutMix])`` (as torchvision's reference
``train.py`` builds them) are one operation here, ``BatchMix``, in two styles that keep each
library's arithmetic: timm pairs sample i with sample n-1-i (``flip``), draws its cutmix box
around a centre with sides ``int(side * sqrt(1 - lam))`` (or from ``cutmix_minmax``), and gives
``mixup_target``'s label-smoothed targets; torchvision pairs sample i with sample i-1 (``roll``),
draws its box with half sides ``int(side * sqrt(1 - lam) / 2)``, always corrects lambda to the
box, and gives plain one-hot mixtures (it smooths labels in the loss). A batch of odd size is
mixed too (timm refuses one; its middle sample is paired with itself under ``flip``).

The draw of a batch, whether it is mixed, mixup or cutmix, lambda from Beta(alpha, alpha) and the
box, comes from (seed, epoch, batch position) through ``pipeline.planning.counters.uniforms`` on a
stream of its own (a seed derived from the Loader's seed, shared with neither the crops nor the
erasing), Beta through two Marsaglia-Tsang gamma variates.

The rule for resume
-------------------
A batch's draw is keyed by its *global batch position* in the epoch, and samples are mixed only
within the batch one rank hands over. The position of the batch a rank hands over at step ``t``
of a stretch of the epoch (a run between resumes that changed the world size or batch size) is
``before + t * world_size + rank`` (``batch_position``), where ``before`` counts the batches all
ranks handed over in the epoch's earlier stretches (``sum(world_size * batches)`` of the Loader's
saved segments; 0 in an epoch never resumed on other settings). Hence:

* resumed on the same world size and batch size, every batch has the samples and the position
  it had, and is mixed bit-identically;
* resumed on another world size or batch size, the batches left are composed anew: their draws
  are those of positions ``before``, ``before + 1``, ... (positions no batch of the epoch used
  before), each mixing the new batch's own samples. No batch-level draw survives such a change,
  while per-sample draws (crops, flips, erasing: ``pipeline.recipe.erasing``) stay
  bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.options import Layout
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError

GAMMA_TRIES = 8  # Marsaglia-Tsang accepts at least 95% of tries: eight leave ~1e-10 unresolved
_GAMMA_DRAWS = 1 + 3 * GAMMA_TRIES  # the boost below shape 1, then per try two for a normal, one to accept
_HEAD = 6  # mixed?, cutmix?, two for the box's size or centre, two for the minmax box's corner
DRAWS = _HEAD + 2 * _GAMMA_DRAWS
STREAM = "tilefeed.recipe.batch_mix"  # this operation's draw stream (planning.counters.stream_seed)


class MixStyle(StrEnum):
    """Whose arithmetic a ``BatchMix`` follows: pairing, cutmix box, lambda and targets."""

    TIMM = "timm"
    TORCHVISION = "torchvision"



def batch_position(step: int, rank: int, world_size: int, before: int = 0) -> int:
    """The global position of the batch ``rank`` hands over at ``step`` of the epoch's stretch.

    ``before``: the batches all ranks handed over in the epoch's earlier stretches (other world
    or batch sizes), ``sum(world_size * batches)`` over them (see the module's rule for resume).
    """
    if not 0 <= rank < world_size or step < 0 or before < 0:
        raise ConfigError(f"batch position needs step >= 0, 0 <= rank < world_size and before >= 0, "
                          f"got step={step}, rank={rank}, world_size={world_size}, before={before}")
    return before + step * world_size + rank


def _log_gamma(u: np.ndarray, shape: float) -> np.ndarray:
    """log of a Gamma(shape, 1) variate per row of ``u`` (``_GAMMA_DRAWS`` uniforms a row).

    Marsaglia and Tsang's method with a fixed number of tries (a row none accepts takes the
    mode-like ``d``); below shape 1, Gamma(shape + 1) * U ** (1 / shape), in logs so that small
    alphas do not underflow to 0 / 0.
    """
    boosted = shape < 1.0
    d = (shape + 1.0 if boosted else shape) - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    tries = u[:, 1:].reshape(len(u), GAMMA_TRIES, 3)
    # 1 - u lies in (0, 1]: its log is finite
    x = np.sqrt(-2.0 * np.log1p(-tries[..., 0])) * np.cos(2.0 * math.pi * tries[..., 1])
    v = (1.0 + c * x) ** 3
    with np.errstate(invalid="ignore", divide="ignore"):
        accept = (v > 0) & (np.log1p(-tries[..., 2]) < 0.5 * x * x + d - d * v + d * np.log(v))
    first = np.argmax(accept, axis=1)
    rows = np.arange(len(u))
    logged = np.where(accept[rows, first], np.log(d * np.where(v[rows, first] > 0, v[rows, first], 1.0)),
                      math.log(d))
    if boosted:
        logged = logged + np.log1p(-u[:, 0]) / shape
    return logged


def beta(u: np.ndarray, alpha: float) -> np.ndarray:
    """Beta(alpha, alpha) per row of ``u`` (``2 * _GAMMA_DRAWS`` uniforms a row): G1 / (G1 + G2)."""
    g1 = _log_gamma(u[:, :_GAMMA_DRAWS], alpha)
    g2 = _log_gamma(u[:, _GAMMA_DRAWS:], alpha)
    return 1.0 / (1.0 + np.exp(g2 - g1))


@dataclass(frozen=True)
class MixDraw:
    """What a batch gets: ``lam`` is the weight of each sample's own image and label (1.0: the
    batch is left as it is), ``cutmix`` whether a box is pasted, ``box`` its (top, bottom, left,
    right) in pixels (end exclusive) or None."""

    lam: float
    cutmix: bool
    box: tuple[int, int, int, int] | None


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BatchMix:
    """Mixup or cutmix of a batch (timm's ``Mixup`` in mode ``'batch'``, or torchvision's).

    Parameters
    ----------
    num_classes
        Classes of the labels: the width of the soft targets.
    mixup_alpha, cutmix_alpha
        Beta(alpha, alpha) of lambda for each; an operation is active when its alpha is above 0.
    cutmix_minmax
        timm: the cutmix box's sides as (min, max) fractions of the image's, drawn uniformly
        (cutmix then active with alpha 1, lambda from the box), or None.
    prob
        Probability that a batch is mixed at all.
    switch_prob
        With both active: probability of cutmix rather than mixup (torchvision: its
        ``RandomChoice`` weight of ``CutMix``).
    correct_lam
        Lambda from the area of the box as clipped by the image (torchvision always does).
    label_smoothing
        timm's ``mixup_target`` smoothing of the one-hot targets (torchvision: 0, it smooths
        in the loss).
    style
        Whose pairing, box and arithmetic (``MixStyle``).
    """

    num_classes: int
    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: tuple[float, float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    correct_lam: bool = True
    label_smoothing: float = 0.1
    style: MixStyle = MixStyle.TIMM

    def __post_init__(self) -> None:
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ConfigError(f"num_classes must be a whole number of at least 1, got {self.num_classes!r}")
        for name in ("mixup_alpha", "cutmix_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < math.inf:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "style", choice(MixStyle, self.style, "style"))
        minmax = self.cutmix_minmax
        if minmax is not None:
            if (isinstance(minmax, str) or not hasattr(minmax, "__len__") or len(minmax) != 2
                    or not 0.0 <= float(minmax[0]) < float(minmax[1]) <= 1.0):
                raise ConfigError(f"cutmix_minmax must be (min, max) with 0 <= min < max <= 1, got {minmax!r}")
            if self.style is MixStyle.TORCHVISION:
                raise ConfigError("cutmix_minmax is timm's: torchvision's CutMix has no such option")
            # timm forces cutmix alpha 1 when minmax is given (the box, not lambda, decides)
            object.__setattr__(self, "cutmix_minmax", (float(minmax[0]), float(minmax[1])))
            object.__setattr__(self, "cutmix_alpha", 1.0)
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            raise ConfigError("mixup_alpha or cutmix_alpha (or cutmix_minmax) must be above 0: nothing to mix")
        object.__setattr__(self, "prob", _check_probability("prob", self.prob))
        object.__setattr__(self, "switch_prob", _check_probability("switch_prob", self.switch_prob))
        smoothing = self.label_smoothing
        if (isinstance(smoothing, bool) or not isinstance(smoothing, (int, float))
                or not 0.0 <= smoothing <= 1.0):
            raise ConfigError(f"label_smoothing must be in [0, 1], got {smoothing!r}")
        object.__setattr__(self, "label_smoothing", float(smoothing))
        if self.style is MixStyle.TORCHVISION:
            if smoothing:
                raise ConfigError("label_smoothing with torchvision's MixUp/CutMix: torchvision smooths in the "
                                  "loss (CrossEntropyLoss(label_smoothing=...)), give it there")
            if not self.correct_lam:
                raise ConfigError("correct_lam=False is timm's: torchvision's CutMix always takes lambda "
                                  "from the box")

    @classmethod
    def from_timm(cls, mixup_alpha: float = 1.0, cutmix_alpha: float = 0.0,
                  cutmix_minmax: tuple[float, float] | None = None, prob: float = 1.0,
                  switch_prob: float = 0.5, mode: str = "batch", correct_lam: bool = True,
                  label_smoothing: float = 0.1, num_classes: int = 1000, multi_label: bool = False) -> BatchMix:
        """timm's ``Mixup`` with timm's parameters and defaults.

        ``mode`` ``'pair'`` and ``'elem'`` (a draw per pair or per sample) and ``multi_label``
        (dense multi-label targets: the Loader's labels are class indices) are refused.
        """
        if mode != "batch":
            raise ConfigError(f"mode={mode!r} is not supported: only timm's mode='batch' (one draw a batch)")
        if multi_label:
            raise ConfigError("multi_label=True is not supported: the labels are class indices")
        return cls(num_classes=num_classes, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha,
                   cutmix_minmax=cutmix_minmax, prob=prob, switch_prob=switch_prob, correct_lam=correct_lam,
                   label_smoothing=label_smoothing, style=MixStyle.TIMM)

    @classmethod
    def from_torchvision(cls, num_classes: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                         p: tuple[float, float] | None = None) -> BatchMix:
        """torchvision's reference recipe: ``MixUp(alpha=mixup_alpha)`` where ``mixup_alpha > 0``,
        ``CutMix(alpha=cutmix_alpha)`` where ``cutmix_alpha > 0``, and ``RandomChoice`` of those
        (weights ``p`` = (MixUp's, CutMix's), default equal), applied to every batch.
        """
        switch = 0.5
        if p is not None:
            if len(p) != 2 or min(p) < 0 or sum(p) <= 0:
                raise ConfigError(f"p must be two non-negative RandomChoice weights (MixUp, CutMix), got {p!r}")
            switch = float(p[1]) / float(p[0] + p[1])
        return cls(num_classes=num_classes, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=1.0,
                   switch_prob=switch, correct_lam=True, label_smoothing=0.0, style=MixStyle.TORCHVISION)

    def draw(self, seed: int, epoch: int, batch_position: int, height: int, width: int) -> MixDraw:
        """The draw of the batch at ``batch_position`` of ``epoch`` for images of ``height`` x ``width``."""
        u = uniforms(stream_seed(seed, STREAM), epoch, np.array([batch_position], dtype=np.int64), DRAWS)
        return self._draw(u[0], height, width)

    def _draw(self, u: np.ndarray, height: int, width: int) -> MixDraw:
        if not u[0] < self.prob:
            return MixDraw(1.0, False, None)
        both = self.mixup_alpha > 0 and self.cutmix_alpha > 0
        cutmix = bool(u[1] < self.switch_prob) if both else self.mixup_alpha <= 0
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = float(beta(u[None, _HEAD:], alpha)[0])
        if not cutmix or lam == 1.0:  # timm leaves a batch of lambda 1 alone, box or not
            return MixDraw(lam, False, None)
        if self.style is MixStyle.TORCHVISION:
            # torchvision's CutMix.make_params: a centre, half sides int(sqrt(1 - lam) / 2 * side)
            cy, cx = math.floor(u[2] * height), math.floor(u[3] * width)
            r = 0.5 * math.sqrt(1.0 - lam)
            rh, rw = int(r * height), int(r * width)
            top, bottom = max(cy - rh, 0), min(cy + rh, height)
            left, right = max(cx - rw, 0), min(cx + rw, width)
            lam = float(1.0 - (right - left) * (bottom - top) / (width * height))
            return MixDraw(lam, True, (top, bottom, left, right))
        if self.cutmix_minmax is not None:  # timm's rand_bbox_minmax
            lo, hi = self.cutmix_minmax
            sides = []
            for draw, side in ((u[2], height), (u[3], width)):
                low, high = int(side * lo), int(side * hi)
                if high <= low:
                    raise ConfigError(f"cutmix_minmax={self.cutmix_minmax} leaves no box side for a side of "
                                      f"{side} pixels (int(side * min) must be below int(side * max))")
                sides.append(low + math.floor(draw * (high - low)))
            cut_h, cut_w = sides
            top, left = math.floor(u[4] * (height - cut_h + 1)), math.floor(u[5] * (width - cut_w + 1))
            bottom, right = top + cut_h, left + cut_w
        else:  # timm's rand_bbox (no margin)
            ratio = math.sqrt(1.0 - lam)
            cut_h, cut_w = int(height * ratio), int(width * ratio)
            cy, cx = math.floor(u[2] * height), math.floor(u[3] * width)
            top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + (cut_h + 1) // 2, 0), height)
            left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + (cut_w + 1) // 2, 0), width)
        if self.correct_lam or self.cutmix_minmax is not None:
            lam = 1.0 - (bottom - top) * (right - left) / float(height * width)
        return MixDraw(lam, True, (top, bottom, left, right))

    def targets(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
        """The soft targets (float32, one row a sample) of class ``labels`` mixed with weight ``lam``."""
        if labels.ndim != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ConfigError(f"labels must be class indices, one a sample, got {labels.dtype} of shape "
                              f"{tuple(labels.shape)}")
        if self.style is MixStyle.TORCHVISION:  # _BaseMixUpCutMix._mixup_label
            label = torch.nn.functional.one_hot(labels.long(), num_classes=self.num_classes).float()
            return label.roll(1, 0).mul_(1.0 - lam).add_(label.mul(lam))
        # timm's mixup_target
        off = self.label_smoothing / self.num_classes
        on = 1.0 - self.label_smoothing + off
        y1 = torch.full((len(labels), self.num_classes), off, device=labels.device).scatter_(
            1, labels.long().view(-1, 1), on)
        if lam == 1.0:
            return y1  # y1 * 1 + y2 * 0: the same numbers
        return y1 * lam + y1.flip(0) * (1.0 - lam)

    def apply(self, images: torch.Tensor, labels: torch.Tensor, seed: int, epoch: int, batch_position: int,
              layout: Layout | str = Layout.NCHW) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix the batch at ``batch_position`` of ``epoch`` (see ``batch_position``).

        Parameters
        ----------
        images
            Normalised images, float32, float16 or bfloat16, on any device; ``layout`` ``'NCHW'``
            or ``'channels_last'`` (shape N, C, H, W) or ``'NHWC'`` (shape N, H, W, C). They are
            mixed in place (as timm does), through an N, C, H, W view.
        labels
            Class indices, one a sample.
        seed, epoch, batch_position
            The Loader's seed, the epoch and the batch's global position in it.
        layout
            How ``images`` are laid out.

        Returns
        -------
        tuple of torch.Tensor
            ``images`` (mixed, same tensor and layout) and the float32 soft targets, N x num_classes.
        """
        if not images.dtype.is_floating_point:
            raise ConfigError(f"mixup and cutmix need a normalised float batch, got {images.dtype}: "
                              "use dtype float32, float16 or bfloat16")
        if images.ndim != 4:
            raise ConfigError(f"mixup and cutmix take a batch of images (4 dimensions), got shape "
                              f"{tuple(images.shape)}")
        layout = choice(Layout, layout, "layout")  # channels_last: NCHW-shaped, nothing to turn
        if len(labels) != len(images):
            raise ConfigError(f"labels must hold one label per image: {len(labels)} labels for "
                              f"{len(images)} images")
        view = images.permute(0, 3, 1, 2) if layout is Layout.NHWC else images
        d = self.draw(seed, epoch, batch_position, view.shape[2], view.shape[3])
        torchvision = self.style is MixStyle.TORCHVISION
        if d.box is not None:
            top, bottom, left, right = d.box
            region = view[:, :, top:bottom, left:right]
            # the partner's part of the box, copied before any of it is overwritten
            region.copy_(region.roll(1, 0) if torchvision else region.flip(0))
        elif d.lam != 1.0:
            partner = (view.roll(1, 0) if torchvision else view.flip(0)).mul_(1.0 - d.lam)
            view.mul_(d.lam).add_(partner)  # = x * lam + partner * (1 - lam), bit for bit in either order
        return images, self.targets(labels, d.lam)
