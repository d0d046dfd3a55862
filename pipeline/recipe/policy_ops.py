"""Auto-augment ops in the DALI graph: each sample gets the ops the host drew for it.

Per op slot the batch is split by op index with DALI conditionals (a binary tree of ``if``s, as
``nvidia.dali.auto_aug.core.select`` does), so each op runs only on its own samples; the graph
must be built with ``enable_conditionals=True``. The ops take their parameters as per-sample
inputs (``policies.AutoAugment.draw``): nothing here draws. All work on uint8 HWC images, on
the CPU or the GPU backend alike (per-sample parameters are host tensors; DALI's arithmetic
moves those that meet GPU pixels to the GPU itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali import math as dmath
from nvidia.dali.auto_aug import augmentations as dali_aug

from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import OPS, PolicyInterpolation, Op

_BLUR = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13  # PIL's SMOOTH kernel
# Luma weights of torchvision's rgb_to_grayscale (PIL's L conversion: 0.299, 0.587, 0.114).
_LUMA = np.array([0.2989, 0.587, 0.114], dtype=np.float32)


def apply_policy(images: Any, inputs: Mapping[str, Any], policy: AutoAugment) -> Any:
    """Apply the drawn auto-augment ops to a batch of uint8 HWC images.

    Parameters
    ----------
    images : DataNode
        uint8 HWC images (after crop and resize, before normalisation), CPU or GPU.
    inputs : mapping of str to DataNode
        The per-sample inputs named by ``AutoAugment.input_names()`` (``aa_op`` int32 (slots,),
        ``aa_param`` float32 (slots,), ``aa_matrix`` float32 (slots, 2, 3)), CPU nodes from
        ``fn.external_source``; a random interpolation's ``aa_filter`` is not read (the warp
        is bilinear for every slot, a bicubic policy's too).
    policy : AutoAugment
        The policy the inputs were drawn for (its op set, fill and interpolation).

    Returns
    -------
    DataNode
        The augmented uint8 HWC images, on the device ``images`` were on.

    Notes
    -----
    Needs a pipeline built with ``enable_conditionals=True``.
    """
    ops = [OPS.index(op) for op in policy.ops()]
    for k in range(policy.slots):
        index = inputs["aa_op"][k]
        param = inputs["aa_param"][k]
        matrix = inputs["aa_matrix"][k]
        images = _select(images, ops, 0, len(ops) - 1, index, param, matrix, policy)
    return images


def _select(images: Any, ops: list[int], lo: int, hi: int, index: Any, param: Any, matrix: Any,
            policy: AutoAugment) -> Any:
    """ops[lo..hi] as a binary tree of conditionals on ``index``: log2(ops) splits per sample."""
    if lo == hi:
        return _apply(OPS[ops[lo]], images, param, matrix, policy)
    mid = (lo + hi) // 2
    if index <= ops[mid]:
        out = _select(images, ops, lo, mid, index, param, matrix, policy)
    else:
        out = _select(images, ops, mid + 1, hi, index, param, matrix, policy)
    return out


def _apply(op: Op, images: Any, param: Any, matrix: Any, policy: AutoAugment) -> Any:
    """One op on the samples that drew it."""
    if op is Op.IDENTITY:
        return images
    if op in (Op.SHEAR_X, Op.SHEAR_Y, Op.TRANSLATE_X, Op.TRANSLATE_Y, Op.ROTATE):
        return _warp(images, matrix, policy)
    if op is Op.BRIGHTNESS:  # blend with black
        return _blend(images, 0.0, param)
    if op is Op.COLOR:  # blend with the pixel's luma
        return _blend(images, _luma(images), param)
    if op is Op.CONTRAST:  # blend with the image's mean luma
        return _blend(images, fn.reductions.mean(_luma(images), axis_names="HWC", keep_dims=True),
                      param)
    if op is Op.SHARPNESS:
        return _sharpness(images, param)
    if op is Op.POSTERIZE:  # keep the high bits: AND with the drawn mask
        return images & fn.cast(param, dtype=types.UINT8)
    if op is Op.SOLARIZE:  # invert pixels at or above the threshold
        return dali_aug.solarize.op(images, param)
    if op is Op.SOLARIZE_ADD:  # add below 128 (at most 110, so no uint8 wrap)
        return dali_aug.solarize_add.op(images, fn.cast(param, dtype=types.UINT8))
    if op is Op.AUTO_CONTRAST:
        return dali_aug.auto_contrast.op(images, None)
    if op is Op.EQUALIZE:
        return fn.equalize(images)
    return dali_aug.invert.op(images, None)


def _luma(images: Any) -> Any:
    """Integer luma, as torchvision floors its grayscale of uint8 images (HW1, float)."""
    return dmath.floor(fn.reductions.sum(images * types.Constant(_LUMA), axis_names="C", keep_dims=True))


def _blend(images: Any, other: Any, factor: Any) -> Any:
    """``factor * images + (1 - factor) * other``, clamped and truncated to uint8 as torchvision's
    ``_blend`` and PIL's ``Image.blend`` both truncate (DALI's own ops round)."""
    return fn.cast(dmath.floor(images * factor + other * (1.0 - factor)), dtype=types.UINT8)


def _warp(images: Any, matrix: Any, policy: AutoAugment) -> Any:
    """Geometric ops: one warp by the host's output-to-input matrix, uncovered pixels filled.
    DALI's warp has no cubic filter: under ``PolicyInterpolation.BICUBIC`` every slot warps bilinear,
    and under ``PolicyInterpolation.RANDOM`` the slots that drew bicubic too (``aa_filter`` stays on
    the host)."""
    interp = types.INTERP_NN if policy.interpolation is PolicyInterpolation.NEAREST else types.INTERP_LINEAR
    fill = policy.fill
    if fill[0] == fill[1] == fill[2]:
        return fn.warp_affine(images, matrix=matrix, fill_value=float(fill[0]), interp_type=interp)
    # DALI's fill is one value for all channels: warp with 0, then add the RGB fill in
    # proportion to how little of the source covers each pixel (exact for nearest and bilinear,
    # which are both linear in the pixels)
    warped = fn.warp_affine(images, matrix=matrix, fill_value=0.0, interp_type=interp)
    ones = fn.cast_like(images[:, :, 0:1] * 0 + 255, images)
    cover = fn.warp_affine(ones, matrix=matrix, fill_value=0.0, interp_type=interp)
    rgb = types.Constant(np.array(fill, dtype=np.float32))
    return fn.cast_like(warped + rgb * ((255 - cover) * (1.0 / 255)), images)


def _sharpness(images: Any, factor: Any) -> Any:
    """Blend with PIL's smoothing filter (the blurred image rounded to uint8 first, as
    torchvision does); the one-pixel frame keeps its input values, as torchvision and PIL
    leave it."""
    blurred = fn.filter(images, _BLUR, mode="valid")  # the kernel lands on the filter's device
    hw = images.shape(dtype=types.INT32)[0:2]
    at, back = types.Constant(np.array([1, 1], np.int32)), types.Constant(np.array([-1, -1], np.int32))
    core = fn.slice(images, at, hw - 2, axis_names="HW")
    inner = _blend(core, blurred, factor)
    # back to full size with a zero frame, then the input's frame added (its interior zeroed)
    inner = fn.slice(inner, back, hw, axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
    frame = images - fn.slice(core, back, hw, axis_names="HW", out_of_bounds_policy="pad", fill_values=0)
    return inner + frame
