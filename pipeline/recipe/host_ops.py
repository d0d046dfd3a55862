"""A recipe's per-sample pixel operations on the host, as PIL (pillow-simd) calls.

On the CPU the batch source cuts and resizes each training window with pillow-simd in its
threads (``engine.batch_source``); the same threads then apply the sample's drawn operations to
the resized picture here, where DALI's CPU operators would take a millisecond and more a sample
(a policy's conditionals, some sixty operations for a hue shift). The order is ``ops.apply``'s
(photometric distortion, vertical flip, auto-augment, colour jitter, grayscale; the horizontal
flip stays with the graph's ``crop_mirror_normalize``), the parameters exactly those
``draws.draw`` and ``AutoAugment.draw`` give the graph on a GPU. Each operation is the PIL call
torchvision's PIL kernels and timm's ``auto_augment`` make, so the pixels are those of
torchvision's and timm's own PIL pipelines:

- the enhance ops (brightness, color or saturation, contrast, sharpness): ``ImageEnhance``;
- posterize, solarize, autocontrast, equalize, invert: ``ImageOps`` or the same lookup table;
- the geometric ops: ``Image.transform(AFFINE)`` with the drawn 2x3 output-to-input matrix in
  corner coordinates, which is what PIL's AFFINE data is (PIL samples at pixel centres,
  ``x + 0.5``, as DALI's warp does);
- hue: torchvision's PIL ``adjust_hue``, a turn of the uint8 hue of PIL's HSV;
- grayscale: PIL's ``L`` conversion in three channels;
- the photometric distortion's channel permutation: PIL's bands merged in the drawn order.

Two of them take a shorter road to the same bytes. Brightness and contrast blend the picture
with a constant, so each output byte depends on its input byte alone: the 256 answers of PIL's
own ``Image.blend`` on a ramp, applied with ``point``, are its answers on the picture, at a
tenth of the cost. A translation by whole pixels samples pixel centres exactly, so PIL's
nearest, bilinear and bicubic transforms copy pixels (the cubic weights at a whole-pixel offset
are 0, 1, 0, 0): a paste onto the fill gives them, where the generic transform costs about ten
resizes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps, ImageStat

from tilefeed.pipeline.recipe import draws, policies
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import GEOMETRIC, OPS, RANDOM_FILTERS, PolicyInterpolation, Op
from tilefeed.pipeline.recipe.pixel_ops import PIXEL_OPERATIONS
from tilefeed.pipeline.recipe.recipe import JITTER_ADJUSTMENTS, Recipe

# the per-sample inputs (a recipe's draws but its filter, a policy's, the pixel operations') these
# kernels take, which ``sample`` picks out of a batch's inputs; the operations that send them
# declare them applied on the host (``Input.host_applied``), so on the host-resize path the graph
# is not fed them
INPUTS: tuple[str, ...] = (*(name for name in draws.INPUTS if name != "interp"), *policies.INPUTS,
                           *(name for op in PIXEL_OPERATIONS for name in op.inputs))
SOLARIZE_ADD_BELOW = 128  # timm's solarize_add threshold: only pixels below it are raised
_RESAMPLE = {PolicyInterpolation.NEAREST: Image.Resampling.NEAREST,
             PolicyInterpolation.BILINEAR: Image.Resampling.BILINEAR,
             PolicyInterpolation.BICUBIC: Image.Resampling.BICUBIC}
# ``aa_filter``'s values (indices into ``RANDOM_FILTERS``) as PIL's filters, timm's _RANDOM_INTERPOLATION
_RANDOM_RESAMPLE = tuple(Image.Resampling[name.upper()] for name in RANDOM_FILTERS)
_ENHANCE: dict[Op, Any] = {Op.COLOR: ImageEnhance.Color, Op.SHARPNESS: ImageEnhance.Sharpness}
_RAMP = Image.frombytes("RGB", (256, 1), np.repeat(np.arange(256, dtype=np.uint8), 3).tobytes())


def applies(recipe: Recipe | None) -> bool:
    """``recipe`` has a pixel operation for these kernels (photometric distortion, vertical flip,
    auto-augment, colour jitter, grayscale or one of ``PIXEL_OPERATIONS``)."""
    return recipe is not None and (recipe.vflip > 0 or recipe.grayscale > 0 or recipe.jitter is not None
                                   or recipe.auto_augment is not None or recipe.distort is not None
                                   or bool(recipe.pixel_operations()))


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
        ``vflip``, ``grayscale``, ``jitter``, the jitter ``order`` and factors, the photometric
        distortion's ``pd_*``, the policy's ``aa_op``, ``aa_param``, ``aa_matrix`` (and under
        a random interpolation ``aa_filter``) rows. An
        input absent is an operation the recipe cannot apply.
    recipe : Recipe
        The recipe the inputs were drawn for (the policy's fill and interpolation).

    Returns
    -------
    PIL.Image.Image
        The picture with the operations applied (``image`` itself where none applies).
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    if "pd_order" in inputs:
        image = photometric_distort(image, inputs)
    if "vflip" in inputs and inputs["vflip"]:
        image = image.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    policy = recipe.auto_augment
    if policy is not None:
        image = apply_policy(image, inputs["aa_op"], inputs["aa_param"], inputs["aa_matrix"], policy,
                             inputs.get("aa_filter"))
    if recipe.jitter is not None and ("jitter" not in inputs or inputs["jitter"]):
        factors = {name: float(inputs[name]) for name in JITTER_ADJUSTMENTS if name in inputs}
        image = color_jitter(image, inputs["order"], factors)
    if "grayscale" in inputs and inputs["grayscale"]:
        image = grayscale(image)
    for operation, settings in recipe.pixel_operations():
        image = operation.host(image, inputs, settings)
    return image


def apply_policy(image: Image.Image, ops: np.ndarray, params: np.ndarray, matrices: np.ndarray,
                 policy: AutoAugment, filters: np.ndarray | None = None) -> Image.Image:
    """The drawn auto-augment ops of one sample, slot after slot (``AutoAugment.draw``: op
    index into ``OPS``, scalar parameter, 2x3 output-to-input matrix per slot, and under
    ``PolicyInterpolation.RANDOM`` the filter index into ``RANDOM_FILTERS``)."""
    picked = [0] * len(ops) if filters is None else np.asarray(filters).tolist()
    for index, param, matrix, which in zip(ops.tolist(), params.tolist(), matrices, picked, strict=True):
        image = policy_op(image, OPS[index], param, matrix, policy, which)
    return image


def policy_op(image: Image.Image, op: Op, param: float, matrix: np.ndarray, policy: AutoAugment,
              which: int = 0) -> Image.Image:
    """One auto-augment op with its drawn parameter, as torchvision's PIL kernels and timm apply it.

    ``param``: the enhance factor, the posterize bit mask, the solarize threshold (pixels at or
    above it inverted), the solarize-add amount; ``matrix``: the geometric ops' map from output
    to input pixel coordinates, origin at the first pixel's corner (PIL's AFFINE data);
    ``which``: under ``PolicyInterpolation.RANDOM``, the slot's drawn filter (index into
    ``RANDOM_FILTERS``, ``aa_filter``), else unused.
    """
    if op is Op.IDENTITY:
        return image
    if op in GEOMETRIC:
        data = tuple(float(v) for v in np.asarray(matrix, dtype=np.float64).reshape(6))
        fill = tuple(int(f) for f in policy.fill)
        resample = (_RANDOM_RESAMPLE[which] if policy.interpolation is PolicyInterpolation.RANDOM
                    else _RESAMPLE[policy.interpolation])
        if _whole_shift(data):
            return _shifted(image, int(data[2]), int(data[5]), fill)
        # timm's call: img.transform(size, AFFINE, data, resample=..., fillcolor=...)
        return image.transform(image.size, Image.Transform.AFFINE, data, resample, fillcolor=fill)
    if op is Op.BRIGHTNESS:
        return adjust_brightness(image, param)
    if op is Op.CONTRAST:
        return adjust_contrast(image, param)
    if op in _ENHANCE:
        return _ENHANCE[op](image).enhance(param)  # type: ignore[no-any-return]
    if op in (Op.POSTERIZE, Op.SOLARIZE, Op.SOLARIZE_ADD):
        return image.point(_table(op, param))
    if op is Op.AUTO_CONTRAST:
        return ImageOps.autocontrast(image)
    if op is Op.EQUALIZE:
        return ImageOps.equalize(image)
    return ImageOps.invert(image)


def color_jitter(image: Image.Image, order: np.ndarray, factors: Mapping[str, float]) -> Image.Image:
    """torchvision's ``ColorJitter`` on a PIL picture: the adjustments of ``factors`` (by name,
    ``JITTER_ADJUSTMENTS``) in the sample's drawn ``order`` of their indices (an index past them,
    ``draws.SKIP``, applies nothing)."""
    for which in np.asarray(order).tolist():
        name = JITTER_ADJUSTMENTS[which] if which < len(JITTER_ADJUSTMENTS) else ""
        if name in factors:
            image = _ADJUST[name](image, factors[name])
    return image


def photometric_distort(image: Image.Image, inputs: Mapping[str, Any]) -> Image.Image:
    """torchvision's ``RandomPhotometricDistort.transform`` on a PIL picture with one sample's
    drawn ``pd_*`` inputs (``draws.distort``): the adjustments in their drawn order, then the
    channel permutation."""
    factors = {name: float(inputs[f"pd_{name}"]) for name in JITTER_ADJUSTMENTS}
    image = color_jitter(image, inputs["pd_order"], factors)
    # row c of the permutation matrix picks the input channel of output channel c
    return permute_channels(image, np.argmax(np.asarray(inputs["pd_permutation"]), axis=-1))


def permute_channels(image: Image.Image, permutation: np.ndarray) -> Image.Image:
    """torchvision's ``permute_channels``: output channel c is input channel ``permutation[c]``
    (bytes moved, none changed)."""
    order = [int(c) for c in np.asarray(permutation).tolist()]
    if order == [0, 1, 2]:
        return image
    bands = image.split()
    return Image.merge(image.mode, [bands[c] for c in order])


def adjust_brightness(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_brightness``: ``ImageEnhance.Brightness``, a blend with
    black (as a table of the blend's answers)."""
    return image.point(_blend_table(0, float(factor)))


def adjust_contrast(image: Image.Image, factor: float) -> Image.Image:
    """torchvision's PIL ``adjust_contrast``: ``ImageEnhance.Contrast``, a blend with the
    rounded mean of the ``L`` picture (as a table of the blend's answers)."""
    mean = int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5)
    return image.point(_blend_table(mean, float(factor)))


# a table costs a 256-pixel blend; the cache spares a policy's repeated bins (colour jitter's
# continuous factors rarely repeat, and only churn it: kept small)
@functools.lru_cache(maxsize=512)
def _blend_table(base: int, factor: float) -> list[int]:
    """``Image.blend(constant base, picture, factor)`` for every byte value, three bands over:
    PIL's own arithmetic (its float rounding and clamping), run on a ramp."""
    blended = Image.blend(Image.new("RGB", _RAMP.size, (base, base, base)), _RAMP, factor)
    return np.asarray(blended)[0].T.reshape(-1).tolist()  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=1024)
def _table(op: Op, param: float) -> list[int]:
    """The lookup table of a per-byte op, three bands over: ``ImageOps.posterize``'s AND mask,
    ``ImageOps.solarize`` (bytes at or above the threshold inverted), timm's ``solarize_add``."""
    if op is Op.POSTERIZE:
        mask = int(param)
        return [i & mask for i in range(256)] * 3
    if op is Op.SOLARIZE:
        return [i if i < param else 255 - i for i in range(256)] * 3
    add = int(param)
    return [min(255, i + add) if i < SOLARIZE_ADD_BELOW else i for i in range(256)] * 3


def _whole_shift(data: tuple[float, ...]) -> bool:
    """The affine ``data`` (output to input) is a translation by whole pixels."""
    a, b, c, d, e, f = data
    return a == 1.0 and b == 0.0 and d == 0.0 and e == 1.0 and c.is_integer() and f.is_integer()


def _shifted(image: Image.Image, dx: int, dy: int, fill: tuple[int, ...]) -> Image.Image:
    """PIL's affine transform by the whole-pixel translation ``(dx, dy)`` (output pixel x, y
    from input x + dx, y + dy; outside, ``fill``): the pixel centres land on pixel centres, so
    its interpolation copies them (nearest, bilinear and bicubic alike)."""
    out = Image.new(image.mode, image.size, fill)
    out.paste(image, (-dx, -dy))
    return out


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
