"""``Recipe``: the settings of a training recipe's per-sample operations, checked.

Each option means what it means in torchvision v2 and timm: probabilities are probabilities of
applying, ``ColorJitter`` takes torchvision's ``brightness``, ``contrast``, ``saturation`` and
``hue`` (a number or a (min, max) pair, checked as torchvision checks them) and timm's
``color_jitter_prob``; ``Interpolation`` names torchvision's filters, plus timm's ``random``. No
DALI here: the per-sample parameters are drawn in ``pipeline.recipe.draws`` (auto-augment's in
``policies``), applied in the graph by ``pipeline.recipe.ops`` on a GPU and by the batch
source's threads with PIL (``pipeline.recipe.host_ops``) on the CPU; random erasing and
mixup/cutmix act on the batch after the graph (``erasing``, ``batch_mix``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, fields
from enum import StrEnum
from enum import Enum
from typing import Any

from tilefeed.pipeline.recipe.batch_mix import BatchMix
from tilefeed.pipeline.recipe.erasing import RandomErasing
from tilefeed.pipeline.recipe.pixel_ops import PIXEL_OPERATIONS, PixelOperation
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.solarize import RandomSolarize
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError


class Interpolation(StrEnum):
    """The resize filter of the training crop and of evaluation; a member equals its string.

    As torchvision's PIL path, antialiased when shrinking. ``RANDOM`` is timm's: each sample
    drawn between bilinear and bicubic (training); evaluation then uses bilinear, as timm's
    transforms do where ``random`` has no meaning.
    """

    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"
    NEAREST = "nearest"
    RANDOM = "random"


class Crop(StrEnum):
    """The training crop (``Recipe.crop``); a member equals its string.

    ``RANDOM_RESIZED``: torchvision's ``RandomResizedCrop`` of each picture (the Loader's
    ``scale`` and ``ratio``). ``NONE``: no crop: the whole tile as stored (a pad-fit store's
    letterbox) resized to the output side, what detection's ``hflip`` preset trains on (its
    models resize the whole picture themselves). ``IOU``: SSD's IoU-constrained crop of each
    picture, torchvision v2's ``RandomIoUCrop`` with its defaults (``pipeline.targets.windows``),
    drawn against the sample's stored boxes: a store with boxes only; boxes whose centres the
    window leaves out are dropped, as that transform marks them for ``SanitizeBoundingBoxes``.
    ``LSJ``: large-scale jitter, detection's ``lsj`` preset: torchvision v2's ``ScaleJitter``
    with ``target_size`` the output side and its default ``scale_range`` (0.1, 2.0), then the
    reference's ``FixedSizeCrop`` of the output side, padded past the bottom and right with
    ``Recipe.fill`` where the jittered picture is smaller. ``ZOOM_IOU``: SSD's ``RandomZoomOut``
    with its defaults (``side_range`` (1, 4), ``p`` 0.5: the picture placed on a larger canvas
    of ``Recipe.fill``), then ``RandomIoUCrop`` of that canvas, as ``IOU``. Windows of these two
    reach past the picture: the graph resizes the part inside it and pads the rest.
    """

    RANDOM_RESIZED = "random_resized"
    NONE = "none"
    IOU = "iou"
    LSJ = "lsj"
    ZOOM_IOU = "zoom_iou"

    @property
    def pads(self) -> bool:
        """Its windows may reach past the picture, which the output then shows as ``Recipe.fill``."""
        return self in (Crop.LSJ, Crop.ZOOM_IOU)

    @property
    def against_boxes(self) -> bool:
        """It draws against each sample's stored boxes (SSD's IoU crop)."""
        return self in (Crop.IOU, Crop.ZOOM_IOU)


# DALI's DALIInterpType codes (INTERP_NN, INTERP_LINEAR, INTERP_CUBIC, INTERP_LANCZOS3): what the
# per-sample filter input carries, numbered here so the host draws them without loading DALI
# (tests/pipeline/recipe checks them against DALI's own)
INTERP_CODES = {Interpolation.NEAREST: 0, Interpolation.BILINEAR: 1, Interpolation.BICUBIC: 2,
                Interpolation.LANCZOS: 3}
RANDOM_CHOICES = (Interpolation.BILINEAR, Interpolation.BICUBIC)  # timm's _RANDOM_INTERPOLATION

Range = tuple[float, float]


class _Unset(Enum):
    """The default of a deprecated keyword: left out, as against given (even as None)."""

    UNSET = "unset"


def _jitter_range(name: str, value: Any, center: float, bound: Range, clip_first_on_zero: bool) -> Range | None:
    """torchvision v2 ``ColorJitter._check_input``, with a one-line ConfigError for its errors."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"color_jitter {name}: a single number must be non-negative, got {value!r}")
        low, high = center - float(value), center + float(value)
        if clip_first_on_zero:
            low = max(low, 0.0)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ConfigError(f"color_jitter {name}={value!r}: the pair must hold two numbers") from None
    else:
        raise ConfigError(f"color_jitter {name}={value!r} should be a single number or a sequence of length 2")
    if not bound[0] <= low <= high <= bound[1] or math.isnan(low) or math.isnan(high):
        raise ConfigError(f"color_jitter {name} values should be between {bound} and increasing, "
                          f"got {[low, high]}")
    return None if low == high == center else (low, high)


def _probability(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= float(value) <= 1:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ColorJitter:
    """torchvision v2's ``ColorJitter``, applied with probability ``p`` (timm's ``color_jitter_prob``).

    Each of ``brightness``, ``contrast``, ``saturation`` is a number ``x`` (factor uniform in
    [max(0, 1 - x), 1 + x]) or a (min, max) pair of non-negative factors; ``hue`` a number in
    [0, 0.5] (shift uniform in [-x, x], in turns of the hue circle) or a pair within [-0.5, 0.5].
    ``None``, 0, or a pair at the identity leave that adjustment out. Held as the checked
    (min, max) ranges; the four are applied in a random order per sample.
    """

    brightness: float | Range | None = None
    contrast: float | Range | None = None
    saturation: float | Range | None = None
    hue: float | Range | None = None
    p: float = 1.0

    def __post_init__(self) -> None:
        checked = {
            "brightness": _jitter_range("brightness", self.brightness, 1.0, (0.0, math.inf), True),
            "contrast": _jitter_range("contrast", self.contrast, 1.0, (0.0, math.inf), True),
            "saturation": _jitter_range("saturation", self.saturation, 1.0, (0.0, math.inf), True),
            "hue": _jitter_range("hue", self.hue, 0.0, (-0.5, 0.5), False),
            "p": _probability("color_jitter p", self.p),
        }
        for name, value in checked.items():  # frozen: the checked form replaces what was given
            object.__setattr__(self, name, value)

    def ranges(self) -> dict[str, Range | None]:
        """The four adjustments' (min, max) factor ranges, in torchvision's order (None: left out)."""
        return {name: getattr(self, name) for name in JITTER_ADJUSTMENTS}

    @property
    def active(self) -> bool:
        """Some adjustment is on and may be applied."""
        return self.p > 0 and any(r is not None for r in self.ranges().values())


JITTER_ADJUSTMENTS = ("brightness", "contrast", "saturation", "hue")  # torchvision's fn_idx 0..3


def _pair(name: str, value: Any, bound: Range) -> Range:
    """A (min, max) factor range of ``RandomPhotometricDistort``, which takes pairs only (a single
    number there fails on its first draw), within ``bound`` and increasing."""
    pair = list(value) if isinstance(value, (tuple, list)) else []
    numbers_ = [v for v in pair if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    if len(pair) != 2 or len(numbers_) != 2:
        raise ConfigError(f"photometric {name}={value!r}: a (min, max) pair of numbers, as "
                          "RandomPhotometricDistort takes it")
    low, high = float(numbers_[0]), float(numbers_[1])
    if not bound[0] <= low <= high <= bound[1]:  # NaN fails every comparison
        raise ConfigError(f"photometric {name} values should be between {bound} and increasing, "
                          f"got {[low, high]}")
    return (low, high)


@dataclass(frozen=True)
class PhotometricDistort:
    """torchvision v2's ``RandomPhotometricDistort``, SSD's photometric distortion.

    Each of brightness, contrast, saturation and hue is applied with probability ``p`` on its
    own, its factor drawn uniform in its (min, max) range (hue: a shift in turns of the hue
    circle, within [-0.5, 0.5]; the others non-negative factors); contrast comes before
    saturation and hue or after them by a fair coin; then, with probability ``p``, the three
    channels are put in a uniformly random order (``randperm(3)``). The defaults are
    torchvision's, which its detection reference's ``ssd`` preset uses.

    Parameters
    ----------
    brightness : tuple of float, default (0.875, 1.125)
        The brightness factor's range.
    contrast : tuple of float, default (0.5, 1.5)
        The contrast factor's range.
    saturation : tuple of float, default (0.5, 1.5)
        The saturation factor's range.
    hue : tuple of float, default (-0.05, 0.05)
        The hue shift's range.
    p : float, default 0.5
        The probability of each of the five operations.
    """

    brightness: Range = (0.875, 1.125)
    contrast: Range = (0.5, 1.5)
    saturation: Range = (0.5, 1.5)
    hue: Range = (-0.05, 0.05)
    p: float = 0.5

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _pair(name, getattr(self, name), (0.0, math.inf)))
        object.__setattr__(self, "hue", _pair("hue", self.hue, (-0.5, 0.5)))
        object.__setattr__(self, "p", _probability("photometric p", self.p))

    def ranges(self) -> dict[str, Range]:
        """The four adjustments' (min, max) ranges, in ``JITTER_ADJUSTMENTS``' order."""
        return {name: getattr(self, name) for name in JITTER_ADJUSTMENTS}


@dataclass(frozen=True)
class Recipe:
    """A training recipe's per-sample operations beside the random-resized crop.

    Parameters
    ----------
    interpolation : Interpolation or str, default "bilinear"
        The filter of the training crop's resize and of evaluation's resize (see
        ``Interpolation``); the only field that applies in evaluation.
    hflip : float, default 0.5
        Probability of a horizontal flip (torchvision's ``RandomHorizontalFlip(p)``). At 0.5 the
        flip is the one the Loader drew before recipes existed, bit for bit.
    vflip : float, default 0
        Probability of a vertical flip (``RandomVerticalFlip(p)``).
    grayscale : float, default 0
        Probability of ``RandomGrayscale(p)``: the image becomes its luma in all three channels.
    color_jitter : ColorJitter, optional
        torchvision's colour jitter, applied with probability ``color_jitter.p``.
    photometric : PhotometricDistort, optional
        SSD's photometric distortion, torchvision's ``RandomPhotometricDistort`` (its detection
        reference's ``ssd`` preset); the first of the pixel operations.
    auto_augment : AutoAugment or str, optional
        An auto-augment policy (``pipeline.recipe.policies``): TrivialAugmentWide, RandAugment or
        AutoAugment's ImageNet policy; a string is parsed by ``AutoAugment.parse`` (torchvision's
        ``ta_wide``, ``ra``, ``imagenet``; timm's ``rand-m9-mstd0.5-inc1``, ``original``, ...).
    erasing : RandomErasing, optional
        Random erasing of each normalised sample (``pipeline.recipe.erasing``); needs a float
        output dtype.
    batch_mix : BatchMix, optional
        Mixup or cutmix of each batch (``pipeline.recipe.batch_mix``); the Loader then yields
        float32 soft targets (batch x ``num_classes``) in place of the labels. Needs a float
        output dtype. Not the mixing of stores, which is ``Mix``'s.
    crop : Crop or str, default "random_resized"
        The training crop (see ``Crop``): torchvision's random-resized crop, or ``"none"``, the
        whole tile resized to the output size (the flips still drawn as with the crop), or
        detection's ``"iou"``, ``"lsj"``, ``"zoom_iou"``.
    fill : tuple of int, default (0, 0, 0)
        The RGB value of output pixels past the picture, for the crops that pad (``"lsj"``,
        ``"zoom_iou"``): torchvision's ``fill`` of ``RandomZoomOut`` and of the reference's
        ``FixedSizeCrop`` (its detection presets pass the mean, (123, 117, 104)); one number
        means all three. Instance masks are padded with 0, as those presets pad them, semantic
        masks with 255 (ignore). Those crops take
        no vertical flip and no auto-augment policy (refused).
    solarize : RandomSolarize, optional
        torchvision v2's ``RandomSolarize(threshold, p)`` (``pipeline.recipe.solarize``): each
        sample's values at or above ``threshold`` inverted, with probability ``p``; the last
        pixel operation.
    mix : BatchMix, optional
        Deprecated, keyword only: ``batch_mix``'s former name, taken with a
        ``DeprecationWarning`` (and read as ``recipe.mix``, with one); giving both is refused.

    Raises
    ------
    ConfigError
        A value out of its range or of the wrong type, a crop that pads with a vertical flip or
        a policy, or both ``batch_mix`` and ``mix``, in one line.

    Notes
    -----
    In a sample the operations follow timm's and torchvision's training transforms: crop and
    resize, photometric distortion, vertical flip, auto-augment, colour jitter, grayscale, then
    the operations of ``pixel_ops.PIXEL_OPERATIONS`` (solarize), normalisation (with the
    horizontal flip), random erasing; then the batch is mixed. The
    horizontal flip comes last in the graph rather than first: every auto-augment operation it
    does not commute with (shear, translate and rotate along x) has a sign drawn at even odds,
    so the samples' distribution is the same. The photometric distortion, which torchvision's ``ssd`` preset
    applies to the whole picture before its zoom-out and crop, acts here on the sample as cut:
    brightness, saturation, hue and the channel order act pixel by pixel and commute with the
    cut, while contrast blends with the mean luma of what the sample shows of the picture rather
    than of the whole picture. A field added later takes a default that leaves today's samples
    as they are, its own check in ``__post_init__``, a draw on a stream of its own and an op: a
    pixel operation is one module and one line of ``pixel_ops.PIXEL_OPERATIONS``.
    """

    interpolation: Interpolation = Interpolation.BILINEAR
    hflip: float = 0.5
    vflip: float = 0.0
    grayscale: float = 0.0
    color_jitter: ColorJitter | None = field(default=None)
    auto_augment: AutoAugment | None = None
    erasing: RandomErasing | None = None
    batch_mix: BatchMix | None = None
    crop: Crop = Crop.RANDOM_RESIZED
    fill: tuple[int, int, int] = (0, 0, 0)
    photometric: PhotometricDistort | None = None
    solarize: RandomSolarize | None = None
    # batch_mix's former name, for a release: keyword only, so positional callers see the fields
    # above unchanged; its default tells "left out" from a caller's explicit mix=None
    mix: InitVar[BatchMix | None | _Unset] = field(default=_Unset.UNSET, kw_only=True)

    # mix's default here too: a dataclass made from Recipe inherits no InitVar (see below)
    def __post_init__(self, mix: BatchMix | None | _Unset = _Unset.UNSET) -> None:
        if mix is not _Unset.UNSET:
            if self.batch_mix is not None:
                raise ConfigError("Recipe takes batch_mix= or its deprecated name mix=, not both")
            # stacklevel 3: past __post_init__ and the dataclass's __init__, to the caller
            warnings.warn("Recipe(mix=...) is deprecated: the field is batch_mix (mixup/cutmix; Mix mixes "
                          "stores): give Recipe(batch_mix=...)", DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "batch_mix", mix)
        object.__setattr__(self, "interpolation", choice(Interpolation, self.interpolation, "interpolation"))
        object.__setattr__(self, "crop", choice(Crop, self.crop, "crop"))
        object.__setattr__(self, "fill", _fill(self.fill))
        for name in ("hflip", "vflip", "grayscale"):
            object.__setattr__(self, name, _probability(name, getattr(self, name)))
        if self.color_jitter is not None and not isinstance(self.color_jitter, ColorJitter):
            raise ConfigError(f"color_jitter must be a ColorJitter or None, got {self.color_jitter!r}")
        if self.photometric is not None and not isinstance(self.photometric, PhotometricDistort):
            raise ConfigError(f"photometric must be a PhotometricDistort or None, got {self.photometric!r}")
        if isinstance(self.auto_augment, str):
            object.__setattr__(self, "auto_augment", AutoAugment.parse(self.auto_augment))
        for name, kind in (("auto_augment", AutoAugment), ("erasing", RandomErasing), ("batch_mix", BatchMix),
                           ("solarize", RandomSolarize)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"{name} must be a {kind.__name__} or None, got {value!r}")
        if self.crop.pads and (self.vflip > 0 or self.auto_augment is not None):
            # the pixel operations run on the part inside the picture, before the padding
            # (torchvision's photometric distortion comes before the zoom-out): a flip or a
            # geometric policy there would move that part alone
            raise ConfigError(f"crop={self.crop.value!r} takes no vflip and no auto_augment")

    @property
    def per_batch(self) -> bool:
        """Some operation acts on the normalised batch after the graph (erasing, mixup/cutmix)."""
        return self.erasing is not None or self.batch_mix is not None

    @property
    def jitter(self) -> ColorJitter | None:
        """The colour jitter when it can change a sample, else None."""
        return self.color_jitter if self.color_jitter is not None and self.color_jitter.active else None

    @property
    def distort(self) -> PhotometricDistort | None:
        """The photometric distortion when it can change a sample, else None."""
        return self.photometric if self.photometric is not None and self.photometric.p > 0 else None

    def eval_interpolation(self) -> Interpolation:
        """The evaluation filter: ``random`` means bilinear there (timm's no-augmentation rule)."""
        return Interpolation.BILINEAR if self.interpolation is Interpolation.RANDOM else self.interpolation

    def identity(self) -> dict[str, Any]:
        """The recipe as plain JSON-able values: what a resumed run must agree on."""
        plain = _plain(self)
        assert isinstance(plain, dict)
        # batch_mix keeps the key of its former name, "mix", in its place: the Loader's saved
        # states (pipeline.loader.resume) compare this dict key by key, so a state saved before
        # the rename still loads and one saved now is what it was
        plain = {("mix" if name == "batch_mix" else name): value for name, value in plain.items()}
        # an operation added after the first saved states, while off, leaves the recipe reading
        # as it did before its field
        for name in ("photometric", *(op.field for op in PIXEL_OPERATIONS)):
            if plain[name] is None:
                del plain[name]
        return plain

    def pixel_operations(self) -> list[tuple[PixelOperation, Any]]:
        """The registered pixel operations this recipe applies, each with its settings, in order."""
        return [(op, getattr(self, op.field)) for op in PIXEL_OPERATIONS if getattr(self, op.field) is not None]


def _deprecated_mix(self: Recipe) -> BatchMix | None:
    """Deprecated: ``batch_mix``, read by its former name with a ``DeprecationWarning``."""
    warnings.warn("Recipe.mix is deprecated: read Recipe.batch_mix (mixup/cutmix; Mix mixes stores)",
                  DeprecationWarning, stacklevel=2)
    return self.batch_mix


# Made after the dataclass: the InitVar's default stays behind as a class attribute, which a read
# of recipe.mix would otherwise return (the default, never the recipe's batch_mix).
Recipe.mix = property(_deprecated_mix)  # type: ignore[attr-defined]
# An InitVar with a default is one dataclasses.replace() reads back with getattr and passes on:
# that would read the property (a warning) and hand batch_mix over twice. Out of the fields'
# table, replace() and every walk of the fields see batch_mix alone; __init__ keeps the keyword.
del Recipe.__dataclass_fields__["mix"]


def _fill(value: Any) -> tuple[int, int, int]:
    """torchvision's ``fill`` for uint8 images: one number or three, each whole, in [0, 255]."""
    one = isinstance(value, numbers.Real) and not isinstance(value, bool)
    values: list[Any] = [value] * 3 if one else list(value) if isinstance(value, (tuple, list)) else []
    whole = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    if len(values) != 3 or len(whole) != 3 or not all(0 <= v <= 255 and v == int(v) for v in whole):
        raise ConfigError(f"fill must be one whole number or three in [0, 255], got {value!r}")
    return (int(whole[0]), int(whole[1]), int(whole[2]))


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back: dataclasses as dicts of their fields (private
    ones left out), enums as their values, tuples as lists, infinities as strings."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value) if not f.name.startswith("_")}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return value
