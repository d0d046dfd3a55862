"""A recipe's per-batch operations, applied where each batch is handed over.

Random erasing of each sample, then mixup/cutmix of the batch, run on the batch's device in
torch. They run on the Loader's feeding thread, as each batch leaves the graph (on a GPU, on the
feed's side stream before the batch's ready event), not on the consumer's thread in ``next()``:
there they would add their time (about 17 ms a batch of 64 at 176 px on two CPU cores, for the
mixing) to every step's wait, here it overlaps the step like the rest of the pipeline.

A ``BatchOps`` is a plain record of one epoch stretch's settings, never a reference to the
Loader: the graph that applies it may outlive the Loader in the pool. Two are equal when they
would do the same to the same batch, which is what lets the feed keep the batches it prepared
ahead when the Loader is iterated again, and drop them when a setting changed (timm's
``loader.mixup_enabled = False`` at ``--mixup-off-epoch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from tilefeed.pipeline.options import Layout
from tilefeed.pipeline.recipe.batch_mix import BatchMix, batch_position
from tilefeed.pipeline.recipe.erasing import RandomErasing


@dataclass(frozen=True)
class BatchOps:
    """The per-batch operations of one stretch of an epoch, for the batches as handed over.

    Attributes
    ----------
    erasing : RandomErasing or None
        Erasing of each sample (in place: a handed-over batch is fresh), keyed as the crops are.
    batch_mix : BatchMix or None
        Mixup/cutmix of the batch, keyed by the batch's global position (``batch_mix``'s rule
        for resume); None also where the Loader's ``mixup_enabled`` is off.
    seed, epoch : int
        The Loader's seed and the epoch.
    batch_size : int
        Samples per batch (the keys of batch ``b`` are ``keys[b * batch_size:]``).
    rank, world_size : int
        This rank and the world size of the stretch.
    before : int
        The batches all ranks handed over in the epoch's earlier stretches.
    layout : Layout
        How the handed-over tensor's bytes are laid out: ``NCHW``, or ``NHWC`` (the Loader's NHWC
        and channels_last outputs, the latter an NCHW view of these same bytes).
    positions : numpy.ndarray
        The stretch's positions in the epoch, which each sample's erasing is drawn from, as its
        crop is (of one store, its samples).
    """

    erasing: RandomErasing | None
    batch_mix: BatchMix | None
    seed: int
    epoch: int
    batch_size: int
    rank: int
    world_size: int
    before: int
    layout: Layout
    positions: np.ndarray = field(kw_only=True, compare=False)  # follows from the epoch's samples

    def __call__(self, out: dict[str, torch.Tensor], batch: int, inputs: Mapping[str, np.ndarray]) -> None:
        """Apply the operations to batch ``batch`` of the stretch in ``out`` (``images``,
        ``labels``, ``indices`` as the graph gave them): ``images`` in place, ``labels`` replaced
        by the soft targets where the batch is mixed. ``inputs``, the batch's drawn graph inputs,
        are not read: erasing and mixing draw their own."""
        images = out["images"]
        if self.erasing is not None:
            first = batch * self.batch_size
            keys = self.positions[first : first + len(images)]
            images = self.erasing.erase(images, keys, self.seed, self.epoch, self.layout)
        if self.batch_mix is not None:
            position = batch_position(batch, self.rank, self.world_size, before=self.before)
            images, out["labels"] = self.batch_mix.apply(images, out["labels"].reshape(-1), self.seed,
                                                         self.epoch, position, self.layout)
        out["images"] = images
