"""A batch's boxes and masks, made as the batch is handed over.

The targets follow the pixels: each sample's framing (its crop window, the resize to the output
side, its flips; in evaluation the resize and centre crop) comes from the very inputs its
operations drew for the graph (``operations.graph_inputs``: a plain function of the seed, the
epoch and the sample, carried with the batch, drawn here for a batch that carries none), and the
store's boxes and mask tiles go through it (``pipeline.targets``); an IoU crop's ``keep``, drawn
with its windows and carried beside them, says which boxes it leaves. Nothing about targets
passes through the DALI graph, so a batch's targets are exactly as deterministic as its crops:
a resumed epoch, on any world size, gives them bit for bit.

This runs on the Loader's feeding thread, beside the recipe's per-batch operations, so its time
overlaps the training step. The boxes are worked out on the host (a few numbers an object); the
masks, the heavy part, are made on the batch's device: on a GPU Loader the mask tiles are read
into pinned memory, copied without blocking on the feed's side stream, and gathered, moved and
split into per-object masks there, so a batch's targets come on the device of its images (boxes,
labels, crowd flags and counts copied over, one copy a field). Like the per-batch operations, a
``BatchTargets`` is a plain record of settings (the store's reader aside, which the graph holds
anyway): two are equal when they make the same targets for the same batch.

The Loader's other dealings with a store's targets live here too: the check that the store holds
what is asked (``check_store_targets``), the stored boxes an IoU crop draws against
(``store_objects``), and predicted boxes mapped back to the source images (``source_boxes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.crops import StoreObjects
from tilefeed.pipeline.engine.operations import graph_inputs
from tilefeed.pipeline.recipe.policy_tables import GEOMETRIC, OPS
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.pipeline.reading.protocol import Reader
from tilefeed.pipeline.reading.mixed_targets import MixedTargets
from tilefeed.pipeline.targets.affine import Affines
from tilefeed.pipeline.options import Targets, TargetsLayout
from tilefeed.pipeline.targets.batches import FramedTargets, check_targets, frame_targets
from tilefeed.pipeline.targets.geometry import Framing
from tilefeed.pipeline.targets.mapping import boxes_to_source
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError
from tilefeed.store.targets import StoreTargets

TARGETS = "targets"  # the hand-over's entry that holds them


def check_store_targets(reader: Reader, asked: frozenset[Targets]) -> None:
    """Refuse targets the store does not hold, in one line.

    Parameters
    ----------
    reader : StoreReader or MixedReader
        The store, or a mixture's stores (each named where it lacks what is asked).
    asked : frozenset of Targets
        What a batch is to hold.

    Raises
    ------
    ConfigError
        The store holds no targets, or not the ones asked.
    """
    store = reader.targets
    if isinstance(store, MixedTargets):  # each store named where it lacks what is asked
        store.check(Targets.BOXES in asked, Targets.MASKS in asked)
    if store is None:
        raise ConfigError(f"targets: {reader.location} holds no boxes or masks (it was made "
                          "without --annotations, --yolo or --masks)")
    check_targets(asked, store.offsets is not None, store.masks)


def store_objects(reader: Reader, recipe: Recipe | None, train: bool) -> StoreObjects | None:
    """The store's object offsets and rows, which a recipe's ``crop="iou"`` or ``"zoom_iou"``
    draws against.

    Parameters
    ----------
    reader : StoreReader or MixedReader
        The store, or a mixture's stores.
    recipe : Recipe or None
        The Loader's recipe.
    train : bool
        Whether the Loader trains (evaluation draws no crop).

    Returns
    -------
    tuple of numpy.ndarray or None
        Offsets (N + 1,) and rows (M, 6); None where no such crop is drawn.

    Raises
    ------
    ConfigError
        Such a crop over a store without boxes (or a mixture with a store that has none).
    """
    if recipe is None or not recipe.crop.against_boxes or not train:
        return None
    store = reader.targets
    if isinstance(store, MixedTargets):  # each store's boxes, or a background store's none
        store.check(boxes=True, masks=False, what=f"crop={recipe.crop.value!r}")
    if store is None or store.offsets is None or store.objects is None:
        raise ConfigError(f"crop={recipe.crop.value!r} draws each window against the sample's stored "
                          "boxes: read a store made with boxes (--annotations or --yolo)")
    return store.offsets, store.objects


def source_boxes(reader: Reader, augment: Augment, ids_name_positions: bool, seed: int, epoch: int,
                 size: int, boxes: Sequence[Any], indices: Any,
                 objects: StoreObjects | None = None) -> list[np.ndarray]:
    """Boxes on a batch's images (XYXY, output pixels) in the pixels of each sample's source
    image: its framing of ``epoch`` at ``size`` undone (``Loader.boxes_to_source``).

    Parameters
    ----------
    reader : StoreReader or MixedReader
        The store, or a mixture's stores (each sample's frames from its own).
    augment : Augment
        The graph's framing and recipe.
    ids_name_positions : bool
        Whether a sample's id names its position in the epoch, which training crops are drawn
        from (one store: yes; a mixture, which may take a sample twice: no).
    seed, epoch, size : int
        The Loader's seed, the batch's epoch and its output side.
    boxes : sequence of array-like
        Per sample of the batch, (k, 4) boxes (numpy arrays or tensors, on any device).
    indices : array-like
        The batch's store indices.
    objects : tuple of numpy.ndarray, optional
        The store's object offsets and rows, for a recipe's ``crop="iou"`` (``store_objects``).

    Returns
    -------
    list of numpy.ndarray
        Per sample, (k, 4) float64 XYXY in source-image pixels.

    Raises
    ------
    ConfigError
        A store without targets, a mixture's training batches, or an auto-augment policy's
        geometric ops, which are not mapped back.
    """
    if reader.targets is None:  # of a mixture, each sample's store's frames
        raise ConfigError("boxes_to_source needs a store made with targets (its frames map tiles to "
                          "source images)")
    if not ids_name_positions and augment.train:
        raise ConfigError("boxes_to_source over a mixture maps evaluation batches: its training crops "
                          "are drawn from positions, which ids do not name")
    recipe = augment.recipe
    if augment.train and recipe is not None and recipe.auto_augment is not None:
        raise ConfigError("boxes_to_source maps back the crop and flips, not an auto-augment policy's "
                          "shears and rotations: map evaluation batches, or train without auto_augment")
    samples = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices,
                         dtype=np.int64).reshape(-1)
    framing = sample_framing(reader, augment, seed, epoch, size, samples, samples, objects=objects)
    host = [b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else b for b in boxes]
    return boxes_to_source(host, framing, reader.targets.frames_of(samples))


def sample_framing(reader: Reader, augment: Augment, seed: int, epoch: int, size: int,
                   samples: np.ndarray, keys: np.ndarray,
                   objects: StoreObjects | None = None) -> Framing:
    """How the graph frames ``samples`` of ``epoch`` at output side ``size``: the same draws it
    is given (``operations.graph_inputs``, by name): their crop windows, flips
    and output size; or, for whole tiles in evaluation, the resize and centre crop.

    Parameters
    ----------
    reader : StoreReader or MixedReader
        The store, or a mixture's stores (their tiles' picture boxes).
    augment : Augment
        The graph's framing and the recipe's flips.
    seed, epoch, size : int
        The Loader's seed, the epoch and its output side.
    samples : numpy.ndarray
        Store indices (of a mixture: its global ids).
    keys : numpy.ndarray
        Their positions in the epoch, which their crops are drawn from (of one store, the
        samples themselves).
    objects : tuple of numpy.ndarray, optional
        The store's object offsets and rows, for a recipe's ``crop="iou"``.

    Returns
    -------
    Framing
        One framing per sample.
    """
    inputs = graph_inputs(reader.boxes, augment, seed, epoch, size, samples, keys, objects)
    return _framing(augment, inputs, size, len(samples))


def _framing(augment: Augment, inputs: Mapping[str, np.ndarray], size: int, n: int) -> Framing:
    """The framing ``inputs`` give the graph (``sample_framing``)."""
    if augment.windows:
        return Framing.windows(inputs["start"], inputs["end"], inputs["size"], inputs["flip"],
                               inputs.get("vflip"))
    return Framing.centre(n, augment.tile, augment.resize_to(size), size)


def policy_affines(augment: Augment, inputs: Mapping[str, np.ndarray]) -> Affines | None:
    """The auto-augment policy's geometric ops per sample, from the very inputs the images are
    warped by (``AutoAugment.draw``'s ``aa_op`` and ``aa_matrix``); None where the graph applies
    no policy (no recipe policy, or evaluation).

    Parameters
    ----------
    augment : Augment
        The graph's framing and recipe.
    inputs : mapping of str to numpy.ndarray
        The graph's per-sample inputs by name (``operations.graph_inputs``).

    Returns
    -------
    Affines or None
        Per sample and op slot, the output-to-input map and whether the op moves pixels.
    """
    recipe = augment.recipe
    if not augment.train or recipe is None or recipe.auto_augment is None:
        return None
    geometric = np.array([OPS.index(op) for op in GEOMETRIC], dtype=np.int32)
    return Affines.of(inputs["aa_matrix"], np.isin(inputs["aa_op"], geometric))


@dataclass(frozen=True)
class BatchTargets:
    """The boxes and masks of one epoch stretch's batches, for the hand-over.

    Attributes
    ----------
    asked : frozenset of Targets
        What a batch holds.
    layout : Layout
        torchvision's list of per-image dicts, or padded tensors with counts.
    augment : Augment
        The graph's framing and the recipe's flips.
    seed, epoch, size : int
        The Loader's seed, the epoch and its output side.
    batch_size : int
        Samples per batch (the positions of batch ``b`` are ``positions[b * batch_size:]``).
    min_size, min_area : float
        ``SanitizeBoundingBoxes``' thresholds, in output pixels.
    max_objects : int or None
        The padded layout's slots per image (None: the batch's largest count).
    reader : StoreReader or MixedReader
        The store, whose boxes, mask tiles and picture boxes are read; or a mixture, each
        sample's from its own store (``MixedTargets``).
    positions : numpy.ndarray
        The stretch's positions, which the crops are drawn from (of one store, its samples).
    """

    asked: frozenset[Targets]
    layout: TargetsLayout
    augment: Augment
    seed: int
    epoch: int
    size: int
    batch_size: int
    min_size: float = 1.0
    min_area: float = 1.0
    max_objects: int | None = None
    reader: Reader | None = field(default=None, compare=False)
    positions: np.ndarray = field(kw_only=True, compare=False)  # follows from the epoch's samples

    def framed(self, samples: np.ndarray, keys: np.ndarray, device: torch.device | None = None,
               inputs: Mapping[str, np.ndarray] | None = None) -> FramedTargets:
        """The targets of ``samples`` (store indices) in output pixels.

        Parameters
        ----------
        samples : numpy.ndarray
            The batch's store indices, in order.
        keys : numpy.ndarray
            Their positions, which their crops are drawn from.
        device : torch.device, optional
            Where the masks are made (a CUDA device: on its current stream); default the host.
        inputs : mapping of str to numpy.ndarray, optional
            What the batch's operations drew (``operations.graph_inputs``: its windows and
            flips, an IoU crop's ``keep`` of its objects), carried with the batch to its
            hand-over; drawn here, once, where not given.

        Returns
        -------
        FramedTargets
            Boxes moved, clamped and sanitised; masks resampled with nearest sampling.
        """
        reader = self.reader
        assert reader is not None and reader.targets is not None
        store = reader.targets
        samples = np.asarray(samples, dtype=np.int64)
        stored = None if store.offsets is None or store.objects is None else (store.offsets, store.objects)
        if not inputs:
            inputs = graph_inputs(reader.boxes, self.augment, self.seed, self.epoch, self.size, samples, keys,
                                  stored)
        framing = _framing(self.augment, inputs, self.size, len(samples))
        objects = None
        if Targets.BOXES in self.asked and stored is not None:
            objects = Objects.gather(stored[0], stored[1], samples)
            # SSD's crop: the boxes whose centres it leaves out go, as RandomIoUCrop marks them
            # (its keep, drawn with the windows that frame the pixels)
            if "keep" in inputs:
                objects = objects.select(inputs["keep"])
        masks = None
        if Targets.MASKS in self.asked:
            masks = self._read_masks(store, samples, device)
        return frame_targets(framing, self.asked, objects, masks, store.masks, self.min_size, self.min_area,
                             policy_affines(self.augment, inputs))

    @staticmethod
    def _read_masks(store: StoreTargets | MixedTargets, samples: np.ndarray,
                    device: torch.device | None) -> torch.Tensor:
        """The batch's mask tiles on ``device``: read on the host (into pinned memory for a GPU,
        then copied on its current stream without blocking the feeding thread)."""
        shape = (len(samples), store.tile, store.tile)
        cuda = device is not None and device.type == "cuda"
        tiles = torch.empty(shape, dtype=torch.uint8, pin_memory=cuda)
        store.read_masks_into(samples, tiles.numpy())
        # the pinned buffer is reused only once the copy is done (torch's host allocator waits)
        return tiles.to(device, non_blocking=True) if cuda else tiles

    def __call__(self, out: dict[str, Any], batch: int, inputs: Mapping[str, np.ndarray]) -> None:
        """Add batch ``batch``'s targets to the hand-over's ``out``, in ``layout``, on the device
        of its images, framed by the ``inputs`` its graph was given."""
        samples = out["indices"].reshape(-1).cpu().numpy()
        first = batch * self.batch_size
        keys = self.positions[first : first + len(samples)]
        device = out["images"].device
        framed = self.framed(samples, keys, device, inputs)
        padded = self.layout is TargetsLayout.PADDED
        out[TARGETS] = framed.as_padded(self.max_objects, device) if padded else framed.as_dicts(device)
