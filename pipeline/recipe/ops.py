"""A recipe's pixel operations as DALI graph functions, on uint8 HWC images after the resize.

The Loader applies them on a GPU; on the CPU its batch source applies the same draws with PIL
instead (``host_ops``), and the graph only flips and normalises. They run on the CPU and on the
GPU backend alike; their parameters are the per-sample inputs
``pipeline.recipe.draws`` computes on the host (CPU nodes: DALI's arithmetic moves them next
to GPU images itself). Each follows torchvision v2's kernel for uint8 images operation by
operation, float32 arithmetic and truncation back to uint8 included:

- brightness ``b``: ``clamp(x * b, 0, 255)``;
- contrast ``c``: a blend with the mean of the image's luma (luma floored first);
- saturation ``s``: a blend with the floored luma, per pixel;
- hue ``h``: torchvision's RGB -> HSV, ``H + h`` modulo 1, HSV -> RGB, written out here with
  DALI's arithmetic (DALI's ``fn.hue`` rotates in YIQ space, a linear approximation that differs
  from torchvision's HSV shift: not used);
- grayscale: the truncated luma (0.2989 R + 0.587 G + 0.114 B) in all three channels;
- channel permutation: each sample's 3x3 permutation matrix by ``coord_transform`` (each
  output byte one input byte, times 1, exact);

and colour jitter and the photometric distortion apply their adjustments in each sample's
drawn order, an auto-augment policy
its drawn ops (``policy_ops``), both by DALI conditionals: the graph is built with
``enable_conditionals`` when a recipe has either (``conditional``).
"""

from __future__ import annotations

from typing import Any

import nvidia.dali.math as dmath
from nvidia.dali import fn, types

from tilefeed.pipeline.recipe.policy_ops import apply_policy
from tilefeed.pipeline.recipe.recipe import JITTER_ADJUSTMENTS, Recipe

LUMA = (0.2989, 0.587, 0.114)  # torchvision's _rgb_to_grayscale_image weights
TO_UINT8 = 255 + 1.0 - 1e-3  # torchvision's float -> uint8 scale (to_dtype_image, eps 1e-3)

Node = Any  # a DALI DataNode


def conditional(recipe: Recipe | None, train: bool) -> bool:
    """The graph needs DALI conditionals (``enable_conditionals=True``) for ``recipe``."""
    return recipe is not None and train and (recipe.jitter is not None or recipe.auto_augment is not None
                                             or recipe.distort is not None)


def apply(images: Node, inputs: dict[str, Node], recipe: Recipe) -> Node:
    """``recipe``'s training operations on uint8 HWC ``images``, in timm's order (vertical flip,
    auto-augment, colour jitter, grayscale) after torchvision's ``ssd`` preset's photometric
    distortion; the horizontal flip is left to ``crop_mirror_normalize``. ``inputs`` holds the
    per-sample inputs ``draws.input_names`` names."""
    if "pd_order" in inputs:
        images = photometric_distort(images, inputs)
    if "vflip" in inputs:
        images = fn.flip(images, horizontal=0, vertical=inputs["vflip"])
    if recipe.auto_augment is not None:
        images = apply_policy(images, inputs, recipe.auto_augment)
    jitter = recipe.jitter
    if jitter is not None:
        if jitter.p < 1:
            if inputs["jitter"] == 1:  # noqa: SIM108 (a DALI conditional: per sample)
                images = color_jitter(images, inputs["order"], _factors(inputs, ""))
        else:
            images = color_jitter(images, inputs["order"], _factors(inputs, ""))
    if "grayscale" in inputs:
        images = random_grayscale(images, inputs["grayscale"])
    for operation, settings in recipe.pixel_operations():
        images = operation.graph(images, inputs, settings)
    return images


def _factors(inputs: dict[str, Node], prefix: str) -> dict[str, Node]:
    """The adjustments' factors present in ``inputs`` under ``prefix`` + their names, by name."""
    return {name: inputs[prefix + name] for name in JITTER_ADJUSTMENTS if prefix + name in inputs}


def color_jitter(images: Node, order: Node, factors: dict[str, Node]) -> Node:
    """torchvision v2 ``ColorJitter.transform``: each adjustment of ``factors`` applied in the
    order of the sample's ``order`` (four slots, each an adjustment's index or none past them)."""
    adjust = {"brightness": brightness, "contrast": contrast, "saturation": saturation, "hue": hue}
    for slot in range(4):
        which = order[slot]
        for k, name in enumerate(JITTER_ADJUSTMENTS):
            if name in factors:
                if which == k:  # a DALI conditional: only this slot's samples take the branch
                    images = adjust[name](images, factors[name])
    return images


def photometric_distort(images: Node, inputs: dict[str, Node]) -> Node:
    """torchvision v2 ``RandomPhotometricDistort.transform``: the adjustments drawn to apply, in
    the drawn order (``pd_order``), then the channels permuted (``pd_permutation``, the identity
    where none was drawn)."""
    images = color_jitter(images, inputs["pd_order"], _factors(inputs, "pd_"))
    return permute_channels(images, inputs["pd_permutation"])


def permute_channels(images: Node, matrix: Node) -> Node:
    """``permute_channels`` by each sample's 3x3 permutation ``matrix`` (a CPU input, as
    ``coord_transform`` takes its argument inputs): output channel c = row c times the pixel."""
    return fn.reshape(fn.coord_transform(images, M=matrix, dtype=types.UINT8), layout="HWC")


def _float(images: Node) -> Node:
    return fn.cast(images, dtype=types.FLOAT)


def _hwc(values: Node) -> Node:
    """uint8 ``values`` with their HWC layout back (arithmetic drops it; the branches of a
    conditional must agree on it): a view, nothing copied."""
    return fn.reshape(fn.cast(values, dtype=types.UINT8), layout="HWC")


def _uint8(values: Node) -> Node:
    """torchvision's ``clamp(0, 255)`` then ``.to(uint8)``, which truncates."""
    return _hwc(dmath.floor(dmath.clamp(values, 0.0, 255.0)))


def luma(x: Node) -> Node:
    """float HW1 luma of float HWC ``x``, floored as torchvision floors it for uint8 images."""
    return dmath.floor(fn.coord_transform(x, M=list(LUMA), dtype=types.FLOAT))


def brightness(images: Node, factor: Node) -> Node:
    """``adjust_brightness``: ``x * factor``, clamped, truncated."""
    return _uint8(_float(images) * factor)


def _blend(x: Node, other: Node, factor: Node) -> Node:
    """torchvision's ``_blend``: ``x * factor + other * (1 - factor)``, clamped, truncated."""
    return _uint8(x * factor + other * (1.0 - factor))


def contrast(images: Node, factor: Node) -> Node:
    """``adjust_contrast``: a blend with the mean of the floored luma."""
    x = _float(images)
    return _blend(x, fn.reductions.mean(luma(x)), factor)


def saturation(images: Node, factor: Node) -> Node:
    """``adjust_saturation``: a blend with the floored luma, pixel by pixel."""
    x = _float(images)
    return _blend(x, luma(x), factor)


def random_grayscale(images: Node, bit: Node) -> Node:
    """``RandomGrayscale``'s kernel where ``bit`` is 1: the truncated luma in three channels
    (the images as they are where it is 0; both exact in float)."""
    x = _float(images)
    gray = dmath.floor(fn.coord_transform(x, M=list(LUMA) * 3, dtype=types.FLOAT))
    g = fn.cast(bit, dtype=types.FLOAT)
    return _hwc(gray * g + x * (1.0 - g))


def hue(images: Node, shift: Node) -> Node:
    """``adjust_hue``: torchvision's ``_rgb_to_hsv``, the hue turned by ``shift`` (modulo 1),
    ``_hsv_to_rgb``, each step as torchvision writes it in float32."""
    x = _float(images) * (1.0 / 255.0)
    r, g, b = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    maxc = dmath.max(dmath.max(r, g), b)
    minc = dmath.min(dmath.min(r, g), b)
    eqc = fn.cast(maxc == minc, dtype=types.FLOAT)
    span = maxc - minc
    s = span / (maxc * (1.0 - eqc) + eqc)  # where(eqc, 1, maxc)
    divisor = span + eqc  # where(eqc, 1, span): span is 0 there
    rc, gc, bc = (maxc - r) / divisor, (maxc - g) / divisor, (maxc - b) / divisor
    neq_r = maxc != r
    eq_g = maxc == g
    hg = (rc + 2.0 - bc) * fn.cast(eq_g & neq_r, dtype=types.FLOAT)
    hr = (bc - gc) * fn.cast(maxc == r, dtype=types.FLOAT)
    hb = (gc + 4.0 - rc) * fn.cast(neq_r & (maxc != g), dtype=types.FLOAT)
    h = hr + hg + hb
    h = h * (1.0 / 6.0) + 1.0
    h = h - dmath.floor(h)  # fmod(h, 1) of a positive h
    h = h + shift
    h = h - dmath.floor(h)  # remainder(h, 1)
    # _hsv_to_rgb
    h6 = h * 6.0
    i = dmath.floor(h6)
    f = h6 - i
    sxf = s * f
    one_minus_s = 1.0 - s
    q = dmath.clamp((1.0 - sxf) * maxc, 0.0, 1.0)
    t = dmath.clamp((sxf + one_minus_s) * maxc, 0.0, 1.0)
    p = dmath.clamp(one_minus_s * maxc, 0.0, 1.0)
    sector = [fn.cast(i == float(k), dtype=types.FLOAT) for k in range(7)]
    m = [sector[0] + sector[6], *sector[1:6]]  # i modulo 6: h may round up to 1.0 exactly
    red = maxc * (m[0] + m[5]) + q * m[1] + p * (m[2] + m[3]) + t * m[4]
    green = t * m[0] + maxc * (m[1] + m[2]) + q * m[3] + p * (m[4] + m[5])
    blue = p * (m[0] + m[1]) + t * m[2] + maxc * (m[3] + m[4]) + q * m[5]
    rgb = fn.stack(red, green, blue, axis=2)
    return _hwc(dmath.floor(rgb * TO_UINT8))
