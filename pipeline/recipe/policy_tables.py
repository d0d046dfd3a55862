"""Auto-augment's op set and tables, and how each family turns a magnitude into an op's parameter.

The names the policies choose from (``Policy``, ``Family``, ``Table``, ``Op``, ``PolicyInterpolation``),
torchvision v2's and timm's op lists, sub-policy tables and choice weights, and the arithmetic
from a magnitude bin (torchvision) or level (timm) and sign to the parameter the graph applies:
an enhance factor, a posterize mask, a solarize threshold or amount, or for the geometric ops
the 2x3 map from output to input pixel coordinates. Nothing here draws
(``policies.AutoAugment.draw`` does); ``policy_strings`` reads the names from config strings.
"""

from __future__ import annotations

import functools
import math
from enum import StrEnum

import numpy as np

_LEVEL_DENOM = 10.0  # timm's magnitude scale: level / 10 is the fraction of the op's range


class Policy(StrEnum):
    """Which automatic augmentation."""

    TRIVIAL_WIDE = "trivial_wide"
    RAND = "rand"
    AUTO_IMAGENET = "auto_imagenet"


class Family(StrEnum):
    """Whose op table and magnitude arithmetic: torchvision v2's or timm's."""

    TORCHVISION = "torchvision"
    TIMM = "timm"


class Table(StrEnum):
    """AutoAugment's sub-policy table: torchvision's ImageNet policy, or timm's four."""

    IMAGENET = "imagenet"
    ORIGINAL = "original"
    ORIGINALR = "originalr"
    V0 = "v0"
    V0R = "v0r"


class PolicyInterpolation(StrEnum):
    """Interpolation of the geometric ops.

    ``BICUBIC`` is every op slot bicubic: timm's ``--train-interpolation bicubic`` with ``--aa``
    (DeiT's recipes) and torchvision's presets with ``--interpolation bicubic``. ``RANDOM`` is
    timm's default (no ``interpolation`` in its hparams): each op slot of each sample picks
    bilinear or bicubic (``RANDOM_FILTERS``) with even odds. PIL applies the bicubic slots
    bicubic on the host path; DALI's warp has no cubic filter, so the graph warps them bilinear.
    """

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    RANDOM = "random"


# What ``aa_filter`` indexes under ``PolicyInterpolation.RANDOM``: timm's _RANDOM_INTERPOLATION, in its order.
RANDOM_FILTERS: tuple[str, ...] = ("bilinear", "bicubic")


class Op(StrEnum):
    """The operations the graph can apply; ``OPS`` fixes their index in the graph."""

    IDENTITY = "identity"
    SHEAR_X = "shear_x"
    SHEAR_Y = "shear_y"
    TRANSLATE_X = "translate_x"
    TRANSLATE_Y = "translate_y"
    ROTATE = "rotate"
    BRIGHTNESS = "brightness"
    COLOR = "color"
    CONTRAST = "contrast"
    SHARPNESS = "sharpness"
    POSTERIZE = "posterize"
    SOLARIZE = "solarize"
    SOLARIZE_ADD = "solarize_add"
    AUTO_CONTRAST = "auto_contrast"
    EQUALIZE = "equalize"
    INVERT = "invert"


OPS: tuple[Op, ...] = tuple(Op)
GEOMETRIC = frozenset({Op.SHEAR_X, Op.SHEAR_Y, Op.TRANSLATE_X, Op.TRANSLATE_Y, Op.ROTATE})

# torchvision's op order (dict order of its _AUGMENTATION_SPACE) for TrivialAugmentWide and
# RandAugment, and the upper end of each op's magnitude linspace; None: no magnitude.
_TV_NAMES = {"Identity": Op.IDENTITY, "ShearX": Op.SHEAR_X, "ShearY": Op.SHEAR_Y,
             "TranslateX": Op.TRANSLATE_X, "TranslateY": Op.TRANSLATE_Y, "Rotate": Op.ROTATE,
             "Brightness": Op.BRIGHTNESS, "Color": Op.COLOR, "Contrast": Op.CONTRAST,
             "Sharpness": Op.SHARPNESS, "Posterize": Op.POSTERIZE, "Solarize": Op.SOLARIZE,
             "AutoContrast": Op.AUTO_CONTRAST, "Equalize": Op.EQUALIZE, "Invert": Op.INVERT}
_TV_RAND_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")

# torchvision's AutoAugmentPolicy.IMAGENET: (op, probability, magnitude bin of 10).
_TV_IMAGENET: tuple[tuple[tuple[str, float, int | None], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)

# timm's op names -> (the graph's op, its level-to-parameter rule).
_TIMM_NAMES = {
    "AutoContrast": (Op.AUTO_CONTRAST, "none"), "Equalize": (Op.EQUALIZE, "none"),
    "Invert": (Op.INVERT, "none"), "Rotate": (Op.ROTATE, "rotate"),
    "Posterize": (Op.POSTERIZE, "posterize"), "PosterizeIncreasing": (Op.POSTERIZE, "posterize_inc"),
    "PosterizeOriginal": (Op.POSTERIZE, "posterize_orig"), "Solarize": (Op.SOLARIZE, "solarize"),
    "SolarizeIncreasing": (Op.SOLARIZE, "solarize_inc"), "SolarizeAdd": (Op.SOLARIZE_ADD, "solarize_add"),
    "Color": (Op.COLOR, "enhance"), "ColorIncreasing": (Op.COLOR, "enhance_inc"),
    "Contrast": (Op.CONTRAST, "enhance"), "ContrastIncreasing": (Op.CONTRAST, "enhance_inc"),
    "Brightness": (Op.BRIGHTNESS, "enhance"), "BrightnessIncreasing": (Op.BRIGHTNESS, "enhance_inc"),
    "Sharpness": (Op.SHARPNESS, "enhance"), "SharpnessIncreasing": (Op.SHARPNESS, "enhance_inc"),
    "ShearX": (Op.SHEAR_X, "shear"), "ShearY": (Op.SHEAR_Y, "shear"),
    "TranslateXRel": (Op.TRANSLATE_X, "translate_rel"), "TranslateYRel": (Op.TRANSLATE_Y, "translate_rel"),
    "TranslateX": (Op.TRANSLATE_X, "translate_abs"), "TranslateY": (Op.TRANSLATE_Y, "translate_abs"),
}
_TIMM_RAND = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
              "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel",
              "TranslateYRel")
_TIMM_RAND_INC = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                  "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                  "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel",
                  "TranslateYRel")
# timm's 'tweights' choice weights (_RAND_WEIGHTED_0), drawn without replacement.
_TIMM_WEIGHTS = {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
                 "ColorIncreasing": .25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
                 "SolarizeIncreasing": .05, "SolarizeAdd": .05, "ContrastIncreasing": .05,
                 "BrightnessIncreasing": .05, "Equalize": .05, "PosterizeIncreasing": 0.05, "Invert": 0.05}

_TimmTable = tuple[tuple[tuple[str, float, int], ...], ...]
_TIMM_ORIGINAL: _TimmTable = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)
_TIMM_V0: _TimmTable = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)), (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)), (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)), (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)), (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)), (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)), (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)), (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)), (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)), (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)), (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)), (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)), (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)


def _researched(table: _TimmTable, posterize: str) -> _TimmTable:
    """timm's 'r' variants: the same table with another posterize rule."""
    return tuple(tuple((posterize if name.startswith("Posterize") else name, p, m) for name, p, m in sub)
                 for sub in table)


_TIMM_TABLES = {Table.ORIGINAL: _TIMM_ORIGINAL, Table.V0: _TIMM_V0,
                Table.ORIGINALR: _researched(_TIMM_ORIGINAL, "PosterizeIncreasing"),
                Table.V0R: _researched(_TIMM_V0, "PosterizeIncreasing")}


def _posterize_mask(bits: int) -> float:
    """The AND mask keeping the ``bits`` high bits (8 or more keeps all, 0 keeps none)."""
    bits = max(0, min(8, bits))
    return float(255 ^ ((1 << (8 - bits)) - 1))


@functools.lru_cache(maxsize=256)
def _linspace(start: float, end: float, steps: int) -> tuple[float, ...]:
    """``torch.linspace``'s float32 values, as torchvision builds its magnitude tables (numpy's
    float32 linspace is an ulp off at some bins: TrivialAugmentWide's translation at bin 15 is
    15.999999 there, which truncates to 15 pixels, not 16)."""
    import torch  # the policy's tables only; the draws stay numpy

    return tuple(float(v) for v in torch.linspace(start, end, steps).tolist())


def _tv_param(name: str, bin_: float, sign: float, hw: np.ndarray, wide: bool,
              bins: int) -> tuple[Op, float, float]:
    """torchvision v2: magnitude = linspace table[bin] (float32, as torch builds it), negated
    where the op is signed; TrivialAugmentWide's tables are the wide ones."""
    op, b = _TV_NAMES[name], int(bin_)
    h, w = hw
    if op in {Op.IDENTITY, Op.AUTO_CONTRAST, Op.EQUALIZE, Op.INVERT}:
        return op, 0.0, 0.0
    if op is Op.POSTERIZE:
        steps = 6 if wide else 4
        bits = np.round(np.float32(8) - np.float32(b) / np.float32((bins - 1) / steps))
        return op, _posterize_mask(int(bits)), 0.0
    if op is Op.SOLARIZE:
        # torchvision keeps the pixels below 255 * m (float64); for integer pixels "at or above"
        # that is "at or above" its ceiling, which float32 holds exactly (255 * m rounded to
        # float32 falls on an integer at even bins, 238.000001 to 238, inverting a pixel of 238)
        return op, float(math.ceil(255.0 * _linspace(1.0, 0.0, bins)[b])), 0.0
    top = {Op.SHEAR_X: 0.99 if wide else 0.3, Op.SHEAR_Y: 0.99 if wide else 0.3,
           Op.TRANSLATE_X: 32.0 if wide else 150.0 / 331.0 * w,
           Op.TRANSLATE_Y: 32.0 if wide else 150.0 / 331.0 * h, Op.ROTATE: 135.0 if wide else 30.0}
    magnitude = sign * _linspace(0.0, top.get(op, 0.99 if wide else 0.9), bins)[b]
    if op in GEOMETRIC:
        if op in {Op.TRANSLATE_X, Op.TRANSLATE_Y}:
            magnitude = float(int(magnitude))  # torchvision translates by int(magnitude) pixels
        return op, 0.0, magnitude
    return op, 1.0 + magnitude, 0.0  # the enhance ops take 1 + magnitude as their factor


def _timm_param(name: str, level: float, sign: float, hw: np.ndarray, translate_pct: float,
                translate_const: float) -> tuple[Op, float, float]:
    """timm: the level (0..10, noise included) through the op's level-to-argument rule."""
    op, rule = _TIMM_NAMES[name]
    f = level / _LEVEL_DENOM
    h, w = hw
    if rule == "none":
        return op, 0.0, 0.0
    if rule == "rotate":
        return op, 0.0, sign * f * 30.0
    if rule == "shear":
        return op, 0.0, sign * f * 0.3
    if rule == "translate_rel":
        return op, 0.0, sign * f * translate_pct * (w if op is Op.TRANSLATE_X else h)
    if rule == "translate_abs":
        return op, 0.0, sign * f * translate_const
    if rule == "enhance":
        return op, f * 1.8 + 0.1, 0.0
    if rule == "enhance_inc":
        return op, max(0.1, 1.0 + sign * f * 0.9), 0.0
    if rule.startswith("posterize"):
        bits = int(f * 4)
        bits = 4 - bits if rule == "posterize_inc" else bits + 4 if rule == "posterize_orig" else bits
        return op, _posterize_mask(bits), 0.0
    if rule.startswith("solarize") and rule != "solarize_add":
        thresh = min(256, int(f * 256))
        return op, float(256 - thresh if rule == "solarize_inc" else thresh), 0.0
    return op, float(min(128, int(f * 110))), 0.0  # solarize_add: +add below 128


def _tv_inverse(center: tuple[float, float], angle: float, translate: tuple[float, float],
                shear: tuple[float, float]) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1): output to input, in coordinates
    centred on the image centre."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty) + cx
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty) + cy
    return np.array(m).reshape(2, 3)


def _matrix(op: Op, amount: float, hw: np.ndarray, family: Family) -> np.ndarray:
    """The 2x3 map from output to input pixel coordinates (origin at the first pixel's corner,
    as DALI's warp and torchvision's grid both count), for one geometric op."""
    h, w = float(hw[0]), float(hw[1])
    if family is Family.TORCHVISION:
        corner = (-w * 0.5, -h * 0.5)  # F.affine(center=[0, 0]) shears about the top-left corner
        if op is Op.SHEAR_X:
            m = _tv_inverse(corner, 0.0, (0.0, 0.0), (math.degrees(math.atan(amount)), 0.0))
        elif op is Op.SHEAR_Y:
            m = _tv_inverse(corner, 0.0, (0.0, 0.0), (0.0, math.degrees(math.atan(amount))))
        elif op is Op.TRANSLATE_X:
            m = _tv_inverse((0.0, 0.0), 0.0, (amount, 0.0), (0.0, 0.0))
        elif op is Op.TRANSLATE_Y:
            m = _tv_inverse((0.0, 0.0), 0.0, (0.0, amount), (0.0, 0.0))
        else:  # F.rotate turns counter-clockwise about the centre: the inverse map turns by -angle
            m = _tv_inverse((0.0, 0.0), -amount, (0.0, 0.0), (0.0, 0.0))
        # centred -> corner coordinates: p_in = A (p_out - c) + t + c
        c = np.array([w * 0.5, h * 0.5])
        return np.concatenate([m[:, :2], (m[:, 2] + c - m[:, :2] @ c)[:, None]], axis=1).astype(np.float32)
    # timm: PIL's transform data, already an output-to-input map in corner coordinates
    if op is Op.SHEAR_X:
        data = (1.0, amount, 0.0, 0.0, 1.0, 0.0)
    elif op is Op.SHEAR_Y:
        data = (1.0, 0.0, 0.0, amount, 1.0, 0.0)
    elif op is Op.TRANSLATE_X:
        data = (1.0, 0.0, amount, 0.0, 1.0, 0.0)
    elif op is Op.TRANSLATE_Y:
        data = (1.0, 0.0, 0.0, 0.0, 1.0, amount)
    else:  # PIL's Image.rotate about (w/2, h/2), counter-clockwise
        angle = -math.radians(amount)
        a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
        cx, cy = w / 2.0, h / 2.0
        data = (a, b, a * -cx + b * -cy + cx, -b, a, -b * -cx + a * -cy + cy)
    return np.array(data, dtype=np.float32).reshape(2, 3)
