"""A refactoring net: does the working tree produce byte for byte what a base commit produces?

``python tools/same_output.py [--base COMMIT] [--only NAME[,NAME]] [--keep DIR]``

The base commit (default ``HEAD``) is checked out into a temporary ``git worktree`` (removed at
the end, failure or not). Then, for each side, the base worktree and the working tree this file
lies in, a child process runs *this* file's dump code (``--dump``; the base commit need not hold
this tool) with ``PYTHONPATH=<side>/src``, so ``import tilefeed`` is that side's code (the links
in ``src/tilefeed`` point into the side's own tree; the child checks every ``tilefeed`` module it
loaded lies there, and fails loudly otherwise), with a work folder and a ``TILEFEED_CACHE`` of
its own. The child

- generates small image folders and a COCO set with ``tilefeed.bench.fixtures`` and makes stores
  of them with ``preprocess`` (what ``tilefeed preprocess`` calls): lz4, JPEG-coded, grid mode,
  crop fit, COCO boxes, COCO instance masks; each store's every file is hashed (sha256), JSON
  files without the ``VOLATILE`` keys;
- runs Loader scenarios on them on the CPU (shuffles, train and evaluation framing, dtypes and
  layouts, recipes with flips, jitter, grayscale, each auto-augment policy family, erasing and
  mixup/cutmix, the detection crops, boxes and masks in both target layouts, a ``Mix``, a subset,
  a size schedule, rank 1 of 2, ``drop_last``, ``with_index``, the recipe adapters, a ledger,
  errors, and a set of them again through the GPU's graph shape on DALI's CPU backend,
  ``TILEFEED_DEVICE_GRAPH=1``): two epochs each, every batch hashed (the images' bytes, dtype,
  shape and strides, labels or targets, indices), the ``state_dict()`` taken after two batches
  of the second epoch, and the batches a fresh Loader yields after ``load_state_dict`` of it. A
  scenario that raises records the exception's type and message instead, so a changed error
  reads as a difference too, and a scenario the base does not support does not stop the run.

The parent compares the two dumps store by store and scenario by scenario, prints ``same`` or
``DIFFERS: <where>`` for each, and exits 0 when everything is the same, 1 when anything differs,
2 when the tool itself could not run (no such commit, a child that died or hung). Both sides
run one after the other, each in a fresh folder of the same layout with the stores named by
relative paths, so no absolute path reaches a store or a result (error messages have the work
folder replaced by ``<work>``).

Maintenance: ``--self-test`` dumps the base commit twice and compares the two dumps: every
scenario must read ``same`` (it is how ``VOLATILE`` was found, and how a nondeterministic
scenario would show itself). ``--dump OUTDIR`` alone writes one side's dump with whatever
``tilefeed`` is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

TOOL = Path(__file__).resolve()
TREE = TOOL.parents[1]  # the working tree this file belongs to: the "tree" side

# Keys dropped from every JSON document hashed or compared (store files, preprocess summaries,
# ledger headers, the dumps themselves), found by dumping the same commit twice (--self-test):
# - "seconds", "phases": the preprocess Summary's wall-clock durations;
# - "run": a ledger record's run id (time stamp, process id and a random uuid), which names
#   its file too (replaced by "<run>" there);
# - "elapsed": this tool's own timing of a scenario.
# The stores' own zarr.json files hold no time stamp, host name or version of the package; the
# absolute paths they would hold (source_paths, the fingerprint and digest over them) are kept
# equal by running both sides in folders of one layout with relative paths, so they are
# compared, not dropped.
VOLATILE = frozenset({"seconds", "phases", "run", "elapsed"})

TILE = 64
BATCH = 8
WORKERS = 2
EPOCHS = 2
RESUME_AFTER = 2  # batches of epoch 1 handed over before state_dict() (fewer in a short epoch)
SIZES = ((160, 120), (120, 160), (150, 100), (128, 128))  # source pictures: small, of several shapes
CHILD_TIMEOUT = 900  # seconds one side's dump may take before it is killed
EXIT_SAME, EXIT_DIFFERS, EXIT_BROKEN = 0, 1, 2


# -- the scenarios ------------------------------------------------------------------------------

Options = Callable[[ModuleType], dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    """One Loader configuration run for two epochs and a resume.

    Parameters
    ----------
    name : str
        The scenario's name (its dump file's name).
    store : str
        The store it reads (a name of ``STORES``), unless ``options`` gives ``store`` itself.
    options : callable
        ``tilefeed -> Loader keyword arguments``, called inside the scenario's ``try``: a name
        the side lacks is recorded as the scenario's error.
    device_graph : bool
        Build the GPU's graph shape on DALI's CPU backend (``TILEFEED_DEVICE_GRAPH=1``).
    probe : str, optional
        Also record, per batch, ``boxes_to_source`` (``"boxes_to_source"``) or ``source_of``
        (``"source_of"``) of the batch's indices.
    ledger : bool
        Give the Loader a ledger folder and record its files and its audit.
    adapter : bool
        ``options`` is a recipe adapter's output: record it too (as plain values).
    """

    name: str
    store: str
    options: Options
    device_graph: bool = False
    probe: str | None = None
    ledger: bool = False
    adapter: bool = False


# fields renamed since: (name now, name before), each given by the name the side's Recipe takes
RENAMED = (("batch_mix", "mix"),)


def _recipe(**fields: Any) -> Options:
    """Options of a training Loader with ``Recipe(**fields)``, the fields built from tilefeed
    (a renamed field given under the name the side's Recipe has: ``RENAMED``)."""
    def options(tf: ModuleType) -> dict[str, Any]:
        given = dict(fields)
        for now, before in RENAMED:
            if now in given and now not in tf.Recipe.__dataclass_fields__:
                given[before] = given.pop(now)
        return {"train": True, "recipe": tf.Recipe(**given)}
    return options


def _mix(**fields: Any) -> Callable[[ModuleType], Any]:
    """A ``Mix`` of the stores ``plain`` and ``other`` (folders relative to the work folder)."""
    return lambda tf: tf.Mix({"a": "plain", "b": "other"}, **fields)


def _timm_options(tf: ModuleType) -> dict[str, Any]:
    """timm ``train.py``'s training loader options: rand policy, pixel erasing, mixup/cutmix."""
    import argparse as ap

    from tilefeed.pipeline.recipe.adapters import timm_options

    args = ap.Namespace(
        batch_size=BATCH, validation_batch_size=None, workers=WORKERS, pin_mem=False, seed=5, no_aug=False,
        train_crop_mode=None, scale=[0.25, 1.0], ratio=[3 / 4, 4 / 3], hflip=0.5, vflip=0.1,
        color_jitter=0.3, color_jitter_prob=0.5, grayscale_prob=0.1, gaussian_blur_prob=None,
        aa="rand-m7-mstd0.5-inc1", aug_repeats=0, aug_splits=0, reprob=0.4, mixup=0.8, cutmix=1.0,
        cutmix_minmax=None, train_interpolation="random", train_img_sizes=None, train_batches_per_epoch=None,
        naflex_loader=False, epoch_repeats=0.0, train_num_samples=None, val_num_samples=None,
        input_img_mode=None, model_dtype=None, channels_last=True, device="cpu", remode="pixel", recount=2,
        resplit=False, mixup_prob=1.0, mixup_switch_prob=0.5, mixup_mode="batch", smoothing=0.1, num_classes=5,
        no_prefetcher=False)
    config = {"input_size": (3, 48, 48), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
              "std": (0.229, 0.224, 0.225), "crop_pct": 0.9, "crop_mode": "center"}
    return timm_options(args, config, train=True)


def _torchvision_options(tf: ModuleType) -> dict[str, Any]:
    """torchvision's classification reference, training: ta_wide, erasing, mixup and cutmix."""
    import argparse as ap

    from tilefeed.pipeline.recipe.adapters import torchvision_options

    args = ap.Namespace(batch_size=BATCH, workers=WORKERS, train_crop_size=56, val_crop_size=48,
                        val_resize_size=56, interpolation="bicubic", auto_augment="ta_wide", ra_magnitude=9,
                        random_erase=0.3, mixup_alpha=0.2, cutmix_alpha=1.0, ra_sampler=False,
                        distributed=False, device="cpu", weights=None, test_only=False)
    return torchvision_options(args, train=True, num_classes=5)


def _detection_options(tf: ModuleType) -> dict[str, Any]:
    """torchvision's detection reference, training a mask model with the ``ssd`` preset."""
    import argparse as ap

    from tilefeed.pipeline.recipe.adapters import torchvision_detection_options

    args = ap.Namespace(batch_size=BATCH, workers=WORKERS, data_augmentation="ssd",
                        model="maskrcnn_resnet50_fpn", dataset="coco", use_copypaste=False, device="cpu",
                        weights=None, test_only=False)
    return torchvision_detection_options(args, train=True)


MIXING = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5}

BASE_SCENARIOS: tuple[Scenario, ...] = (
    # evaluation framing
    Scenario("eval_plain", "plain", lambda tf: {"shuffle": False}),
    Scenario("eval_size48", "plain", lambda tf: {"size": 48}),
    Scenario("eval_size48_crop1_bicubic", "plain",
             lambda tf: {"size": 48, "crop_pct": 1.0, "recipe": tf.Recipe(interpolation="bicubic")}),
    Scenario("eval_fp16_nhwc", "plain", lambda tf: {"size": 56, "dtype": _torch().float16, "layout": "NHWC"}),
    # training crops, orders, dtypes and layouts
    Scenario("train_global", "plain", lambda tf: {"train": True}),
    Scenario("train_none_seed3", "plain", lambda tf: {"train": True, "shuffle": False, "seed": 3}),
    Scenario("train_shard_window2", "plain",
             lambda tf: {"train": True, "shuffle": "shard", "shuffle_window": 2}),
    Scenario("train_uint8_nhwc", "plain",
             lambda tf: {"train": True, "dtype": _torch().uint8, "layout": "NHWC"}),
    Scenario("train_bf16_channels_last", "plain",
             lambda tf: {"train": True, "dtype": _torch().bfloat16, "layout": "channels_last", "size": 48}),
    Scenario("train_scale_ratio_mean", "plain",
             lambda tf: {"train": True, "scale": (0.3, 1.0), "ratio": (0.5, 2.0), "mean": (0.5, 0.5, 0.5),
                         "std": (0.25, 0.25, 0.25)}),
    # recipes
    Scenario("recipe_flips_jitter_gray", "plain",
             lambda tf: _recipe(hflip=0.3, vflip=0.25, grayscale=0.3, interpolation="random",
                                color_jitter=tf.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8))(tf)),
    Scenario("aa_ta_wide", "plain", _recipe(auto_augment="ta_wide")),
    Scenario("aa_ra", "plain", _recipe(auto_augment="ra")),
    Scenario("aa_imagenet_bicubic", "plain", _recipe(auto_augment="imagenet", interpolation="bicubic")),
    Scenario("aa_timm_rand", "plain", _recipe(auto_augment="rand-m9-mstd0.5-inc1")),
    Scenario("aa_timm_originalr", "plain",
             lambda tf: _recipe(auto_augment=tf.AutoAugment.parse(
                 "originalr-mstd0.5", {"interpolation": "bilinear", "img_mean": (124, 116, 104)}))(tf)),
    Scenario("erasing_mixup_timm", "plain",
             lambda tf: _recipe(erasing=tf.RandomErasing(p=0.6, value="random"),
                                batch_mix=tf.BatchMix(num_classes=5, **MIXING))(tf)),
    Scenario("erasing_cutmix_torchvision", "plain",
             lambda tf: {**_recipe(
                 erasing=tf.RandomErasing.from_timm(probability=0.7, mode="rand", max_count=3),
                 batch_mix=tf.BatchMix.from_torchvision(5, mixup_alpha=0.2, cutmix_alpha=1.0))(tf),
                 "layout": "channels_last"}),
    Scenario("crop_none", "plain", _recipe(crop="none")),
    # epochs, subsets, ranks
    Scenario("schedule_ramp", "plain",
             lambda tf: {"train": True, "size": _ramp()(0, 1, 32, 64, step=16)}),
    Scenario("subset_indices", "plain", lambda tf: {"train": True, "indices": list(range(1, 40, 3))}),
    Scenario("rank1_of_2", "plain", lambda tf: {"train": True, "rank": 1, "world_size": 2}),
    Scenario("drop_last_b6", "plain", lambda tf: {"train": True, "batch_size": 6, "drop_last": True}),
    Scenario("with_index_seed7", "plain", lambda tf: {"train": True, "with_index": True, "seed": 7}),
    Scenario("ledger", "plain", lambda tf: {"train": True}, ledger=True),
    # other stores
    Scenario("jpeg_train", "jpeg", lambda tf: {"train": True}),
    Scenario("jpeg_eval_fast_idct", "jpeg", lambda tf: {"size": 40, "fast_idct": True}),
    Scenario("grid_eval", "grid", lambda tf: {"shuffle": False}),
    Scenario("mix_weights", "mix",
             lambda tf: {"store": _mix(weights={"a": 2, "b": 1}, epoch_samples=36)(tf), "train": True,
                         "with_index": True}, probe="source_of"),
    Scenario("mix_offset_in_order", "mix",
             lambda tf: {"store": _mix(labels="offset")(tf), "shuffle": False, "with_index": True},
             probe="source_of"),
    # boxes and masks
    Scenario("boxes_iou_dicts", "boxes", lambda tf: {**_recipe(crop="iou")(tf), "targets": "boxes"}),
    Scenario("boxes_zoom_iou_padded", "boxes",
             lambda tf: {**_recipe(crop="zoom_iou", fill=(123, 117, 104),
                                   photometric=tf.PhotometricDistort())(tf),
                         "targets": "boxes", "targets_layout": "padded"}),
    Scenario("boxes_lsj", "boxes",
             lambda tf: {**_recipe(crop="lsj", fill=(123, 117, 104))(tf), "targets": "boxes", "size": 96}),
    Scenario("boxes_eval_to_source", "boxes",
             lambda tf: {"targets": "boxes", "with_index": True, "size": 48}, probe="boxes_to_source"),
    Scenario("masks_train_dicts", "masks", lambda tf: {"train": True, "targets": ("boxes", "masks")}),
    Scenario("masks_train_padded_iou", "masks",
             lambda tf: {**_recipe(crop="iou")(tf), "targets": ("boxes", "masks"), "targets_layout": "padded",
                         "max_objects": 8}),
    Scenario("masks_eval_padded", "masks",
             lambda tf: {"size": 48, "targets": ("boxes", "masks"), "targets_layout": "padded"}),
    # the recipe adapters: the options they make are recorded too
    Scenario("adapter_timm", "plain", _timm_options, adapter=True),
    Scenario("adapter_torchvision", "plain", _torchvision_options, adapter=True),
    Scenario("adapter_detection_ssd", "masks", _detection_options, adapter=True),
    # refusals: the error's type and message are the output
    Scenario("error_iou_without_boxes", "plain", _recipe(crop="iou")),
    Scenario("error_mixing_uint8", "plain",
             lambda tf: {**_recipe(batch_mix=tf.BatchMix(num_classes=5))(tf), "dtype": _torch().uint8}),
    Scenario("error_seed_none", "plain", lambda tf: {"seed": None}),
    Scenario("error_batch_size_none", "plain", lambda tf: {"batch_size": None}),
    Scenario("error_layout", "plain", lambda tf: {"layout": "CHW"}),
    Scenario("error_shuffle", "plain", lambda tf: {"shuffle": "random"}),
    Scenario("error_targets", "boxes", lambda tf: {"targets": "keypoints"}),
    Scenario("error_targets_layout", "boxes", lambda tf: {"targets": "boxes", "targets_layout": "list"}),
    Scenario("error_mix_labels", "mix", lambda tf: {"store": _mix(labels="merge")(tf)}),
    Scenario("error_two_bad_options", "plain", lambda tf: {"batch_size": 0, "layout": "CHW"}),
)

# Run again through the GPU's graph shape on DALI's CPU backend (TILEFEED_DEVICE_GRAPH=1).
DEVICE_GRAPH = ("train_global", "eval_size48", "train_bf16_channels_last", "recipe_flips_jitter_gray",
                "aa_ta_wide", "aa_timm_rand", "erasing_mixup_timm", "schedule_ramp", "jpeg_train",
                "boxes_iou_dicts", "boxes_lsj", "masks_train_padded_iou")


def _scenarios() -> tuple[Scenario, ...]:
    """``BASE_SCENARIOS``, then those named in ``DEVICE_GRAPH`` again as ``dg_<name>``."""
    by_name = {s.name: s for s in BASE_SCENARIOS}
    return BASE_SCENARIOS + tuple(replace(by_name[n], name=f"dg_{n}", device_graph=True) for n in DEVICE_GRAPH)


SCENARIOS = _scenarios()


def _torch() -> ModuleType:
    """torch, imported when a scenario's options are made (the parent never loads it)."""
    import torch

    return torch


def _ramp() -> Callable[..., Any]:
    """The side's ``pipeline.planning.sizes.ramp``."""
    from tilefeed.pipeline.planning.sizes import ramp

    return ramp


# -- hashing ------------------------------------------------------------------------------------

def sha256(data: bytes) -> str:
    """The hex sha256 of ``data``.

    Parameters
    ----------
    data : bytes
        What to hash.

    Returns
    -------
    str
        64 hex digits.
    """
    return hashlib.sha256(data).hexdigest()


def strip_volatile(value: Any) -> Any:
    """``value`` (parsed JSON) without the ``VOLATILE`` keys, at any depth.

    Parameters
    ----------
    value : Any
        A JSON value.

    Returns
    -------
    Any
        A copy without those keys.
    """
    if isinstance(value, dict):
        return {k: strip_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip_volatile(v) for v in value]
    return value


def _has_volatile(value: Any) -> bool:
    """Whether parsed JSON holds a ``VOLATILE`` key at any depth."""
    if isinstance(value, dict):
        return any(k in VOLATILE or _has_volatile(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_volatile(v) for v in value)
    return False


def file_digest(path: Path) -> str:
    """A file's sha256; of a JSON file holding ``VOLATILE`` keys, that of its canonical form without them.

    Parameters
    ----------
    path : Path
        The file.

    Returns
    -------
    str
        The hex digest, prefixed ``json:`` where volatile keys were dropped.
    """
    data = path.read_bytes()
    if path.suffix == ".json" or path.name == "zarr.json":
        try:
            parsed = json.loads(data)
        except ValueError:
            return sha256(data)
        if _has_volatile(parsed):
            return "json:" + sha256(json.dumps(strip_volatile(parsed), sort_keys=True).encode())
    return sha256(data)


def tree_digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its relative path, hashed (``file_digest``).

    Parameters
    ----------
    root : Path
        A folder (a store, an image folder).

    Returns
    -------
    dict of str to str
        Relative POSIX path -> digest, sorted.
    """
    return {p.relative_to(root).as_posix(): file_digest(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def digest(value: Any) -> Any:
    """A JSON-able fingerprint of a batch element: tensors and arrays as dtype, shape, strides and
    the sha256 of their bytes in logical (row-major) order; containers element by element.

    Parameters
    ----------
    value : Any
        A tensor, an array, a dict, list or tuple of them, or a plain value.

    Returns
    -------
    Any
        Plain JSON values.
    """
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        flat = t.contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return {"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
                "device": str(value.device), "sha256": sha256(raw)}
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "shape": list(value.shape),
                "sha256": sha256(np.ascontiguousarray(value).tobytes())}
    if isinstance(value, dict):
        return {str(k): digest(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [digest(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def plain(value: Any) -> Any:
    """``value`` as plain JSON values, by what it holds rather than what its classes are called:
    dataclasses as dicts of their public fields, enums as their values, tuples as lists,
    infinities as strings, anything else (a dtype, a function) as its ``str``.

    Parameters
    ----------
    value : Any
        Loader options, a Recipe and its parts.

    Returns
    -------
    Any
        Plain JSON values: an enum or class renamed by a refactoring reads the same.
    """
    import enum
    import math

    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        # a field left None reads as one absent: a record that gains an optional field (off by
        # default) holds what it held before, as its identity() says too
        # a renamed field reads under its name now (``RENAMED``)
        before = {old: now for now, old in RENAMED if now not in value.__dataclass_fields__}
        return {before.get(name, name): plain(getattr(value, name)) for name in value.__dataclass_fields__
                if not name.startswith("_") and getattr(value, name) is not None}
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# -- the child: one side's dump -----------------------------------------------------------------

class Work:
    """The child's work folder: where the stores lie (named relative to it) and what error
    messages have replaced by ``<work>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = sorted({str(root), os.path.realpath(root)}, key=len, reverse=True)

    def clean(self, text: str) -> str:
        """``text`` with the work folder's absolute path replaced by ``<work>``.

        Parameters
        ----------
        text : str
            A message.

        Returns
        -------
        str
            The message, free of this run's folder.
        """
        for name in self.names:
            text = text.replace(name, "<work>")
        return text


def _error(e: BaseException, stage: str, work: Work) -> dict[str, str]:
    """An exception as a scenario's output: its type, its message (work folder cleaned), the stage."""
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": work.clean(str(e)),
            "stage": stage}


def check_side(expect: Path | None) -> None:
    """Fail loudly unless every ``tilefeed`` module loaded lies under ``expect``.

    Parameters
    ----------
    expect : Path, optional
        The side's tree; None: no check (a ``--dump`` run by hand).

    Raises
    ------
    SystemExit
        Naming the first module found elsewhere.
    """
    if expect is None:
        return
    root = expect.resolve()
    for name, module in sorted(sys.modules.items()):
        if name != "tilefeed" and not name.startswith("tilefeed."):
            continue
        where = getattr(module, "__file__", None)
        if where is None:
            continue
        if not Path(os.path.realpath(where)).is_relative_to(root):
            raise SystemExit(f"same_output: {name} was imported from {where}, not from {root}: "
                             "PYTHONPATH did not select the side's code")


def build_stores(work: Work) -> dict[str, Any]:
    """Generate the sources and make the stores in the work folder (the current directory).

    Parameters
    ----------
    work : Work
        The work folder.

    Returns
    -------
    dict
        Per store: its preprocess summary (or error) and the digest of each of its files; under
        ``sources``, the digests of the generated inputs.
    """
    from tilefeed.bench.fixtures.coco import make_coco_folder
    from tilefeed.bench.fixtures.generated import make_image_folder

    make_image_folder("images", classes=5, per_class=8, seed=0, sizes=SIZES)
    make_image_folder("images-b", classes=5, per_class=4, seed=1, sizes=SIZES)
    coco_images, annotations = make_coco_folder("coco", count=28, seed=0, sizes=SIZES)
    made: dict[str, Any] = {"sources": {n: tree_digests(Path(n)) for n in ("images", "images-b", "coco")}}
    coco = {"annotations": str(annotations)}
    plans: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]] = {
        "plain": ("images", {}, {"shard_size": 16}, None),
        "jpeg": ("images", {}, {"codec": "jpeg", "quality": 85, "shard_size": 16}, None),
        "grid": ("images", {"mode": "grid", "stride": 48}, {"codec": "zstd", "shard_size": 32}, None),
        "other": ("images-b", {"fit": "crop", "resample": "bilinear"}, {"shard_size": 8}, None),
        "boxes": (str(coco_images), {}, {"shard_size": 16}, coco),
        "masks": (str(coco_images), {}, {"shard_size": 16}, {**coco, "instance_masks": True}),
    }
    for name, (src, tile, store, targets) in plans.items():
        began = time.perf_counter()
        try:
            summary = _preprocess(src, name, tile, store, targets)
            made[name] = {"summary": summary, "files": tree_digests(Path(name))}
        except Exception as e:  # a side that cannot make it: the error is its output
            made[name] = {"error": _error(e, "preprocess", work)}
        print(f"store {name}: {'error' if 'error' in made[name] else 'made'} "
              f"{time.perf_counter() - began:.1f} s", flush=True)
    return made


def _preprocess(src: str, out: str, tile: dict[str, Any], store: dict[str, Any],
                targets: dict[str, Any] | None) -> dict[str, Any]:
    """``preprocess`` as the CLI calls it, two worker processes; its summary as JSON values."""
    from dataclasses import asdict

    from tilefeed.preprocess import StoreSettings, TargetOptions, TileSettings, preprocess

    summary = preprocess(src, out, TileSettings(tile=TILE, **tile), StoreSettings(**store), workers=2,
                         targets=TargetOptions(**targets) if targets is not None else None)
    plain_summary: dict[str, Any] = strip_volatile(json.loads(json.dumps(asdict(summary), default=str)))
    return plain_summary


@contextlib.contextmanager
def _device_graph_env(on: bool) -> Iterator[None]:
    """``TILEFEED_DEVICE_GRAPH`` set to 1 (``on``) or 0 while a scenario's Loaders are built."""
    saved = os.environ.get("TILEFEED_DEVICE_GRAPH")
    os.environ["TILEFEED_DEVICE_GRAPH"] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TILEFEED_DEVICE_GRAPH", None)
        else:
            os.environ["TILEFEED_DEVICE_GRAPH"] = saved


def _probe(loader: Any, kind: str | None, batch: tuple[Any, ...]) -> Any:
    """``boxes_to_source`` or ``source_of`` of a batch (``Scenario.probe``)."""
    if kind == "boxes_to_source":
        targets, indices = batch[1], batch[-1]
        return digest(loader.boxes_to_source([t["boxes"] for t in targets], indices))
    if kind == "source_of":
        names, samples = loader.source_of(batch[-1])
        return {"names": list(names), "samples": digest(samples)}
    return None


def _batch(loader: Any, scenario: Scenario, batch: Any) -> dict[str, Any]:
    """A batch's record: each element's digest by name, and the probe's output."""
    parts = ("images", "labels", "indices")
    record: dict[str, Any] = {parts[i] if i < 3 else f"part{i}": digest(v) for i, v in enumerate(batch)}
    if scenario.probe is not None:
        record["probe"] = _probe(loader, scenario.probe, batch)
    return record


def run_scenario(tf: ModuleType, scenario: Scenario, work: Work) -> dict[str, Any]:
    """Two epochs of a Loader, the state after ``RESUME_AFTER`` batches of epoch 1, and a resume.

    Parameters
    ----------
    tf : module
        ``tilefeed``.
    scenario : Scenario
        What to run.
    work : Work
        The work folder (the current directory), where the stores are.

    Returns
    -------
    dict
        The scenario's record: options made by an adapter, loader facts, batch digests per
        epoch, the state dict, the resumed batches, or the error and the stage it came at.
    """
    out: dict[str, Any] = {}
    stage = "options"
    loaders: list[Any] = []
    try:
        with _device_graph_env(scenario.device_graph):
            options = {"batch_size": BATCH, **scenario.options(tf)}
            if scenario.adapter:
                out["adapter_options"] = json.loads(work.clean(json.dumps(plain(options), sort_keys=True)))
            options.update(device="cpu", num_workers=WORKERS)
            store = options.pop("store", scenario.store)
            ledger = f"ledger-{scenario.name}"
            if scenario.ledger:
                options["ledger"] = ledger

            def make() -> Any:
                """A Loader of the scenario, closed at its end."""
                loader = tf.Loader(store, **options)
                loaders.append(loader)
                return loader

            stage = "Loader()"
            loader = make()
            stage = "facts"
            out["facts"] = {"len": len(loader), "samples": int(loader.samples), "size": int(loader.size),
                            "epoch_indices": [digest(loader.epoch_indices(e)) for e in range(EPOCHS)]}
            epochs: list[list[dict[str, Any]]] = []
            cut = 0
            for epoch in range(EPOCHS):
                stage = f"epoch {epoch}"
                batches: list[dict[str, Any]] = []
                cut = max(1, min(RESUME_AFTER, len(loader) - 1))
                for batch in loader:
                    stage = f"epoch {epoch} batch {len(batches)}"
                    batches.append(_batch(loader, scenario, batch))
                    if epoch == 1 and len(batches) == cut:
                        stage = "state_dict()"
                        out["state_dict"] = json.loads(json.dumps(loader.state_dict(), sort_keys=True))
                epochs.append(batches)
            out["epochs"] = epochs
            stage = "resume"
            resumed = make()
            resumed.load_state_dict(out["state_dict"])
            out["resumed"] = [_batch(resumed, scenario, b) for b in resumed]
            out["resume_matches"] = out["resumed"] == epochs[1][cut:]
            if scenario.ledger:
                stage = "ledger"
                out["ledger"] = _ledger(Path(ledger))
    except Exception as e:  # the scenario's output is then its error
        out["error"] = _error(e, stage, work)
    finally:
        for loader in loaders:
            try:
                loader.close()
            except Exception as e:
                out.setdefault("close_error", _error(e, "close()", work))
    return out


def _ledger(root: Path) -> dict[str, Any]:
    """A ledger folder's files (each record's header without ``VOLATILE`` keys, its ids hashed;
    the run id in a file's name replaced by ``<run>``) and its audit."""
    from dataclasses import asdict

    from tilefeed.pipeline.audit.ledger import audit

    files: list[list[Any]] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(root).as_posix()
        data = path.read_bytes()
        if path.suffix == ".ledger":
            n = int.from_bytes(data[:4], "little")
            head = json.loads(data[4:4 + n])
            relative = relative.replace(str(head.get("run")), "<run>")
            files.append([relative, strip_volatile(head), sha256(data[4 + n:])])
        else:
            files.append([relative, file_digest(path)])
    files.sort(key=lambda f: json.dumps(f, sort_keys=True))  # two runs' records: their order is the run ids'
    return {"files": files, "audit": json.loads(json.dumps([asdict(a) for a in audit(root)], default=str))}


def dump(out: Path, work_dir: Path | None, expect: Path | None, only: set[str] | None) -> int:
    """Write one side's dump: ``stores.json`` and a ``<scenario>.json`` per scenario.

    Parameters
    ----------
    out : Path
        The dump folder (made if needed).
    work_dir : Path, optional
        Where the sources and stores are made (the process moves there); default a temporary
        folder, removed afterwards.
    expect : Path, optional
        The side's tree: every ``tilefeed`` module must be imported from under it.
    only : set of str, optional
        The scenarios to run (default all).

    Returns
    -------
    int
        The exit status (0; a side that imports tilefeed from elsewhere exits with a message).
    """
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    temporary = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="same-output-work-")) if work_dir is None else work_dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    work = Work(root)
    try:
        import tilefeed as tf

        check_side(expect)
        print(f"tilefeed from {os.path.dirname(tf.__file__ or '')}", flush=True)
        began = time.perf_counter()
        stores = build_stores(work)
        _write(out / "stores.json", {"stores": stores, "elapsed": time.perf_counter() - began})
        for scenario in SCENARIOS:
            if only is not None and scenario.name not in only:
                continue
            began = time.perf_counter()
            result = run_scenario(tf, scenario, work)
            elapsed = time.perf_counter() - began
            _write(out / f"{scenario.name}.json",
                   {"scenario": scenario.name, "result": result, "elapsed": elapsed})
            state = "error: " + result["error"]["type"].rsplit(".", 1)[-1] if "error" in result else "ok"
            if result.get("resume_matches") is False:  # the same on both sides is still "same"
                state += " (its resumed batches are not those of the uninterrupted epoch)"
            print(f"{scenario.name}: {state} {elapsed:.1f} s", flush=True)
        check_side(expect)  # everything the scenarios loaded, too
    finally:
        os.chdir(out)
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    return EXIT_SAME


def _write(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` as JSON at ``path``, whole or not at all."""
    text = json.dumps(document, indent=1, sort_keys=True, default=repr)
    partial = path.with_suffix(".tmp")
    partial.write_text(text)
    partial.rename(path)  # a dump file is whole or absent: a child killed midway leaves none half-written


# -- the parent: two sides and their comparison -------------------------------------------------

def _git(*args: str) -> str:
    """``git args`` in the working tree's repository: its output, or RuntimeError with its message."""
    done = subprocess.run(["git", *args], cwd=TREE, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


@dataclass
class Side:
    """One side of the comparison: a label, the tree whose ``src`` is imported, its folders."""

    label: str
    tree: Path
    root: Path  # this side's own folder under the run's temporary folder
    returncode: int | None = None

    @property
    def dumps(self) -> Path:
        """The side's dump folder."""
        return self.root / "dump"


def run_side(side: Side, only: set[str] | None, timeout: float) -> None:
    """Run this file's ``--dump`` for ``side`` in a child process, its progress shown as it goes.

    Parameters
    ----------
    side : Side
        The side; its ``returncode`` is set (None when the child was killed for ``timeout``).
    only : set of str, optional
        The scenarios to run.
    timeout : float
        Seconds before the child (and its process group) is killed.
    """
    work, cache = side.root / "work", side.root / "cache"
    work.mkdir(parents=True)
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEFEED_")}  # no setting of the caller's
    env.update(PYTHONPATH=str(side.tree / "src"), TILEFEED_CACHE=str(cache), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-P", str(TOOL), "--dump", str(side.dumps), "--work", str(work),
               "--expect-tree", str(side.tree)]
    if only is not None:
        command += ["--only", ",".join(sorted(only))]
    child = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    killed = threading.Event()

    def kill() -> None:
        """Kill the child's process group (the child and its workers only)."""
        killed.set()
        try:
            os.killpg(child.pid, signal.SIGKILL)  # the child's own group: it and its workers only
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert child.stdout is not None
        for line in child.stdout:
            print(f"  [{side.label}] {line.rstrip()}", flush=True)
        child.wait()
    except BaseException:
        kill()
        child.wait()
        raise
    finally:
        timer.cancel()
    side.returncode = None if killed.is_set() else child.returncode
    if killed.is_set():
        print(f"  [{side.label}] killed after {timeout:.0f} s", flush=True)


def _load(path: Path) -> dict[str, Any] | None:
    """A dump file's document, or None where it is missing or unreadable."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    """The paths at which two JSON values differ (``VOLATILE`` keys ignored).

    Parameters
    ----------
    a, b : Any
        Parsed JSON.
    where : str
        The path so far.

    Yields
    ------
    str
        Each differing path, e.g. ``epochs[1][2].images.sha256``.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key in VOLATILE:
                continue
            path = f"{where}.{key}" if where else key
            if key not in a or key not in b:
                yield f"{path} ({'only in ' + ('second' if key not in a else 'first')})"
            else:
                yield from differences(a[key], b[key], path)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from differences(x, y, f"{where}[{i}]")
    elif a != b:
        yield where or "(value)"


def _summary(paths: list[str], a: dict[str, Any], b: dict[str, Any]) -> str:
    """One line naming what differs: the error on each side when an error is involved, else the
    first paths."""
    ea, eb = a.get("error"), b.get("error")
    if ea != eb:
        def said(e: Any) -> str:
            """One side's error in a few words."""
            if e is None:
                return "no error"
            return f"{e['type'].rsplit('.', 1)[-1]} at {e['stage']}: {e['message']}"
        return f"error: {said(ea)[:200]} | {said(eb)[:200]}"
    groups: dict[str, int] = {}
    for path in paths:  # epochs[0][3].images.sha256 and its like counted as epochs[][].images.sha256
        shape = re.sub(r"\[\d+\]", "[]", path)
        groups[shape] = groups.get(shape, 0) + 1
    shown = ", ".join(f"{shape} x{n}" if n > 1 else shape for shape, n in list(groups.items())[:4])
    more = f", +{len(groups) - 4} more kinds" if len(groups) > 4 else ""
    return f"{shown}{more} (first: {paths[0]})"


def compare(first: Side, second: Side, only: set[str] | None) -> bool:
    """Print one line per store and per scenario, ``same`` or ``DIFFERS: <what>``.

    Parameters
    ----------
    first, second : Side
        The two sides, dumped.
    only : set of str, optional
        The scenarios that were run.

    Returns
    -------
    bool
        Everything was the same (and present on both sides).
    """
    same = True
    width = max(len(s.name) for s in SCENARIOS) + 7

    def line(name: str, paths: list[str], a: dict[str, Any] | None, b: dict[str, Any] | None) -> None:
        """Print the verdict of one store or scenario."""
        nonlocal same
        if a is None or b is None:
            missing = " and ".join(s.label for s, d in ((first, a), (second, b)) if d is None)
            verdict = f"DIFFERS: no result from {missing}"
        elif paths:
            verdict = f"DIFFERS: {_summary(paths, a, b)}"
        else:
            verdict = "same"
        same = same and verdict == "same"
        print(f"{name:<{width}} {verdict}", flush=True)

    sa, sb = _load(first.dumps / "stores.json"), _load(second.dumps / "stores.json")
    stores_a = (sa or {}).get("stores", {})
    stores_b = (sb or {}).get("stores", {})
    for name in sorted(set(stores_a) | set(stores_b)):
        a, b = stores_a.get(name), stores_b.get(name)
        paths = list(differences(a, b)) if a is not None and b is not None else []
        line(f"store {name}", paths, a if sa else None, b if sb else None)
    if not stores_a and not stores_b:
        line("stores", [], sa, sb)
    for scenario in SCENARIOS:
        if only is not None and scenario.name not in only:
            continue
        da, db = _load(first.dumps / f"{scenario.name}.json"), _load(second.dumps / f"{scenario.name}.json")
        ra = da.get("result") if da else None
        rb = db.get("result") if db else None
        paths = list(differences(ra, rb)) if ra is not None and rb is not None else []
        line(scenario.name, paths, ra, rb)
    return same


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as SystemExit, so the worktree and the temporary folder are removed."""
    raise SystemExit(128 + signum)  # unwinds through the clean-up of the worktree


def compare_sides(base: str, only: set[str] | None, keep: Path | None, self_test: bool, timeout: float) -> int:
    """Dump the base commit and the working tree (or the base twice) and compare.

    Parameters
    ----------
    base : str
        The base commit (anything ``git rev-parse`` takes).
    only : set of str, optional
        The scenarios to run (default all).
    keep : Path, optional
        Copy both dump folders here.
    self_test : bool
        Dump the base commit twice instead of base and working tree.
    timeout : float
        Seconds each side's dump may take.

    Returns
    -------
    int
        ``EXIT_SAME``, ``EXIT_DIFFERS`` or ``EXIT_BROKEN``.
    """
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except RuntimeError:
        print(f"same_output: {base!r} is not a commit of {TREE}", file=sys.stderr)
        return EXIT_BROKEN
    signal.signal(signal.SIGTERM, _on_sigterm)
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="same-output-"))
    worktree = root / "base-tree"
    added = False
    try:
        _git("worktree", "add", "--detach", str(worktree), commit)
        added = True
        print(f"base {base} = {commit[:12]}, checked out at {worktree}", flush=True)
        if self_test:
            sides = [Side("base", worktree, root / "base"), Side("base-again", worktree, root / "base-again")]
        else:
            sides = [Side("base", worktree, root / "base"), Side("tree", TREE, root / "tree")]
        for side in sides:
            print(f"dumping {side.label} ({side.tree})", flush=True)
            run_side(side, only, timeout)
        print(f"\ncomparing {sides[0].label} with {sides[1].label}:", flush=True)
        same = compare(sides[0], sides[1], only)
        if keep is not None:
            for side in sides:
                shutil.copytree(side.dumps, keep / side.label, dirs_exist_ok=True)
            print(f"dumps kept in {keep}", flush=True)
        broken = [s.label for s in sides if s.returncode != 0]
        print(f"\n{time.perf_counter() - began:.0f} s", flush=True)
        if broken:
            print(f"same_output: the dump of {' and '.join(broken)} did not finish (see its output above)",
                  file=sys.stderr)
            return EXIT_BROKEN
        print("all the same" if same else "some outputs differ", flush=True)
        return EXIT_SAME if same else EXIT_DIFFERS
    finally:
        if added:
            try:
                _git("worktree", "remove", "--force", str(worktree))
            except RuntimeError as e:
                print(f"same_output: {e}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
        if added:
            try:
                _git("worktree", "prune")
            except RuntimeError:
                pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        The parsed options.
    """
    names = ", ".join(s.name for s in SCENARIOS)
    p = argparse.ArgumentParser(
        prog="python tools/same_output.py",
        description="Prove that the working tree makes byte-identical stores and Loader batches to a base "
                    "commit: both are dumped (small generated stores, Loader scenarios on the CPU, two "
                    "epochs and a resume each) and compared. Exit status 0: all the same; 1: something "
                    "differs; 2: the tool could not run.",
        epilog=f"scenarios: {names}",
    )
    p.add_argument("--base", default="HEAD", metavar="COMMIT", help="the commit to compare with (default HEAD)")
    p.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help="run only these scenarios (the stores are always made and compared)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="copy both dump folders (one JSON file per store set and per scenario) into DIR/<side>")
    p.add_argument("--timeout", type=float, default=CHILD_TIMEOUT, metavar="SECONDS",
                   help=f"seconds one side's dump may take (default {CHILD_TIMEOUT})")
    p.add_argument("--dump", type=Path, default=None, metavar="OUTDIR",
                   help="write one side's dump into OUTDIR with the tilefeed that imports (what the "
                        "comparison runs on each side)")
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)  # --dump's work folder
    p.add_argument("--expect-tree", type=Path, default=None, help=argparse.SUPPRESS)  # where tilefeed must lie
    p.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)  # dump the base twice
    args = p.parse_args(argv)
    if args.only is not None:
        args.only = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = sorted(args.only - {s.name for s in SCENARIOS})
        if unknown:
            p.error(f"--only: no scenario named {', '.join(unknown)} (see --help)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, or (``--dump``) one side's dump.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status.
    """
    args = parse_args(argv)
    if args.dump is not None:
        try:
            return dump(args.dump, args.work, args.expect_tree, args.only)
        except SystemExit:
            raise
        except BaseException:
            traceback.print_exc()
            return EXIT_BROKEN
    try:
        return compare_sides(args.base, args.only, args.keep, args.self_test, args.timeout)
    except KeyboardInterrupt:
        print("same_output: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
