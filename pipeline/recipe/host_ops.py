"""A recipe's per-sample pixel operations on the host, as PIL (pillow-simd) calls.

On the CPU the batch source cuts and resizes each training window with pillow-simd in its
threads (``engine.batch_source``); the same threads then apply the sample's drawn operations to
the resized picture here, where DALI's CPU operators would take a millisecond and more a sample
(a policy's conditionals, some sixty operations for a hue shift). The order is ``ops.apply``'s
(vertical flip, auto-augment, colour jitter, grayscale; the horizontal flip stays with the
graph's ``crop_mirror_normalize``), the parameters exactly those ``draws.draw`` and
``AutoAugment.draw`` give the graph on a GPU. Each operation is the PIL call torchvision's PIL
kernels and timm's ``auto_augment`` make, so the pixels are those of torchvision's and timm's
own PIL pipelines:

- the enhance ops (brightness, color or saturation, contrast, sharpness): ``ImageEnhance``;
- posterize, solarize, autocontrast, equalize, invert: ``ImageOps`` or the same lookup table;
- the geometric ops: ``Image.transform(AFFINE)`` with the drawn 2x3 output-to-input matrix in
  corner coordinates, which is what PIL's AFFINE data is (PIL samples at pixel centres,
  ``x + 0.5``, as DALI's warp does);
- hue: torchvision's PIL ``adjust_hue``, a turn of the uint8 hue of PIL's HSV;
- grayscale: PIL's ``L`` conversion in three channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from tilefeed.pipeline.recipe.policies import GEOMETRIC, OPS, AutoAugment, Interpolation, Op
from tilefeed.pipeline.recipe.recipe import JITTER_ADJUSTMENTS, Recipe

# the per-sample inputs (``draws.input_names``) these kernels take: on the host-resize path the
# batch source applies them and the graph declares none of them
INPUTS: tuple[str, ...] = ("vflip", "grayscale", "jitter", "order", *JITTER_ADJUSTMENTS,
                           *AutoAugment.input_names())
SOLARIZE_ADD_BELOW = 128  # timm's solarize_add threshold: only pixels below it are raised
_RESAMPLE = {Interpolation.NEAREST: Image.Resampling.NEAREST, Interpolation.BILINEAR: Image.Resampling.BILINEAR}
_ENHANCE: dict[Op, Any] = {Op.BRIGHTNESS: ImageEnhance.Brightness, Op.COLOR: ImageEnhance.Color,
                           Op.CONTRAST: ImageEnhance.Contrast, Op.SHARPNESS: ImageEnhance.Sharpness}


def applies(recipe: Recipe | None) -> bool:
    """``recipe`` has a pixel operation for these kernels (vertical flip, auto-augment, colour
    jitter or grayscale)."""
    return recipe is not None and (recipe.vflip > 0 or recipe.grayscale > 0 or recipe.jitter is not None
                                   or recipe.auto_augment is not None)


def sample(inputs: Mapping[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Sample ``k``'s values of the batch's per-sample ``inputs`` that these kernels take."""
    return {name: values[k] for name, values in inputs.items() if name in INPUTS}


def apply(image: Image.Image, inputs: Mapping[str, Any], recipe: Recipe) -> Image.Image:
    """``recipe``'s training operations on one RGB picture, in ``ops.apply``'s order.

    Parameters
    ----------
    image : PIL.Image.Image
        The sample after its crop and resize (RGB; RGBX is converted).
    inputs : mapping of str to array or scalar
        The sample's own values of the inputs ``draws.input_names`` names (``sample``): the bits
        ``vflip``, ``grayscale``, ``jitter``, the jitter ``order`` and factors, the policy's
        ``aa_op``, ``aa_param`` and ``aa_matrix`` rows. An input absent is an operation the
        recipe cannot apply.
    recipe : Recipe
        The recipe the inputs were drawn for (the policy's fill and interpolation).

    Returns
    -------
    PIL.Image.Image
        The picture with the operations applied (``image`` itself where none applies).
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    if "vflip" in inputs and inputs["vflip"]:
        image = image.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    policy = recipe.auto_augment
    if policy is not None:
        image = apply_policy(image, inputs["aa_op"], inputs["aa_param"], inputs["aa_matrix"], policy)
    if recipe.jitter is not None and ("jitter" not in inputs or inputs["jitter"]):
        factors = {name: float(inputs[name]) for name in JITTER_ADJUSTMENTS if name in inputs}
        image = color_jitter(image, inputs["order"], factors)
    if "grayscale" in inputs and inputs["grayscale"]:
        image = grayscale(image)
    return image


def apply_policy(image: Image.Image, ops: np.ndarray, params: np.ndarray, matrices: np.ndarray,
                 policy: AutoAugment) -> Image.Image:
    """The drawn auto-augment ops of one sample, slot after slot (``AutoAugment.draw``: op
    index into ``OPS``, scalar parameter, 2x3 output-to-input matrix per slot)."""
    for index, param, matrix in zip(ops.tolist(), params.tolist(), matrices, strict=True):
        image = policy_op(image, OPS[index], param, matrix, policy)
    return image


def policy_op(image: Image.Image, op: Op, param: float, matrix: np.ndarray, policy: AutoAugment) -> Image.Image:
    """One auto-augment op with its drawn parameter, as torchvision's PIL kernels and timm apply it.

    ``param``: the enhance factor, the posterize bit mask, the solarize threshold (pixels at or
    above it inverted), the solarize-add amount; ``matrix``: the geometric ops' map from output
    to input pixel coordinates, origin at the first pixel's corner (PIL's AFFINE data).
    """
    if op is Op.IDENTITY:
        return image
    if op in GEOMETRIC:
        data = tuple(float(v) for v in np.asarray(matrix, dtype=np.float64).reshape(6))
        return image.transform(image.size, Image.Transform.AFFINE, data, _RESAMPLE[policy.interpolation],
                               fillcolor=tuple(int(f) for f in policy.fill))
    if op in _ENHANCE:
        return _ENHANCE[op](image).enhance(param)  # type: ignore[no-any-return]
    if op is Op.POSTERIZE:  # ImageOps.posterize: the AND mask, as a table
        mask = int(param)
        return image.point([i & mask for i in range(256)] * 3)
    if op is Op.SOLARIZE:  # ImageOps.solarize's table: i below the threshold kept, else 255 - i
        return image.point([i if i < param else 255 - i for i in range(256)] * 3)
    if op is Op.SOLARIZE_ADD:  # timm's solarize_add
        add = int(param)
        return image.point([min(255, i + add) if i < SOLARIZE_ADD_BELOW else i for i in range(256)] * 3)
    if op is Op.AUTO_CONTRAST:
        return ImageOps.autocontrast(image)
    if op is Op.EQUALIZE:
        return ImageOps.equalize(image)
    return ImageOps.invert(image)


def color_jitter(image: Image.Image, order: np.ndarray, factors: Mapping[str, float]) -> Image.Image:
    """torchvision's ``ColorJitter`` on a PIL picture: the adjustments of ``factors`` (by name,
    ``JITTER_ADJUSTMENTS``) in the sample's drawn ``order`` of their indices."""
    for which in np.asarray(order).tolist():
        name = JITTER_ADJUSTMENTS[which]
        if name in factors:
            image = _ADJUST[name](image, factors[name])
    return image


def adjust_brightness(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_brightness``: ``ImageEnhance.Brightness``."""
    return ImageEnhance.Brightness(image).enhance(factor)


def adjust_contrast(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_contrast``: ``ImageEnhance.Contrast`` (a blend with the
    rounded mean of the ``L`` picture)."""
    return ImageEnhance.Contrast(image).enhance(factor)


def adjust_saturation(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_saturation``: ``ImageEnhance.Color``."""
    return ImageEnhance.Color(image).enhance(factor)


def adjust_hue(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_hue``: the uint8 hue of PIL's HSV turned by
    ``int32(factor * 255)`` modulo 256."""
    h, s, v = image.convert("HSV").split()
    shift = int(np.int32(factor * 255).astype(np.uint8))
    h = h.point([(i + shift) & 255 for i in range(256)])
    return Image.merge("HSV", (h, s, v)).convert("RGB")


def grayscale(image: Image.Image) -> Image.Image:
    """torchvision's PIL ``rgb_to_grayscale(num_output_channels=3)``: PIL's ``L`` in three channels."""
    return image.convert("L").convert("RGB")


_ADJUST = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation,
           "hue": adjust_hue}
