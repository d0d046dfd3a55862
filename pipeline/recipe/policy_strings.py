"""Auto-augment policies from torchvision's names and timm's config strings and hparams.

``policy_settings`` reads ``ta_wide``, ``ra``, ``imagenet`` and timm's ``rand-...``,
``original``, ``originalr``, ``v0`` and ``v0r`` strings (with timm's hparams) into the fields of
``policies.AutoAugment``, timm's defaults where a section or hparam is absent; whatever timm or
torchvision would mean differently is refused with a ``ConfigError`` that names it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from tilefeed.pipeline.recipe.policy_tables import _LEVEL_DENOM, Family, PolicyInterpolation, Policy, Table
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError

# timm's hparams that reach the ops; anything else is refused by name.
_HPARAMS = frozenset({"img_mean", "translate_const", "translate_pct", "interpolation",
                      "magnitude_std", "magnitude_max"})


def policy_settings(text: str, hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``AutoAugment`` fields that torchvision's names or timm's config strings stand for.

    Parameters
    ----------
    text : str
        A policy name or timm config string, as ``AutoAugment.parse`` lists them.
    hparams : mapping, optional
        timm's hparams, as ``AutoAugment.parse`` lists them.

    Returns
    -------
    dict of str to Any
        Keyword arguments of ``AutoAugment`` (``policy`` always; the rest where they differ
        from its defaults).

    Raises
    ------
    ConfigError
        For AugMix, timm's ``3a`` sets, the removed ``w`` section, lanczos interpolation,
        and anything else that is not supported, naming it.
    """
    simple = {"ta_wide": Policy.TRIVIAL_WIDE, "trivial_wide": Policy.TRIVIAL_WIDE,
              "ra": Policy.RAND, "imagenet": Policy.AUTO_IMAGENET}
    if text in simple:
        if hparams:
            raise ConfigError(f"auto-augment {text!r} takes no timm hparams: {sorted(hparams)}")
        return {"policy": simple[text]}
    head, *sections = text.split("-")
    hp = dict(hparams or {})
    unknown = sorted(set(hp) - _HPARAMS)
    if unknown:
        raise ConfigError(f"auto-augment hparams not supported: {unknown}")
    if head == "rand":
        return _timm_rand(text, sections, hp)
    if head in {t.value for t in Table} - {"imagenet"}:
        for s in sections:
            key, val = _section(text, s)
            if key != "mstd":
                raise ConfigError(f"auto-augment {text!r}: section {s!r} not supported")
            hp.setdefault("magnitude_std", float(val))
        return {"policy": Policy.AUTO_IMAGENET, "family": Family.TIMM, "table": Table(head),
                **_timm_common(hp)}
    raise ConfigError(f"auto-augment {text!r} is not supported (torchvision: ta_wide, ra, imagenet; "
                      f"timm: rand-..., original, originalr, v0, v0r)")


def _timm_rand(text: str, sections: list[str], hp: dict[str, Any]) -> dict[str, Any]:
    """timm's ``rand-...`` sections (and hparams) as ``AutoAugment`` fields."""
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
    return {"policy": Policy.RAND, "family": Family.TIMM, "num_ops": num_ops, "magnitude": magnitude,
            "prob": prob, "increasing": increasing, "weighted": weighted, **_timm_common(hp)}


def _section(text: str, s: str) -> tuple[str, str]:
    parts = re.split(r"(\d.*)", s)
    if len(parts) < 2:
        raise ConfigError(f"auto-augment {text!r}: section {s!r} not supported")
    return parts[0], parts[1]


def _timm_common(hp: Mapping[str, Any]) -> dict[str, Any]:
    """AutoAugment fields from timm's hparams (timm's defaults where absent)."""
    # timm's default without an interpolation hparam: bilinear or bicubic per op (_RANDOM_INTERPOLATION)
    interp = choice(PolicyInterpolation, str(hp.get("interpolation", "random")).lower(),
                    "auto-augment interpolation")
    fill = hp.get("img_mean", (128, 128, 128))
    fill = tuple(int(f) for f in (fill if isinstance(fill, (tuple, list)) else (fill,) * 3))
    mmax = hp.get("magnitude_max")
    return {"mstd": float(hp.get("magnitude_std", 0.0)),
            "mmax": float(mmax) if mmax else _LEVEL_DENOM, "fill": fill,
            "interpolation": interp, "translate_pct": float(hp.get("translate_pct", 0.45)),
            "translate_const": float(hp.get("translate_const", 250))}
