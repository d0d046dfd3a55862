"""The graph's per-sample operations, one contract: ``Operation``.

Every operation the graph applies per sample (the crop window and flip or evaluation's framing,
the recipe's filter, flips and pixel operations, an auto-augment policy) is one object that
declares the inputs it sends (their names, dtypes, whether only the host reads them and whether
the host-resize path applies them itself: ``Input``) and draws them on the host from (seed,
epoch, key). ``draw_inputs`` runs the operations of ``OPERATIONS`` in turn into one named
mapping per batch; the batch source, the graph (both shapes), the host path and the targets
all read that mapping by name, and which inputs the graph declares and is fed on each path
follows from the same declarations alone (``inputs``, ``batch_source.graph_names``). A new
operation is one object here, its draws in its own module, and one line of ``OPERATIONS``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tilefeed.pipeline.engine.crops import PASTE_NAMES, StoreObjects, against_boxes, frame_inputs, pads
from tilefeed.pipeline.recipe import draws, policies
from tilefeed.pipeline.recipe.recipe import Recipe

if TYPE_CHECKING:
    from tilefeed.pipeline.engine.augment import Augment
    from tilefeed.pipeline.reading.mixed import MixedArray


@dataclass(frozen=True)
class Input:
    """One input an operation sends with a batch.

    Attributes
    ----------
    dtype : numpy.dtype
        Its numpy dtype: int32 or float32 where the graph is fed it (what the graph declares it
        as).
    host_only : bool
        Only the host reads it (the host kernels, the targets), so the graph is not fed it on
        either path. Only such an input may hold other than one value per sample.
    host_applied : bool
        The host-resize path applies it itself (the batch source's cut, resize and paste, the
        recipe's pixel operations: ``recipe.host_ops``), so the graph is not fed it there.
    """

    dtype: np.dtype
    host_only: bool = False
    host_applied: bool = False


INT = Input(np.dtype(np.int32))
FLOAT = Input(np.dtype(np.float32))
# the window's cut, output size and paste, which the host-resize path does itself
CUT = Input(np.dtype(np.float32), host_applied=True)
# the IoU crop's keep: one flag per object of the batch's samples, read by the targets alone
KEEP = Input(np.dtype(np.bool_), host_only=True)


@dataclass(frozen=True)
class Draw:
    """What every operation draws a batch's inputs from.

    Attributes
    ----------
    boxes : numpy.ndarray or MixedArray
        Every tile's picture (top, left, height, width).
    augment : Augment
        The graph's settings (train, framing, recipe).
    seed, epoch, size : int
        The Loader's seed, the epoch and its output side.
    samples : numpy.ndarray
        The batch's samples (store indices; of a mixture, its global ids).
    keys : numpy.ndarray
        Their positions in the epoch, which every draw is keyed on (of one store, the samples).
    objects : tuple of numpy.ndarray, optional
        The store's object offsets and rows, which a recipe's ``crop="iou"`` draws against.
    """

    boxes: np.ndarray | MixedArray
    augment: Augment
    seed: int
    epoch: int
    size: int
    samples: np.ndarray
    keys: np.ndarray
    objects: StoreObjects | None = None

    @property
    def recipe(self) -> Recipe | None:
        """The augment's recipe (its draws know training from evaluation: ``draws.draw``)."""
        return self.augment.recipe


class Operation(Protocol):
    """One per-sample operation of the graph: what it sends, and its draws."""

    def inputs(self, a: Augment) -> dict[str, Input]:
        """The inputs it sends for ``a``, by name, in the order the graph is fed them (none: it
        does not apply)."""

    def draw(self, d: Draw, sent: dict[str, np.ndarray]) -> None:
        """Its inputs for ``d``'s samples, added to ``sent`` (which holds the operations' before it)."""


class Windows:
    """The crop window, flip and output size of each sample (training, or tiles with padding),
    with the cut and paste of a window reaching past the picture, and an IoU crop's ``keep`` of
    the samples' objects; else evaluation's framing of whole tiles (resize, centre crop).
    ``crops.frame_inputs`` draws them."""

    def inputs(self, a: Augment) -> dict[str, Input]:
        if not a.windows:
            return {"resize": FLOAT, "crop": FLOAT}
        padding = pads(a)
        # a window past the picture is cut by its part inside it (``PASTE_NAMES``): the whole
        # window is then read on the host alone (the targets frame the boxes with it)
        window = replace(CUT, host_only=padding)
        sent = {"start": window, "end": window, "flip": INT, "size": CUT}
        if padding:
            sent |= {name: CUT for name in PASTE_NAMES}
        return sent | ({"keep": KEEP} if against_boxes(a) else {})

    def draw(self, d: Draw, sent: dict[str, np.ndarray]) -> None:
        sent.update(frame_inputs(d.boxes, d.augment, d.seed, d.epoch, d.size, d.samples, d.keys, d.objects))


class RecipeDraws:
    """A recipe's resize filter and, in training, its flips and pixel operations
    (``draws.draw``): a horizontal flip probability other than 0.5 replaces the window's flip."""

    def inputs(self, a: Augment) -> dict[str, Input]:
        if a.recipe is None:
            return {}
        # the host-resize path applies them all: the filter in its resize, the rest in host_ops
        return {name: Input(draws.INPUTS[name], host_applied=True)
                for name in draws.input_names(a.recipe, a.train)}

    def draw(self, d: Draw, sent: dict[str, np.ndarray]) -> None:
        recipe = d.recipe
        if recipe is None:
            return
        drawn = draws.draw(recipe, d.seed, d.epoch, d.keys, train=d.augment.train)
        if d.augment.windows and drawn.hflip is not None:
            sent["flip"] = drawn.hflip
        sent.update(drawn.inputs(recipe, d.augment.train))


class PolicyDraws:
    """An auto-augment policy's ops, parameters and warps per op slot (``AutoAugment.draw``),
    drawn at the epoch's size; training only."""

    def inputs(self, a: Augment) -> dict[str, Input]:
        policy = a.recipe.auto_augment if a.recipe is not None and a.train else None
        if policy is None:
            return {}
        return {name: Input(policies.INPUTS[name], host_only=name in policies.HOST_ONLY_INPUTS,
                            host_applied=True)
                for name in policy.input_names()}

    def draw(self, d: Draw, sent: dict[str, np.ndarray]) -> None:
        names = self.inputs(d.augment)
        if not names:
            return
        assert d.recipe is not None and d.recipe.auto_augment is not None
        made = d.recipe.auto_augment.draw(d.seed, d.epoch, np.asarray(d.keys), d.size)
        sent.update((name, np.ascontiguousarray(made[name])) for name in names)


class PixelDraws:
    """The recipe's pixel operations registered one module each (``pixel_ops.PIXEL_OPERATIONS``:
    solarize), in training: each declares and draws its own inputs."""

    def inputs(self, a: Augment) -> dict[str, Input]:
        if a.recipe is None or not a.train:
            return {}
        return {name: Input(dtype, host_applied=True) for op, _ in a.recipe.pixel_operations()
                for name, dtype in op.inputs.items()}

    def draw(self, d: Draw, sent: dict[str, np.ndarray]) -> None:
        if d.recipe is None or not d.augment.train:
            return
        for op, settings in d.recipe.pixel_operations():
            sent.update(op.draw(settings, d.seed, d.epoch, d.keys))


# Every per-sample operation, in the order the graph is fed their inputs
OPERATIONS: tuple[Operation, ...] = (Windows(), RecipeDraws(), PolicyDraws(), PixelDraws())


@functools.lru_cache(maxsize=64)  # an Augment is hashable (the graph pool keys on it)
def inputs(a: Augment) -> Mapping[str, Input]:
    """Every input the operations send for ``a``, by name, in the order the graph is fed them:
    worked out once per ``Augment``, not per batch."""
    sent: dict[str, Input] = {}
    for operation in OPERATIONS:
        sent |= operation.inputs(a)
    return MappingProxyType(sent)


def draw_inputs(d: Draw) -> dict[str, np.ndarray]:
    """Every operation's inputs for ``d``'s samples, by name, in the order ``inputs`` declares
    them, each of its declared dtype."""
    sent: dict[str, np.ndarray] = {}
    for operation in OPERATIONS:
        operation.draw(d, sent)
    declared = inputs(d.augment)
    # the graph declares what ``inputs`` says: a draw of another name or dtype is a defect here
    assert list(sent) == list(declared), (list(sent), list(declared))
    assert all(sent[name].dtype == spec.dtype for name, spec in declared.items()), \
        {name: str(sent[name].dtype) for name in declared}
    return sent


def graph_inputs(boxes: np.ndarray | MixedArray, a: Augment, seed: int, epoch: int, size: int,
                 samples: np.ndarray, keys: np.ndarray,
                 objects: StoreObjects | None = None) -> dict[str, np.ndarray]:
    """``draw_inputs`` for ``samples`` (at ``keys``) of ``epoch`` at ``size``: what a batch
    carries to the graph beside its pixels, by name.

    Parameters
    ----------
    boxes : numpy.ndarray or MixedArray
        Every tile's picture (top, left, height, width).
    a : Augment
        The graph's settings.
    seed, epoch, size : int
        The Loader's seed, the epoch and its output side.
    samples, keys : numpy.ndarray
        The batch's samples and their positions in the epoch (of one store, the samples).
    objects : tuple of numpy.ndarray, optional
        The store's object offsets and rows, for a recipe's ``crop="iou"``.

    Returns
    -------
    dict of str to numpy.ndarray
        Each input by name.
    """
    return draw_inputs(Draw(boxes, a, seed, epoch, size, samples, keys, objects))
