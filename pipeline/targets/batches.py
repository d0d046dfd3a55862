"""What a batch's targets hold, and the shapes models take them in.

What a batch carries besides its pixels is named by ``pipeline.options.Targets`` (the
Loader's ``targets=``); ``frame_targets`` moves a batch's stored boxes and masks through its
``Framing`` in one call;
``FramedTargets`` then gives them as torchvision's detection format (a list of per-image dicts
of ``boxes``, ``labels``, ``iscrowd`` and, where asked, ``masks``) or as padded tensors with
counts (fixed shapes, for compiled steps and for moving to the device in one copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tilefeed.pipeline.options import Targets
from tilefeed.pipeline.targets.affine import Affines, affine_boxes, affine_masks, hflip_boxes
from tilefeed.pipeline.targets.geometry import Framing, check_thresholds, frame_boxes, sanitize, transform_boxes
from tilefeed.pipeline.targets.masks import MaskBatch, instance_masks, remap_ids, to_device, transform_masks
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import MaskKind

PAD_LABEL = -1  # a padded slot's label: no category id is negative


def check_targets(asked: frozenset[Targets], boxes: bool, masks: MaskKind | str | None) -> None:
    """Refuse targets a store does not hold, in one line.

    Parameters
    ----------
    asked : frozenset of Targets
        What the batch should hold (``parse_targets``).
    boxes : bool
        The store holds boxes.
    masks : MaskKind, str or None
        The store's masks, if any.
    """
    if Targets.BOXES in asked and not boxes:
        raise ConfigError("targets: boxes asked of a store that holds none")
    if Targets.MASKS in asked:
        if masks is None:
            raise ConfigError("targets: masks asked of a store that holds none")
        if MaskKind(masks) is MaskKind.INSTANCE and Targets.BOXES not in asked:
            raise ConfigError("targets: an instance store's masks follow its boxes: ask for boxes and masks")


@dataclass(frozen=True)
class FramedTargets:
    """A batch's targets in output pixels: boxes on the host, masks where they were made.

    Attributes
    ----------
    objects : Objects or None
        The surviving boxes (None without ``Targets.BOXES``).
    masks : torch.Tensor or None
        (n, S, S) uint8: semantic class ids, or instance ids renumbered for the surviving
        boxes (sample ``i``'s ``m``-th box is ``m + 1``, 0 background); None without masks.
        On the device the mask tiles were given on.
    kind : MaskKind or None
        What ``masks`` holds.
    """

    objects: Objects | None
    masks: torch.Tensor | None
    kind: MaskKind | None

    def as_dicts(self, device: torch.device | str | None = None) -> list[dict[str, torch.Tensor]]:
        """torchvision's detection targets: per image ``boxes`` float32 (k, 4) XYXY, ``labels``
        int64 (k,), ``iscrowd`` int64 (k,), and ``masks``: uint8 (k, S, S) per object for an
        instance store, (S, S) class ids for a semantic one.

        Parameters
        ----------
        device : torch.device or str, optional
            Where the boxes, labels and crowd flags go (one copy a field for the batch, each
            image's a view of it); default the masks' device, else the host.

        Returns
        -------
        list of dict
            One dict per image.
        """
        n = len(self.objects) if self.objects is not None else len(self.masks if self.masks is not None else [])
        out: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
        place = self._device(device)
        if self.objects is not None:
            o = self.objects
            sections = o.counts.tolist()
            for key, values in (("boxes", o.boxes.astype(np.float32)), ("labels", o.labels.astype(np.int64)),
                                ("iscrowd", o.iscrowd.astype(np.int64))):
                for i, part in enumerate(torch.split(to_device(values, place), sections)):
                    out[i][key] = part
        if self.masks is not None:
            masks = self.masks.to(place, non_blocking=True)
            if self.kind is MaskKind.INSTANCE:
                assert self.objects is not None  # check_targets: instance masks come with boxes
                for i, m in enumerate(instance_masks(masks, _renumbered(self.objects))):
                    out[i]["masks"] = m
            else:
                for i in range(n):
                    out[i]["masks"] = masks[i]
        return out

    def as_padded(self, max_objects: int | None = None,
                  device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Fixed shapes: ``boxes`` float32 (n, K, 4) (zeros past the count), ``labels`` int64
        (n, K) (-1 past it), ``iscrowd`` int64 (n, K) (0), ``counts`` int64 (n,), and
        ``masks`` uint8 (n, S, S) (semantic ids, or instance ids where box slot ``m`` is id
        ``m + 1``).

        Parameters
        ----------
        max_objects : int, optional
            K; default the batch's largest count. A sample with more boxes is an error, never
            a silent cut.
        device : torch.device or str, optional
            Where the tensors go; default the masks' device, else the host.

        Returns
        -------
        dict of str to torch.Tensor
            The padded batch.
        """
        out: dict[str, torch.Tensor] = {}
        place = self._device(device)
        if self.objects is not None:
            o = self.objects
            counts = o.counts
            most = int(counts.max()) if len(counts) else 0
            k = most if max_objects is None else max_objects
            if most > k:
                worst = int(np.argmax(counts))
                raise ConfigError(f"padded targets: sample {worst} has {most} boxes, more than max_objects={k}")
            rows, slots = o.samples(), np.arange(len(o.boxes)) - o.offsets[o.samples()]
            boxes = np.zeros((len(o), k, 4), np.float32)
            labels = np.full((len(o), k), PAD_LABEL, np.int64)
            crowd = np.zeros((len(o), k), np.int64)
            boxes[rows, slots], labels[rows, slots], crowd[rows, slots] = o.boxes, o.labels, o.iscrowd
            out.update(boxes=to_device(boxes, place), labels=to_device(labels, place),
                       iscrowd=to_device(crowd, place), counts=to_device(counts.astype(np.int64), place))
        if self.masks is not None:
            out["masks"] = self.masks.to(place, non_blocking=True)
        return out

    def _device(self, device: torch.device | str | None) -> torch.device:
        if device is not None:
            return torch.device(device)
        return self.masks.device if self.masks is not None else torch.device("cpu")


def _renumbered(objects: Objects) -> Objects:
    """The same rows with ``ids`` their slot within the sample (what ``remap_ids`` numbered)."""
    slots = np.arange(len(objects.boxes), dtype=np.int64) - objects.offsets[objects.samples()]
    return Objects(objects.offsets, objects.boxes, objects.labels, objects.iscrowd, slots)


def frame_targets(framing: Framing, asked: frozenset[Targets], objects: Objects | None = None,
                  masks: MaskBatch | None = None, kind: MaskKind | str | None = None,
                  min_size: float = 1.0, min_area: float = 1.0,
                  affines: Affines | None = None) -> FramedTargets:
    """A batch's stored targets through its framing: boxes moved, clamped and sanitised
    (``transform_boxes``), masks resampled (``transform_masks``), instance ids renumbered for
    the boxes that survive. With ``affines`` (an auto-augment policy's geometric ops), the
    images' order: crop and resize, vertical flip, the policy's ops, horizontal flip; then the
    clamp and sanitising.

    Parameters
    ----------
    framing : Framing
        One framing per sample (``Framing.windows`` with the graph's windows and flips;
        ``Framing.centre`` for whole tiles in evaluation).
    asked : frozenset of Targets
        What the batch holds (``parse_targets``).
    objects : Objects, optional
        The batch's boxes in tile pixels (``Objects.gather``), needed with ``Targets.BOXES``.
    masks : torch.Tensor or numpy.ndarray, optional
        (n, T, T) uint8 mask tiles, needed with ``Targets.MASKS``; the masks are made on their
        device (a host array: the host).
    kind : MaskKind or str, optional
        What the mask tiles hold.
    min_size, min_area : float
        ``SanitizeBoundingBoxes``' thresholds.
    affines : Affines, optional
        Per sample, the policy's geometric ops (``Affines``); None: none.

    Returns
    -------
    FramedTargets
        The batch's targets in output pixels.
    """
    check_thresholds(min_size, min_area)
    mask_kind = None if kind is None else MaskKind(kind)
    check_targets(asked, objects is not None, mask_kind if masks is not None else None)
    # pixels the image does not carry: ignore for class ids, background for instance ids
    fill = 255 if mask_kind is MaskKind.SEMANTIC else 0
    # the policy runs between the vertical flip and the horizontal one, as on the images
    # (``host_ops.apply`` and ``ops.apply``; the graph's crop_mirror_normalize mirrors last)
    hflip = framing.hflip
    first = framing if affines is None else Framing(framing.origin, framing.region, framing.resized,
                                                    framing.anchor, framing.size,
                                                    np.zeros_like(hflip), framing.vflip)
    kept = None
    if Targets.BOXES in asked and objects is not None:
        if affines is None:
            kept = transform_boxes(framing, objects, min_size, min_area)
        else:
            moved = hflip_boxes(affine_boxes(frame_boxes(first, objects), affines, framing.size),
                                hflip, framing.size)
            kept = sanitize(moved, framing.size, min_size, min_area)
    framed = None
    if Targets.MASKS in asked and masks is not None:
        framed = transform_masks(first, masks, fill)
        if affines is not None:
            framed = affine_masks(framed, affines, fill)
            if hflip.any():
                mirrored = to_device(np.flatnonzero(hflip), framed.device)
                framed[mirrored] = framed[mirrored].flip(-1)
        if mask_kind is MaskKind.INSTANCE and kept is not None:
            framed = remap_ids(framed, kept)
    return FramedTargets(kept, framed, mask_kind if framed is not None else None)
