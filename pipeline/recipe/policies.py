"""Auto-augment policies (TrivialAugmentWide, RandAugment, AutoAugment) as host-side draws.

Which operations a sample gets, their magnitudes and signs are drawn on the host from
(seed, epoch, sample key) with the counter-based generator of ``pipeline.engine.crops``, in a
counter space of their own (the seed is mixed with a fixed constant), so the crop windows and
flips stay what they were and a resumed run sees the same operations. The graph
(``policy_ops.apply_policy``) then only applies what it is told: per sample and per op slot, an
op index, one scalar parameter and, for geometric ops, a 2x3 inverse affine matrix.

Two families share the op set but not the arithmetic from magnitude to parameter:

- torchvision v2 (``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment(IMAGENET)``): magnitude
  bins over linspace tables, a fair sign, nearest interpolation and fill 0 by default.
- timm (``rand-...`` strings, ``original``/``originalr``/``v0``/``v0r``): magnitude levels out of
  10 with optional Gaussian (``mstd``) or uniform (``mstd`` > 100) noise clipped to
  ``[0, mmax]``, per-op probability, PIL's op semantics (enhance factors, relative translation,
  solarize-add, posterize bit counts), fill ``img_mean`` (128 by default).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.store.errors import ConfigError

# Mixed into the seed so the policy's draws never share a counter with the crops' draws.
STREAM = "tilefeed.recipe.policies"  # the policies' draw stream (planning.counters.stream_seed)
# Uniforms per op slot: op choice, probability, magnitude bin or noise (two for Box-Muller), sign.
_PER_SLOT = 5
# The geometric ops' filter under ``Interpolation.RANDOM``: a stream of its own, one uniform per
# slot, so the op, magnitude and sign draws above keep their counters and values.
FILTER_STREAM = "tilefeed.recipe.policies.filter"
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


class Interpolation(StrEnum):
    """Interpolation of the geometric ops.

    ``RANDOM`` is timm's default (no ``interpolation`` in its hparams): each op slot of each
    sample picks bilinear or bicubic (``RANDOM_FILTERS``) with even odds. PIL applies the
    bicubic slots bicubic on the host path; DALI's warp has no cubic filter, so the graph warps
    them bilinear.
    """

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    RANDOM = "random"


# What ``aa_filter`` indexes under ``Interpolation.RANDOM``: timm's _RANDOM_INTERPOLATION, in its order.
RANDOM_FILTERS: tuple[str, ...] = ("bilinear", "bicubic")
# Every per-sample input a policy may send (``AutoAugment.input_names`` picks its own).
INPUT_NAMES: tuple[str, ...] = ("aa_op", "aa_param", "aa_matrix", "aa_filter")
# The inputs only the host kernels read: DALI's warp has no cubic filter, so the graph warps every
# slot bilinear and is not sent the drawn filter (an unread input would still be fed to DALI).
HOST_ONLY_INPUTS: tuple[str, ...] = ("aa_filter",)


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

# timm's hparams that reach the ops; anything else is refused by name.
_HPARAMS = frozenset({"img_mean", "translate_const", "translate_pct", "interpolation",
                      "magnitude_std", "magnitude_max"})


@dataclass(frozen=True)
class AutoAugment:
    """An automatic augmentation policy, drawn on the host and applied by the graph.

    Parameters
    ----------
    policy : Policy
        TrivialAugmentWide (one op per sample), RandAugment (``num_ops`` ops) or AutoAugment's
        ImageNet sub-policies (two ops, each with its probability).
    family : Family
        torchvision v2's op tables and magnitude arithmetic, or timm's.
    num_ops : int
        RandAugment: ops per sample (torchvision's ``num_ops``, timm's ``n``).
    magnitude : float
        RandAugment: torchvision's magnitude bin (an int below ``num_magnitude_bins``), or timm's
        level out of 10 (``m``).
    num_magnitude_bins : int
        torchvision: bins of each magnitude linspace (31 for TrivialAugmentWide and
        RandAugment; AutoAugment's table uses 10).
    mstd : float
        timm: standard deviation of Gaussian noise on the level; ``inf`` draws the level
        uniformly in ``[0, magnitude]`` (timm's ``mstd`` over 100).
    mmax : float
        timm: the level is clipped to ``[0, mmax]``.
    increasing : bool
        timm ``inc1``: the op variants whose strength grows with the level.
    prob : float
        timm RandAugment: probability each chosen op is applied (``p``, default 0.5).
    weighted : bool
        timm ``tweights``: op choice by timm's weights, without replacement.
    table : Table
        AutoAugment: the sub-policy table.
    fill : tuple of int
        RGB fill of geometric ops' uncovered pixels (torchvision ``fill``, timm ``img_mean``).
    interpolation : Interpolation
        Interpolation of the geometric ops; ``random`` draws bilinear or bicubic per slot.
    translate_pct : float
        timm: relative translation range at level 10 (``translate_pct``).
    translate_const : float
        timm: absolute translation range in pixels at level 10 (``translate_const``; only
        timm's absolute translate ops use it, which none of the supported strings choose).
    """

    policy: Policy
    family: Family = Family.TORCHVISION
    num_ops: int = 2
    magnitude: float = 9
    num_magnitude_bins: int = 31
    mstd: float = 0.0
    mmax: float = _LEVEL_DENOM
    increasing: bool = False
    prob: float = 1.0
    weighted: bool = False
    table: Table = Table.IMAGENET
    fill: tuple[int, int, int] = (0, 0, 0)
    interpolation: Interpolation = Interpolation.NEAREST
    translate_pct: float = 0.45
    translate_const: float = 250.0
    _choices: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tv = self.family is Family.TORCHVISION
        if self.policy is Policy.AUTO_IMAGENET and tv != (self.table is Table.IMAGENET):
            raise ConfigError(f"auto-augment table {self.table} does not belong to {self.family}")
        if self.policy is Policy.RAND and self.num_ops < 0:
            raise ConfigError(f"auto-augment num_ops must be >= 0, got {self.num_ops}")
        if tv and self.policy is Policy.RAND and not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ConfigError(f"auto-augment magnitude {self.magnitude} is not a bin below "
                              f"num_magnitude_bins {self.num_magnitude_bins}")
        if not 0.0 <= self.prob <= 1.0:
            raise ConfigError(f"auto-augment prob must be in [0, 1], got {self.prob}")
        if self.interpolation not in set(Interpolation):
            raise ConfigError(f"auto-augment interpolation {self.interpolation!r} not supported "
                              f"({', '.join(i.value for i in Interpolation)})")
        # a plain string becomes the enum, which the draws and kernels compare by identity
        object.__setattr__(self, "interpolation", Interpolation(self.interpolation))
        if len(self.fill) != 3 or not all(0 <= f <= 255 for f in self.fill):
            raise ConfigError(f"auto-augment fill must be three values in 0..255, got {self.fill}")
        choices: tuple[str, ...]
        if self.policy is Policy.TRIVIAL_WIDE:
            choices = _TV_RAND_OPS
        elif self.policy is Policy.RAND:
            choices = (_TV_RAND_OPS if tv else tuple(_TIMM_WEIGHTS) if self.weighted
                       else _TIMM_RAND_INC if self.increasing else _TIMM_RAND)
        else:
            choices = ()
        object.__setattr__(self, "_choices", choices)

    # -- parsing ---------------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, hparams: Mapping[str, Any] | None = None) -> AutoAugment:
        """A policy from torchvision's names or timm's config strings.

        Parameters
        ----------
        text : str
            torchvision: ``ta_wide`` (TrivialAugmentWide), ``ra`` (RandAugment, num_ops 2,
            magnitude 9), ``imagenet`` (AutoAugment's ImageNet policy). timm: ``rand-...``
            with sections ``m``, ``n``, ``p``, ``mstd``, ``mmax``, ``inc``, ``tweights``;
            ``original``, ``originalr``, ``v0``, ``v0r`` with an optional ``mstd`` section.
        hparams : mapping, optional
            timm's hparams: ``img_mean`` (fill), ``translate_pct``, ``translate_const``,
            ``interpolation`` (``nearest``, ``bilinear`` or ``random``), ``magnitude_std``,
            ``magnitude_max``. Without ``interpolation`` timm strings take timm's own default,
            ``random``: bilinear or bicubic per op slot and sample.

        Returns
        -------
        AutoAugment

        Raises
        ------
        ConfigError
            For AugMix, timm's ``3a`` sets, the removed ``w`` section, bicubic interpolation,
            and anything else that is not supported, naming it.
        """
        simple = {"ta_wide": Policy.TRIVIAL_WIDE, "trivial_wide": Policy.TRIVIAL_WIDE,
                  "ra": Policy.RAND, "imagenet": Policy.AUTO_IMAGENET}
        if text in simple:
            if hparams:
                raise ConfigError(f"auto-augment {text!r} takes no timm hparams: {sorted(hparams)}")
            return cls(simple[text])
        head, *sections = text.split("-")
        hp = dict(hparams or {})
        unknown = sorted(set(hp) - _HPARAMS)
        if unknown:
            raise ConfigError(f"auto-augment hparams not supported: {unknown}")
        if head == "rand":
            return cls._timm_rand(text, sections, hp)
        if head in {t.value for t in Table} - {"imagenet"}:
            for s in sections:
                key, val = _section(text, s)
                if key != "mstd":
                    raise ConfigError(f"auto-augment {text!r}: section {s!r} not supported")
                hp.setdefault("magnitude_std", float(val))
            return cls(Policy.AUTO_IMAGENET, Family.TIMM, table=Table(head),
                       **_timm_common(hp))
        raise ConfigError(f"auto-augment {text!r} is not supported (torchvision: ta_wide, ra, imagenet; "
                          f"timm: rand-..., original, originalr, v0, v0r)")

    @classmethod
    def _timm_rand(cls, text: str, sections: list[str], hp: dict[str, Any]) -> AutoAugment:
        magnitude, num_ops, prob, increasing, weighted = _LEVEL_DENOM, 2, 0.5, False, False
        for s in sections:
            if s.startswith("t"):
                if s != "tweights":
                    raise ConfigError(f"auto-augment {text!r}: transform set {s[1:]!r} not supported")
                weighted = True
                continue
            key, val = _section(text, s)
            if key == "mstd":
                mstd = float(val)
                hp.setdefault("magnitude_std", math.inf if mstd > 100 else mstd)
            elif key == "mmax":
                hp.setdefault("magnitude_max", int(val))
            elif key == "inc":
                increasing = bool(int(val))
            elif key == "m":
                magnitude = int(val)
            elif key == "n":
                num_ops = int(val)
            elif key == "p":
                prob = float(val)
            else:  # timm asserts on these too ('w' was removed in favour of 't')
                raise ConfigError(f"auto-augment {text!r}: section {s!r} not supported")
        return cls(Policy.RAND, Family.TIMM, num_ops=num_ops, magnitude=magnitude, prob=prob,
                   increasing=increasing, weighted=weighted, **_timm_common(hp))

    # -- what the graph takes --------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Op slots per sample, applied one after another."""
        return {Policy.TRIVIAL_WIDE: 1, Policy.RAND: self.num_ops, Policy.AUTO_IMAGENET: 2}[self.policy]

    def ops(self) -> tuple[Op, ...]:
        """The ops this policy can apply, identity included (a skipped op is the identity)."""
        if self.policy is Policy.AUTO_IMAGENET:
            names = {name for sub in self._table() for name, _, _ in sub}
        else:
            names = set(self._choices)
        used = {self._op_of(name) for name in names} | {Op.IDENTITY}
        return tuple(op for op in OPS if op in used)

    def input_names(self) -> tuple[str, ...]:
        """Names of the per-sample inputs ``draw`` returns, in the graph's order: ``aa_filter``
        only under ``Interpolation.RANDOM`` (a fixed filter needs no per-sample input)."""
        return INPUT_NAMES if self.interpolation is Interpolation.RANDOM else INPUT_NAMES[:3]

    @staticmethod
    def input_dtypes() -> dict[str, np.dtype[Any]]:
        """numpy dtype of each input: op index per slot (int32), scalar parameter per slot
        (float32), inverse affine matrix per slot (float32, shape (slots, 2, 3)), filter index
        into ``RANDOM_FILTERS`` per slot (int32)."""
        return {"aa_op": np.dtype(np.int32), "aa_param": np.dtype(np.float32),
                "aa_matrix": np.dtype(np.float32), "aa_filter": np.dtype(np.int32)}

    # -- draws -----------------------------------------------------------------------------------

    def draw(self, seed: int, epoch: int, keys: np.ndarray,
             size: int | tuple[int, int] | np.ndarray = 224) -> dict[str, np.ndarray]:
        """Per sample: which op each slot applies, its parameter and its affine matrix.

        Parameters
        ----------
        seed, epoch : int
            The run's seed and the epoch.
        keys : ndarray
            One key per sample (the same keys the crops are drawn from); a sample's draws depend
            on (seed, epoch, key) alone, whatever batch it is in.
        size : int, (h, w) or ndarray (n, 2)
            The size of the images the ops see (after crop and resize): translations scale
            with it and rotations turn about its centre.

        Returns
        -------
        dict of str to ndarray
            ``aa_op`` (n, slots) int32 index into ``OPS``; ``aa_param`` (n, slots) float32:
            the enhance factor (brightness, color, contrast, sharpness), the posterize bit mask,
            the solarize threshold (pixels at or above it are inverted), the solarize-add
            amount, else 0; ``aa_matrix`` (n, slots, 2, 3) float32: for geometric ops the map
            from output to input pixel coordinates (origin at the first pixel's corner), else
            the identity; under ``Interpolation.RANDOM`` also ``aa_filter`` (n, slots) int32:
            index into ``RANDOM_FILTERS`` of each slot's filter (drawn for every slot, as timm
            draws one per op call; only the geometric ops use it).
        """
        keys = np.asarray(keys)
        n, slots = len(keys), self.slots
        hw = np.broadcast_to(np.asarray(size, dtype=np.float64), (n, 2)) if np.ndim(size) != 0 \
            else np.full((n, 2), float(np.asarray(size)))
        u = uniforms(stream_seed(seed, STREAM), epoch, keys, 1 + _PER_SLOT * max(slots, 1))
        chosen, strength, sign = self._choose(u, n)
        ops = np.zeros((n, slots), np.int32)
        params = np.zeros((n, slots), np.float32)
        matrices = np.broadcast_to(np.eye(2, 3, dtype=np.float32), (n, slots, 2, 3)).copy()
        for i in range(n):
            for k in range(slots):
                name = chosen[i][k]
                if name is None:
                    continue
                op, param, shift = self._param(name, strength[i, k], sign[i, k], hw[i])
                ops[i, k] = OPS.index(op)
                params[i, k] = param
                if op in GEOMETRIC:
                    matrices[i, k] = _matrix(op, shift, hw[i], self.family)
        made = {"aa_op": ops, "aa_param": params, "aa_matrix": matrices}
        if self.interpolation is Interpolation.RANDOM:
            made["aa_filter"] = self.filters(seed, epoch, keys)
        return made

    def filters(self, seed: int, epoch: int, keys: np.ndarray) -> np.ndarray:
        """Per sample and slot, the index into ``RANDOM_FILTERS`` of the geometric ops' filter
        (timm's ``random.choice``: even odds), from (seed, epoch, key) on ``FILTER_STREAM``.

        Parameters
        ----------
        seed, epoch : int
            The run's seed and the epoch.
        keys : ndarray
            One key per sample.

        Returns
        -------
        ndarray
            (n, slots) int32.
        """
        keys = np.asarray(keys)
        u = uniforms(stream_seed(seed, FILTER_STREAM), epoch, keys, max(self.slots, 1))[:, :self.slots]
        n = len(RANDOM_FILTERS)
        return np.minimum((u * n).astype(np.int64), n - 1).astype(np.int32)

    def _choose(self, u: np.ndarray, n: int) -> tuple[list[list[str | None]], np.ndarray, np.ndarray]:
        """Op names per slot (None: skipped), the level or magnitude bin, and the sign (+1/-1)."""
        slots = self.slots
        per = u[:, 1:1 + _PER_SLOT * max(slots, 1)].reshape(n, max(slots, 1), _PER_SLOT)[:, :slots]
        pick, p_apply, m1, m2, s = (per[..., j] for j in range(_PER_SLOT))
        # torchvision negates when rand <= 0.5; timm when random() > 0.5: both a fair coin
        sign = np.where(s < 0.5, -1.0, 1.0)
        chosen: list[list[str | None]] = [[None] * slots for _ in range(n)]
        strength = np.zeros((n, slots))
        tv = self.family is Family.TORCHVISION
        if self.policy is Policy.AUTO_IMAGENET:
            table = self._table()
            sub = np.minimum((u[:, 0] * len(table)).astype(np.int64), len(table) - 1)
            for i in range(n):
                for k, (name, p, m) in enumerate(table[sub[i]]):
                    if p_apply[i, k] <= p:  # torchvision: rand <= p; timm skips when random() > p
                        chosen[i][k] = name
                        strength[i, k] = (m if m is not None else 0) if tv else \
                            self._noisy(m, m1[i, k], m2[i, k])
            return chosen, strength, sign
        names = self._choices
        if self.weighted:
            weights = np.array([_TIMM_WEIGHTS[c] for c in names], dtype=np.float64)
            for i in range(n):
                left = weights.copy()
                for k in range(slots):  # without replacement, as numpy's choice(replace=False)
                    cdf = np.cumsum(left) / left.sum()
                    j = min(int(np.searchsorted(cdf, pick[i, k], side="right")), len(names) - 1)
                    left[j] = 0.0
                    chosen[i][k] = names[j]
        else:
            idx = np.minimum((pick * len(names)).astype(np.int64), len(names) - 1)
            for i in range(n):
                chosen[i] = [names[j] for j in idx[i]]
        if tv:
            if self.policy is Policy.TRIVIAL_WIDE:  # magnitude bin uniform over the bins
                strength = np.minimum((m1 * self.num_magnitude_bins).astype(np.int64),
                                      self.num_magnitude_bins - 1).astype(np.float64)
            else:
                strength[:] = self.magnitude
        else:
            for i in range(n):
                for k in range(slots):
                    if self.prob < 1.0 and p_apply[i, k] > self.prob:  # timm: skip when random() > p
                        chosen[i][k] = None
                    else:
                        strength[i, k] = self._noisy(self.magnitude, m1[i, k], m2[i, k])
        return chosen, strength, sign

    def _noisy(self, level: float, u1: float, u2: float) -> float:
        """timm's magnitude noise: Gaussian (Box-Muller of two uniforms) or uniform, then clipped."""
        if self.mstd == math.inf:
            level = u1 * level
        elif self.mstd > 0:
            level = level + self.mstd * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
        return max(0.0, min(level, self.mmax or _LEVEL_DENOM))

    def _table(self) -> tuple[tuple[tuple[str, float, int | None], ...], ...]:
        return _TV_IMAGENET if self.table is Table.IMAGENET else _TIMM_TABLES[self.table]

    def _op_of(self, name: str) -> Op:
        return _TV_NAMES[name] if self.family is Family.TORCHVISION else _TIMM_NAMES[name][0]

    def _param(self, name: str, strength: float, sign: float, hw: np.ndarray) -> tuple[Op, float, float]:
        """(op, scalar parameter, geometric amount) for one applied op."""
        if self.family is Family.TORCHVISION:
            return _tv_param(name, strength, sign, hw, self.policy is Policy.TRIVIAL_WIDE, self._bins())
        return _timm_param(name, strength, sign, hw, self.translate_pct, self.translate_const)

    def _bins(self) -> int:
        return 10 if self.policy is Policy.AUTO_IMAGENET else self.num_magnitude_bins


def _section(text: str, s: str) -> tuple[str, str]:
    parts = re.split(r"(\d.*)", s)
    if len(parts) < 2:
        raise ConfigError(f"auto-augment {text!r}: section {s!r} not supported")
    return parts[0], parts[1]


def _timm_common(hp: Mapping[str, Any]) -> dict[str, Any]:
    """AutoAugment fields from timm's hparams (timm's defaults where absent)."""
    # timm's default without an interpolation hparam: bilinear or bicubic per op (_RANDOM_INTERPOLATION)
    interp = str(hp.get("interpolation", "random")).lower()
    if interp not in set(Interpolation):
        raise ConfigError(f"auto-augment interpolation {interp!r} not supported (nearest, bilinear, random)")
    fill = hp.get("img_mean", (128, 128, 128))
    fill = tuple(int(f) for f in (fill if isinstance(fill, (tuple, list)) else (fill,) * 3))
    mmax = hp.get("magnitude_max")
    return {"mstd": float(hp.get("magnitude_std", 0.0)),
            "mmax": float(mmax) if mmax else _LEVEL_DENOM, "fill": fill,
            "interpolation": Interpolation(interp), "translate_pct": float(hp.get("translate_pct", 0.45)),
            "translate_const": float(hp.get("translate_const", 250))}


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
