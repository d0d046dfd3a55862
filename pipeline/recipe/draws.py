"""A recipe's per-sample parameters, drawn on the host from (seed, epoch, sample key) alone.

They come from ``pipeline.planning.counters.uniforms`` on a stream of their own (the seed mixed with a
constant), so the crop windows and horizontal flips the Loader drew before recipes existed are
untouched: ``hflip=0.5`` keeps the window's own flip, any other probability draws it here. Each
parameter has a fixed slot among a sample's draws, whichever options are on, so turning one
option on or off leaves the draws of the others as they were. A resumed epoch, another world
size or another batch size sees exactly the parameters an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.recipe.recipe import (INTERP_CODES, JITTER_ADJUSTMENTS, RANDOM_CHOICES, Interpolation,
                                             PhotometricDistort, Recipe)

STREAM = "tilefeed.recipe.draws"  # the recipe's draw stream, apart from the crops' (planning.counters)
# a sample's draws, by slot: a new parameter takes a spare slot, never another's
HFLIP, VFLIP, GRAYSCALE, JITTER, FACTORS, ORDER, INTERP = 0, 1, 2, 3, 4, 8, 12
DRAWS = 16  # slots 13..15 spare
NEUTRAL = (1.0, 1.0, 1.0, 0.0)  # brightness, contrast, saturation, hue factors that change nothing

# the photometric distortion draws on a stream of its own, so every draw above stays as it was
PHOTOMETRIC_STREAM = "tilefeed.recipe.photometric"
# its slots: an apply bit and a factor per adjustment, the contrast-first coin, the channel
# permutation's bit and its three keys
PD_APPLY, PD_FACTORS, PD_BEFORE, PD_PERMUTE, PD_KEYS = 0, 4, 8, 9, 10
PD_DRAWS = 16  # slots 13..15 spare
SKIP = len(JITTER_ADJUSTMENTS)  # an order slot holding no adjustment (one not drawn to apply)
# the adjustments' order (indices into JITTER_ADJUSTMENTS) with contrast first or last: torchvision
# applies brightness, then contrast, saturation and hue, or saturation, hue and contrast
CONTRAST_BEFORE, CONTRAST_AFTER = (0, 1, 2, 3), (0, 2, 3, 1)
# the photometric distortion's per-sample graph inputs: the order (SKIP where an adjustment is not
# applied), the four factors, the 3x3 channel permutation matrix (the identity where none)
PHOTOMETRIC_INPUTS = ("pd_order", *(f"pd_{name}" for name in JITTER_ADJUSTMENTS), "pd_permutation")
# every per-sample input a recipe's draws may send, with its dtype (``input_names`` picks a recipe's)
INPUTS: Mapping[str, np.dtype] = MappingProxyType({
    "interp": np.dtype(np.int32), "vflip": np.dtype(np.int32), "grayscale": np.dtype(np.int32),
    "jitter": np.dtype(np.int32), "order": np.dtype(np.int32),
    **{name: np.dtype(np.float32) for name in JITTER_ADJUSTMENTS},
    **{name: np.dtype(np.int32 if name == "pd_order" else np.float32) for name in PHOTOMETRIC_INPUTS},
})


@dataclass(frozen=True)
class Distortions:
    """Per sample, the photometric distortion's draws as numpy arrays of length n.

    ``order``: (n, 4) int32, the adjustments to apply in the order torchvision applies them,
    ``SKIP`` in the slots of those not drawn; ``factors``: (n, 4) float32 brightness, contrast,
    saturation and hue factors; ``permutation``: (n, 3) int32, output channel c is input channel
    ``permutation[c]`` (``F.permute_channels``; 0, 1, 2 where not drawn).
    """

    order: np.ndarray
    factors: np.ndarray
    permutation: np.ndarray

    def matrices(self) -> np.ndarray:
        """(n, 3, 3) float32 matrices taking a pixel's channels to the permuted ones (row c picks
        channel ``permutation[c]``): what the graph's ``coord_transform`` multiplies by."""
        return np.eye(3, dtype=np.float32)[self.permutation]

    def named(self) -> dict[str, np.ndarray]:
        """The graph inputs ``PHOTOMETRIC_INPUTS`` names."""
        return {"pd_order": self.order, **{f"pd_{name}": self.factors[:, k] for k, name in
                                            enumerate(JITTER_ADJUSTMENTS)},
                "pd_permutation": self.matrices()}


def distort(photometric: PhotometricDistort, seed: int, epoch: int, keys: np.ndarray) -> Distortions:
    """``RandomPhotometricDistort.make_params`` for the samples of ``keys`` in ``epoch``.

    Each adjustment applies where its uniform falls below ``p`` (``torch.rand(1) < p``), its
    factor ``low + (high - low) * u`` (``uniform_``); contrast goes first where the coin's
    uniform is below 0.5 (``torch.rand(()) < 0.5``); the channels are permuted where their bit's
    uniform is below ``p``, by the order that sorts three uniforms (uniform over the six
    permutations, as ``randperm(3)``).
    """
    keys = np.asarray(keys)
    n = len(keys)
    u = uniforms(stream_seed(seed, PHOTOMETRIC_STREAM), epoch, keys, PD_DRAWS)
    applied = u[:, PD_APPLY : PD_APPLY + 4] < photometric.p
    factors = np.empty((n, 4), dtype=np.float64)
    for k, (low, high) in enumerate(photometric.ranges().values()):
        factors[:, k] = low + (high - low) * u[:, PD_FACTORS + k]
    before = u[:, PD_BEFORE] < 0.5
    order = np.where(before[:, None], np.asarray(CONTRAST_BEFORE), np.asarray(CONTRAST_AFTER))
    order = np.where(np.take_along_axis(applied, order, axis=1), order, SKIP)
    keyed = np.argsort(u[:, PD_KEYS : PD_KEYS + 3], axis=1, kind="stable")
    permuted = u[:, PD_PERMUTE] < photometric.p
    permutation = np.where(permuted[:, None], keyed, np.arange(3))
    return Distortions(order.astype(np.int32), factors.astype(np.float32), permutation.astype(np.int32))


@dataclass(frozen=True)
class Draws:
    """Per sample, as numpy arrays of length n (int32 bits are 1 = apply).

    ``hflip`` is None where the recipe keeps the crop window's own flip (``hflip=0.5``).
    ``factors``: (n, 4) float32 brightness, contrast, saturation and hue factors (neutral for an
    adjustment left out); ``order``: (n, 4) int32, the adjustments in the order they are applied
    (torchvision's ``randperm(4)``); ``interp``: DALI's filter code of each sample's resize;
    ``photometric``: the photometric distortion's (``distort``), None without one.
    """

    hflip: np.ndarray | None
    vflip: np.ndarray
    grayscale: np.ndarray
    jitter: np.ndarray
    factors: np.ndarray
    order: np.ndarray
    interp: np.ndarray
    photometric: Distortions | None = None

    def inputs(self, recipe: Recipe, train: bool) -> dict[str, np.ndarray]:
        """The graph's per-sample inputs for ``recipe`` by name, in the order ``input_names``
        names them."""
        named = {"interp": self.interp, "vflip": self.vflip, "grayscale": self.grayscale,
                 "jitter": self.jitter, "order": self.order,
                 **{name: self.factors[:, k] for k, name in enumerate(JITTER_ADJUSTMENTS)},
                 **(self.photometric.named() if self.photometric is not None else {})}
        return {name: np.ascontiguousarray(named[name]) for name in input_names(recipe, train)}


def input_names(recipe: Recipe, train: bool) -> tuple[str, ...]:
    """The recipe's per-sample graph inputs: the resize filter, then (training) each pixel
    operation's parameters, only for the operations the recipe can apply."""
    if not train:
        return ("interp",)
    names = ["interp"]
    if recipe.vflip > 0:
        names.append("vflip")
    if recipe.grayscale > 0:
        names.append("grayscale")
    jitter = recipe.jitter
    if jitter is not None:
        names += ["jitter", "order"] if jitter.p < 1 else ["order"]
        names += [name for name, span in jitter.ranges().items() if span is not None]
    if recipe.distort is not None:
        names += PHOTOMETRIC_INPUTS
    return tuple(names)


def draw(recipe: Recipe, seed: int, epoch: int, keys: np.ndarray, train: bool = True) -> Draws:
    """``recipe``'s parameters for the samples of ``keys`` in ``epoch``; in evaluation only the
    filter (``Recipe.eval_interpolation``) and nothing applied."""
    n = len(keys)
    zeros = np.zeros(n, dtype=np.int32)
    if not train:
        code = INTERP_CODES[recipe.eval_interpolation()]
        return Draws(None, zeros, zeros, zeros, np.tile(np.asarray(NEUTRAL, np.float32), (n, 1)),
                     np.tile(np.arange(4, dtype=np.int32), (n, 1)), np.full(n, code, np.int32))
    u = uniforms(stream_seed(seed, STREAM), epoch, np.asarray(keys), DRAWS)
    hflip = None if recipe.hflip == 0.5 else (u[:, HFLIP] < recipe.hflip).astype(np.int32)
    factors = np.tile(np.asarray(NEUTRAL, dtype=np.float64), (n, 1))
    jitter = recipe.jitter
    if jitter is not None:
        for k, span in enumerate(jitter.ranges().values()):
            if span is not None:  # torch's uniform_(low, high): low + (high - low) * u
                factors[:, k] = span[0] + (span[1] - span[0]) * u[:, FACTORS + k]
    if recipe.interpolation is Interpolation.RANDOM:
        choice = np.minimum((u[:, INTERP] * len(RANDOM_CHOICES)).astype(np.int64), len(RANDOM_CHOICES) - 1)
        interp = np.array([INTERP_CODES[i] for i in RANDOM_CHOICES], np.int32)[choice]
    else:
        interp = np.full(n, INTERP_CODES[recipe.interpolation], np.int32)
    return Draws(
        hflip=hflip,
        vflip=(u[:, VFLIP] < recipe.vflip).astype(np.int32),
        grayscale=(u[:, GRAYSCALE] < recipe.grayscale).astype(np.int32),
        jitter=(u[:, JITTER] < (jitter.p if jitter is not None else 0.0)).astype(np.int32),
        factors=factors.astype(np.float32),
        # four independent uniforms sorted: a uniformly random permutation, as randperm(4)
        order=np.argsort(u[:, ORDER : ORDER + 4], axis=1, kind="stable").astype(np.int32),
        interp=interp,
        photometric=None if recipe.distort is None else distort(recipe.distort, seed, epoch, keys),
    )
