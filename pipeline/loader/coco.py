"""Loaders for scripts written around torchvision's COCO datasets.

torchvision's detection reference (``references/detection/train.py``) reads its pictures through
``torchvision.datasets.CocoDetection`` datasets made from an annotations file, and scores its
predictions with pycocotools against that file: keyed by COCO image id, in each source picture's
own pixels. A store made from the same folder and file (``tilefeed preprocess SRC OUT
--annotations FILE``) keeps each sample's source path, and a picture's image id is the id of the
``file_name`` its path names under the dataset's image folder (``coco_image_ids``).

``torchvision_detection_loader`` gives the script its two loaders from its own datasets: the
training Loader over exactly the dataset's pictures (the script drops pictures without usable
annotations from its training set; ``indices=`` does the same), and ``CocoEvaluation``, an
evaluation Loader that hands each picture's image id over with its targets and maps predicted
boxes and masks back to the source picture (``to_source``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.loader.loader import Loader
from tilefeed.pipeline.reading.reader import StoreReader, source_paths
from tilefeed.pipeline.recipe.adapters import torchvision_detection_options
from tilefeed.store.errors import ConfigError

MISSING = -1  # the image id of a sample whose picture the annotations file does not list


def coco_image_ids(reader: StoreReader, images: Mapping[int, Mapping[str, Any]],
                   root: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Per sample of a store, the COCO image id of its source picture.

    Parameters
    ----------
    reader : StoreReader
        A store that keeps its samples' source paths.
    images : mapping
        COCO's image entries by id (``pycocotools.coco.COCO.imgs``: each with its ``file_name``,
        relative to the image folder).
    root : str or path-like, optional
        The image folder the store was made from. Default, or when the store's paths do not lie
        under it (a store made on another machine): the one folder under which every sample's
        path is a ``file_name`` of ``images``.

    Returns
    -------
    numpy.ndarray
        (N,) int64 image ids, ``MISSING`` (-1) for a picture the entries do not list.

    Raises
    ------
    ConfigError
        The store keeps no source paths, no folder makes its paths the entries' file names, or
        more than one does.
    """
    paths = source_paths(reader, np.arange(len(reader)))
    if paths and not all(paths):
        raise ConfigError(f"{reader.location}: the store keeps no source paths, which name each sample's "
                          "COCO image")
    by_name = {str(PurePosixPath(str(entry["file_name"]))): int(i) for i, entry in images.items()}
    folder = _folder(paths, by_name, None if root is None else os.fspath(root), reader.location)
    return np.array([by_name.get(p[len(folder):], MISSING) if p.startswith(folder) else MISSING
                     for p in paths], dtype=np.int64)


def _folder(paths: Sequence[str], by_name: Mapping[str, int], root: str | None, location: str) -> str:
    """The prefix (ending in '/') that turns the store's paths into the file names, or '' for none."""
    if root is not None:
        given = root.rstrip("/") + "/"
        if all(p.startswith(given) for p in paths):
            return given
    common: set[str] | None = None
    for path in paths:
        parts = path.split("/")
        found = {"/".join(parts[:k]) + "/" for k in range(1, len(parts)) if "/".join(parts[k:]) in by_name}
        if found:  # a path the file does not list at all says nothing about the folder
            common = found if common is None else common & found
    if not common:
        raise ConfigError(f"{location}: no folder makes the store's source paths the annotations' file_name "
                          "entries (was the store made from this annotations file's images?)")
    if len(common) > 1:
        raise ConfigError(f"{location}: the store's source paths are file_name entries under each of "
                          f"{', '.join(sorted(common))}: give the image folder (root=)")
    return common.pop()


def coco_dataset(dataset: Any) -> tuple[Any, str, list[int]]:
    """The ``CocoDetection`` under a dataset, and the image ids the dataset reads, in its order.

    Parameters
    ----------
    dataset : torchvision.datasets.CocoDetection
        Or one wrapped for transforms v2 (``wrap_dataset_for_transforms_v2``), or a
        ``torch.utils.data.Subset`` of either, as the detection reference builds them.

    Returns
    -------
    tuple
        The COCO api (``pycocotools.coco.COCO``), the image folder, and the dataset's image ids.

    Raises
    ------
    ConfigError
        No ``CocoDetection`` lies under ``dataset``.
    """
    positions: list[int] | None = None
    for _ in range(16):  # Subset over Subset over a wrapper: each layer narrows or passes through
        if isinstance(dataset, torch.utils.data.Subset):
            chosen = [int(i) for i in dataset.indices]
            positions = chosen if positions is None else [chosen[i] for i in positions]
            dataset = dataset.dataset
        elif hasattr(dataset, "_dataset"):  # torchvision's transforms v2 wrapper
            dataset = dataset._dataset
        else:
            break
    coco, ids, root = (getattr(dataset, name, None) for name in ("coco", "ids", "root"))
    if coco is None or ids is None or root is None:
        raise ConfigError(f"{type(dataset).__name__}: not a torchvision CocoDetection dataset "
                          "(coco, ids, root)")
    ids = [int(i) for i in ids]
    return coco, os.fspath(root), ids if positions is None else [ids[i] for i in positions]


def dataset_samples(reader: StoreReader, dataset: Any) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The store's samples of a torchvision COCO dataset's pictures.

    Parameters
    ----------
    reader : StoreReader
        A store made from the dataset's image folder and annotations file.
    dataset : torchvision.datasets.CocoDetection
        Or a v2 wrapper or ``Subset`` of one (``coco_dataset``).

    Returns
    -------
    tuple
        The samples (store indices, in store order), their image ids, and the dataset's image
        ids no sample holds (pictures the preprocessing rejected, or left out of the store).
    """
    coco, root, wanted = coco_dataset(dataset)
    ids = coco_image_ids(reader, coco.imgs, root)
    chosen = np.flatnonzero(np.isin(ids, np.asarray(wanted, dtype=np.int64)))
    absent = sorted(set(wanted) - set(ids[chosen].tolist()))
    return chosen, ids[chosen], absent


class CocoEvaluation:
    """An evaluation Loader as torchvision's detection reference's ``evaluate`` reads a DataLoader.

    Iterating yields ``(images, targets)``: the Loader's images and its per-image target dicts,
    each with ``image_id`` (the picture's COCO id, as the script's dataset gives it) and
    ``sample`` (its store index) added. ``dataset`` is the script's dataset, from which the
    evaluation takes the COCO ground truth; ``to_source`` maps a batch's predictions back to
    the source pictures' pixels, where that ground truth lies.

    Parameters
    ----------
    loader : Loader
        An evaluation Loader (``train=False``) with ``with_index=True`` and boxes as targets.
    dataset : Any
        The script's evaluation dataset (a ``CocoDetection``, wrapped or not).
    image_ids : numpy.ndarray
        The COCO image id of each store sample (``coco_image_ids``).
    """

    def __init__(self, loader: Loader, dataset: Any, image_ids: np.ndarray) -> None:
        if loader.augment.train or not loader.with_index:
            raise ConfigError("CocoEvaluation takes an evaluation Loader (train=False) with with_index=True")
        self.loader, self.dataset, self.image_ids = loader, dataset, np.asarray(image_ids, dtype=np.int64)
        self._coco = coco_dataset(dataset)[0]

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, list[dict[str, Any]]]]:
        for images, targets, indices in self.loader:
            samples = indices.tolist()
            yield images, [{**t, "image_id": int(self.image_ids[s]), "sample": int(s)}
                           for t, s in zip(targets, samples, strict=True)]

    def to_source(self, outputs: Sequence[Mapping[str, torch.Tensor]],
                  targets: Sequence[Mapping[str, Any]]) -> list[dict[str, torch.Tensor]]:
        """A batch's predictions in the source pictures' pixels.

        Parameters
        ----------
        outputs : sequence of dict
            A detection model's outputs for the batch, one dict per image: ``boxes`` XYXY in
            output pixels, and where the model predicts them ``masks`` (k, 1, S, S)
            probabilities on the output image (Mask R-CNN's).
        targets : sequence of dict
            The batch's targets as iterating gave them (their ``sample``).

        Returns
        -------
        list of dict
            The outputs with ``boxes`` in source pixels (the outputs' dtype and device) and
            ``masks`` resampled bilinearly onto each source picture (k, 1, height, width), as
            Mask R-CNN's own paste gives them at the picture's size.
        """
        samples = [int(t["sample"]) for t in targets]
        back = self.loader.boxes_to_source([o["boxes"] for o in outputs], samples)
        mapped = []
        for output, boxes, sample in zip(outputs, back, samples, strict=True):
            out = {**output, "boxes": torch.as_tensor(boxes, dtype=output["boxes"].dtype,
                                                      device=output["boxes"].device)}
            if "masks" in output:
                out["masks"] = self._masks_to_source(output["masks"], sample)
            mapped.append(out)
        return mapped

    def _masks_to_source(self, masks: torch.Tensor, sample: int) -> torch.Tensor:
        """(k, 1, S, S) on the output image -> (k, 1, height, width) on the source picture,
        sampled at each source pixel's centre."""
        entry = self._coco.imgs[int(self.image_ids[sample])]
        height, width = int(entry["height"]), int(entry["width"])
        side = masks.shape[-1]
        # evaluation framing has no flip: the output square's corners map to the source by an
        # affine of positive scale, which the box of the whole output square gives
        x0, y0, x1, y1 = self.loader.boxes_to_source([np.array([[0.0, 0.0, side, side]])], [sample])[0][0]
        xs = (torch.arange(width, dtype=torch.float64) + 0.5 - x0) / (x1 - x0) * 2 - 1
        ys = (torch.arange(height, dtype=torch.float64) + 0.5 - y0) / (y1 - y0) * 2 - 1
        grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1)
        grid = grid.to(masks.device, torch.float32).expand(len(masks), height, width, 2)
        if len(masks) == 0:
            return masks.new_zeros((0, 1, height, width))
        return torch.nn.functional.grid_sample(masks.float(), grid, mode="bilinear", padding_mode="zeros",
                                               align_corners=False).to(masks.dtype)

    def close(self) -> None:
        """Close the Loader."""
        self.loader.close()

    def __enter__(self) -> CocoEvaluation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def torchvision_detection_loader(store: str | os.PathLike[str], args: Any, dataset: Any, *,
                                 train: bool) -> Loader | CocoEvaluation:
    """The Loader that replaces one of torchvision's detection reference's DataLoaders.

    Parameters
    ----------
    store : str or path-like
        A store made from the dataset's image folder with its annotations file (``tilefeed
        preprocess SRC OUT --annotations FILE``, with ``--instance-masks`` for Mask R-CNN).
    args : argparse.Namespace
        ``references/detection/train.py``'s parsed arguments (``torchvision_detection_options``).
    dataset : Any
        The script's dataset for this loader (``get_dataset``'s): its pictures are the ones
        read, and its COCO file gives their image ids.
    train : bool
        ``data_loader`` or ``data_loader_test``.

    Returns
    -------
    Loader or CocoEvaluation
        Training: a Loader over the store's samples of the dataset's pictures (``indices=``).
        Evaluation: a ``CocoEvaluation`` over them, in store order.

    Raises
    ------
    ConfigError
        A refused flag (``TORCHVISION_DETECTION_FLAGS``); a store made with ``--fit crop``;
        crowd objects in training without
        ``--use-v2``; in evaluation, a picture of the dataset missing from the store, or one
        picture cut into several tiles.
    """
    options = torchvision_detection_options(args, train=train)
    with StoreReader(store) as reader:
        samples, image_ids, absent = dataset_samples(reader, dataset)
        fit = reader.meta.made.get("fit")
    script = "torchvision detection train.py"
    if absent and train:
        warnings.warn(f"{store}: {len(absent)} training pictures of the dataset are not in the store "
                      f"(image ids {', '.join(map(str, absent[:5]))}{', ...' if len(absent) > 5 else ''}): "
                      f"training on the other {len(samples)}", stacklevel=2)
    if absent and not train:
        raise ConfigError(f"{store}: {len(absent)} evaluation pictures of the dataset are not in the store "
                          f"(image ids {', '.join(map(str, absent[:5]))}): the score would leave them out")
    if not train and len(np.unique(image_ids)) < len(image_ids):
        raise ConfigError(f"{store}: a picture is cut into several tiles; evaluation scores whole pictures "
                          "(preprocess with one tile a picture)")
    if fit == "crop":
        raise ConfigError(f"{script}: {store} was made with --fit crop, which cuts the pictures; the "
                          "script trains on and scores whole pictures (preprocess with --fit stretch, or pad "
                          "to evaluate)")
    if train and not getattr(args, "use_v2", False):
        coco = coco_dataset(dataset)[0]
        chosen = set(image_ids.tolist())
        if any(a.get("iscrowd", 0) and a["image_id"] in chosen for a in coco.anns.values()):
            raise ConfigError(f"{script} without --use-v2 drops crowd objects from its training targets; the "
                              "Loader hands them over (iscrowd 1), as --use-v2 does: pass --use-v2")
    loader = Loader(os.fspath(store), indices=samples.tolist(), with_index=not train, **options)
    if train:
        return loader
    ids = np.full(len(loader.reader), -1, dtype=np.int64)
    ids[samples] = image_ids
    return CocoEvaluation(loader, dataset, ids)
