"""Loader keyword arguments from what a training script holds: timm's ``train.py`` (its argparse
namespace and ``resolve_data_config``'s output) and torchvision's references
``references/classification/train.py`` and ``references/detection/train.py`` (their argparse
namespaces, as their ``presets.py`` apply them).

Every flag of a script that reaches its data loading is a row of that script's table
(``TIMM_FLAGS``, ``TORCHVISION_FLAGS``, ``TORCHVISION_DETECTION_FLAGS``): ``HONOURED`` (mapped
onto a Loader option or the training ``Recipe``, or of no effect on a Loader, said so) or
``REFUSED`` (not applied). A refused flag stops the script in one ``ConfigError`` naming it, and
only where the script would apply it (a colour jitter that timm turns off under an ``--aa``
policy is not named); nothing is silently dropped. Flipping a row to ``HONOURED`` is the change
that goes with the Loader learning that option: the row's ``active`` test is what the script
itself looks at, and the mapping lives in ``timm_options``/``torchvision_options``/
``torchvision_detection_options``.

open_clip's trainer (``open_clip_train``) has its table too, ``OPEN_CLIP_FLAGS``, read against the
model's preprocess config; ``open_clip_options`` returns the store with the options, or the
keywords of a ``Mix`` where ``--train-data`` joins stores with ``::`` or resamples them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

import torch

from tilefeed.pipeline.recipe.batch_mix import BatchMix
from tilefeed.pipeline.recipe.erasing import RandomErasing
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import PolicyInterpolation
from tilefeed.pipeline.recipe.recipe import ColorJitter, Crop, Interpolation, PhotometricDistort, Recipe
from tilefeed.store.errors import ConfigError


class Verdict(StrEnum):
    """What the Loader does with a recipe flag."""

    HONOURED = "honoured"
    REFUSED = "refused"


Active = Callable[[Any, Mapping[str, Any], bool], bool]  # (args, data_config, train) -> applies?


@dataclass(frozen=True)
class Flag:
    """One row of a script's table.

    Parameters
    ----------
    flag : str
        The flag as the script's command line spells it.
    verdict : Verdict
        Honoured or refused.
    meaning : str
        What the script does with it, and what the Loader does (for the docs' table).
    active : callable, optional
        ``(args, data_config, train) -> bool``: whether the script applies it with these values;
        a refused row is named only when it is active. Default: never (an honoured row).
    """

    flag: str
    verdict: Verdict
    meaning: str
    active: Active | None = None

    def applies(self, args: Any, data_config: Mapping[str, Any], train: bool) -> bool:
        """Whether the script applies this flag with ``args`` (``train``: its training loader)."""
        return self.active is not None and bool(self.active(args, data_config, train))


H, R = Verdict.HONOURED, Verdict.REFUSED


def _timm_train_interpolation(args: Any, data_config: Mapping[str, Any]) -> str:
    """The training interpolation timm's ``train.py`` passes to ``create_loader``."""
    chosen = getattr(args, "train_interpolation", "random")
    return str(data_config["interpolation"] if getattr(args, "no_aug", False) or not chosen else chosen)


def _timm_colour_jitter(args: Any, data_config: Mapping[str, Any], train: bool) -> bool:
    """timm applies ColorJitter when it is set and no ``--aa`` policy turns it off (every policy
    but one naming '3a'); a jitter of all zeros changes no pixel."""
    jitter, policy = getattr(args, "color_jitter", None), getattr(args, "aa", None)
    if not train or getattr(args, "no_aug", False) or jitter is None:
        return False
    if policy and "3a" not in policy:
        return False
    values = jitter if isinstance(jitter, (list, tuple)) else [jitter]
    if getattr(args, "color_jitter_prob", None) is not None and args.color_jitter_prob <= 0:
        return False
    return any(float(v) != 0 for v in values)


def _timm_policy_filter_refused(args: Any, data_config: Mapping[str, Any], train: bool) -> bool:
    """timm hands an ``--aa`` policy the training filter; PIL's affine transform, which its
    geometric ops call, takes no other than nearest, bilinear and bicubic (timm fails there)."""
    if not train or getattr(args, "no_aug", False) or not getattr(args, "aa", None):
        return False
    return _timm_train_interpolation(args, data_config) not in set(PolicyInterpolation)


def _train_aug(test: Callable[[Any], bool]) -> Active:
    """Active on the training loader when timm augments (not ``--no-aug``) and ``test`` holds."""
    return lambda args, config, train: train and not getattr(args, "no_aug", False) and test(args)


# timm train.py: every flag that reaches create_loader (directly, through resolve_data_config, or
# through the dataset and collate the script builds around it)
TIMM_FLAGS: dict[str, Flag] = {
    "batch_size": Flag("-b/--batch-size", H, "training batch size per rank: batch_size"),
    "validation_batch_size": Flag("-vb/--validation-batch-size", H,
                                  "evaluation batch size per rank (default -b): batch_size"),
    "workers": Flag("-j/--workers", H, "loader workers: num_workers (DALI's threads)"),
    "pin_mem": Flag("--pin-mem", H, "pin_memory (batches land on the device anyway)"),
    "seed": Flag("--seed", H, "seed: the order and every crop and flip"),
    "input_size": Flag("--input-size/--img-size/--in-chans", H,
                       "data_config['input_size']: size (square, 3 channels; else refused)"),
    "input_shape": Flag("--input-size (not square, or not 3 channels)", R,
                        "the Loader outputs square 3-channel images",
                        lambda a, c, t: c["input_size"][0] != 3 or c["input_size"][1] != c["input_size"][2]),
    "mean": Flag("--mean/--std", H, "data_config['mean'/'std'] in 0..1 units: mean, std"),
    "crop_pct": Flag("--crop-pct", H, "data_config['crop_pct']: crop_pct of evaluation"),
    "crop_mode": Flag("crop_mode (model config)", R, "evaluation crop other than 'center'",
                      lambda a, c, t: not t and c.get("crop_mode") not in (None, "center")),
    "interpolation": Flag("--interpolation", H, "data_config['interpolation']: the evaluation resize's filter"),
    "train_interpolation": Flag("--train-interpolation", H,
                                "the training resize's filter, 'random' as timm's (bilinear or bicubic per "
                                "sample): Recipe.interpolation; with --aa also the policy's geometric ops' "
                                "filter (nearest, bilinear or bicubic; 'random' leaves timm's random filter "
                                "per op), bicubic ops warp bilinear on a GPU"),
    "train_interpolation_aa": Flag("--train-interpolation lanczos/box/hamming with --aa", R,
                                   "policy geometric ops filtered other than nearest, bilinear or bicubic",
                                   _timm_policy_filter_refused),
    "scale": Flag("--scale", H, "random-resized-crop area range: scale"),
    "ratio": Flag("--ratio", H, "random-resized-crop aspect range: ratio"),
    "hflip": Flag("--hflip", H, "horizontal flip probability: Recipe.hflip"),
    "vflip": Flag("--vflip", H, "vertical flip probability: Recipe.vflip"),
    "train_crop_mode": Flag("--train-crop-mode", R, "crop modes other than rrc (rkrc, rkrr)",
                            _train_aug(lambda a: getattr(a, "train_crop_mode", None) not in (None, "rrc"))),
    "no_aug": Flag("--no-aug", R, "training without augmentation (resize and centre crop)",
                   lambda a, c, t: t and bool(getattr(a, "no_aug", False))),
    "color_jitter": Flag("--color-jitter/--color-jitter-prob", H,
                         "colour jitter, off under --aa policies as timm turns it off: Recipe.color_jitter"),
    "grayscale_prob": Flag("--grayscale-prob", H, "random grayscale: Recipe.grayscale"),
    "gaussian_blur_prob": Flag("--gaussian-blur-prob", R, "random gaussian blur",
                               _train_aug(lambda a: bool(getattr(a, "gaussian_blur_prob", None)))),
    "aa": Flag("--aa", H, "RandAugment and AutoAugment strings (timm's img_mean fill): Recipe.auto_augment; "
               "AugMix and '3a' refused in one line by the parser"),
    "reprob": Flag("--reprob/--remode/--recount", H, "random erasing as timm's: Recipe.erasing"),
    "resplit": Flag("--resplit", R, "erasing spared on the first augmentation split",
                    _train_aug(lambda a: float(getattr(a, "reprob", 0.0)) > 0
                               and bool(getattr(a, "resplit", False)))),
    "aug_splits": Flag("--aug-splits", R, "augmentation splits (AugMix's JSD)",
                       lambda a, c, t: t and int(getattr(a, "aug_splits", 0)) > 0),
    "aug_repeats": Flag("--aug-repeats", R, "repeated-augmentation sampler",
                        lambda a, c, t: t and float(getattr(a, "aug_repeats", 0)) > 0),
    "mixup": Flag("--mixup/--cutmix/--cutmix-minmax/--mixup-*/--smoothing", H,
                  "mixup and cutmix with timm's soft targets: Recipe.mix under the prefetcher (the "
                  "default; --mixup-off-epoch sets loader.mixup_enabled), the script's own Mixup "
                  "with --no-prefetcher"),
    "train_img_sizes": Flag("--train-img-sizes/--train-batch-sizes/--train-size-*", R,
                            "scheduled resolutions and batch sizes",
                            lambda a, c, t: t and getattr(a, "train_img_sizes", None) is not None),
    "train_batches_per_epoch": Flag("--train-batches-per-epoch", R, "a fixed number of batches an epoch",
                                    lambda a, c, t: t and a.train_batches_per_epoch is not None),
    "naflex_loader": Flag("--naflex-loader", R, "NaFlex patch loader",
                          lambda a, c, t: bool(getattr(a, "naflex_loader", False))),
    "epoch_repeats": Flag("--epoch-repeats", R, "epochs repeated within one",
                          lambda a, c, t: t and float(getattr(a, "epoch_repeats", 0.0)) > 0),
    "num_samples": Flag("--train-num-samples/--val-num-samples", R, "a sample count of an iterable dataset",
                        lambda a, c, t: getattr(a, "train_num_samples" if t else "val_num_samples", None)
                        is not None),
    "input_img_mode": Flag("--input-img-mode", R, "image modes other than RGB",
                           lambda a, c, t: getattr(a, "input_img_mode", None) not in (None, "RGB")),
    "model_dtype": Flag("--model-dtype", H, "the images' dtype (img_dtype): dtype"),
    "channels_last": Flag("--channels-last", H, "layout='channels_last' (no transpose)"),
    "device": Flag("--device", H, "the device batches land on: device"),
    "no_prefetcher": Flag("--no-prefetcher", H, "either way: batches are on the device, normalised"),
    "use_multi_epochs_loader": Flag("--use-multi-epochs-loader", H, "no effect: threads persist"),
    "worker_seeding": Flag("--worker-seeding", H, "no effect: no worker processes, draws come from the seed"),
    "distributed": Flag("(distributed launch)", H, "rank and world_size from torch.distributed"),
}

_DTYPES = {None: torch.float32, "float32": torch.float32, "float16": torch.float16,
           "bfloat16": torch.bfloat16}


def refuse(script: str, table: Mapping[str, Flag], args: Any, data_config: Mapping[str, Any],
           train: bool) -> None:
    """One ``ConfigError`` naming every refused flag of ``table`` the script would apply."""
    named = [f"{row.flag} ({row.meaning})" for row in table.values()
             if row.verdict is Verdict.REFUSED and row.applies(args, data_config, train)]
    if named:
        raise ConfigError(f"{script} flags the tilefeed Loader does not apply: {'; '.join(named)}")


def timm_options(args: Any, data_config: Mapping[str, Any], *, train: bool) -> dict[str, Any]:
    """Loader keyword arguments (all but the store) for timm's ``train.py``.

    Parameters
    ----------
    args : argparse.Namespace
        The script's parsed arguments (after its own setup: ``args.device``, ``args.distributed``).
    data_config : mapping
        ``timm.data.resolve_data_config``'s output for the model (input size, interpolation, mean
        and std in 0..1 units, crop_pct, crop_mode).
    train : bool
        The training loader (``create_loader(is_training=True)``) or the evaluation one.

    Returns
    -------
    dict
        ``Loader(store, **options)``'s options.

    Raises
    ------
    ConfigError
        Naming, in one line, each refused flag (``TIMM_FLAGS``) the script would apply.
    """
    refuse("timm train.py", TIMM_FLAGS, args, data_config, train)
    model_dtype = getattr(args, "model_dtype", None)
    if model_dtype not in _DTYPES:
        raise ConfigError(f"timm train.py --model-dtype {model_dtype}: the Loader outputs "
                          "float32, float16 or bfloat16 images")
    batch = args.batch_size if train else (getattr(args, "validation_batch_size", None) or args.batch_size)
    options: dict[str, Any] = {
        "batch_size": int(batch), "shuffle": train, "drop_last": train, "train": train,
        "seed": int(getattr(args, "seed", 0)), "size": int(data_config["input_size"][-1]),
        "mean": tuple(data_config["mean"]), "std": tuple(data_config["std"]),
        "num_workers": max(1, int(args.workers)), "pin_memory": bool(getattr(args, "pin_mem", False)),
        "dtype": _DTYPES[model_dtype], "device": getattr(args, "device", None),
        "layout": "channels_last" if getattr(args, "channels_last", False) else "NCHW",
    }
    if train:
        options["scale"] = tuple(getattr(args, "scale", None) or (0.08, 1.0))
        options["ratio"] = tuple(getattr(args, "ratio", None) or (3 / 4, 4 / 3))
        options["recipe"] = _timm_recipe(args, data_config)
    else:
        options["crop_pct"] = float(data_config["crop_pct"])
        chosen = _timm_filter(str(data_config["interpolation"]))
        options["recipe"] = None if chosen is Interpolation.BILINEAR else Recipe(interpolation=chosen)
    return options


def _timm_filter(name: str) -> Interpolation:
    if name not in set(Interpolation):
        raise ConfigError(f"timm train.py interpolation {name!r}: the Loader resizes with "
                          f"{', '.join(i.value for i in Interpolation)}")
    return Interpolation(name)


def _timm_recipe(args: Any, data_config: Mapping[str, Any]) -> Recipe:
    """The training recipe ``create_loader(is_training=True)`` builds from timm's flags."""
    interpolation = _timm_train_interpolation(args, data_config)
    jitter = None
    if _timm_colour_jitter(args, data_config, True):
        values = args.color_jitter if isinstance(args.color_jitter, (list, tuple)) else [args.color_jitter] * 3
        if len(values) not in (3, 4):
            raise ConfigError(f"timm train.py --color-jitter takes 1, 3 or 4 values, got {len(values)}")
        prob = getattr(args, "color_jitter_prob", None)
        brightness, contrast, saturation, *hue = (float(v) for v in values)
        jitter = ColorJitter(brightness, contrast, saturation, hue[0] if hue else None,
                             p=1.0 if prob is None else float(prob))
    policy = None
    if getattr(args, "aa", None):
        size = int(data_config["input_size"][-1])
        hparams: dict[str, Any] = {"translate_const": int(size * 0.45),
                                   "img_mean": tuple(min(255, round(255 * x)) for x in data_config["mean"])}
        if interpolation != "random":  # else timm's default: bilinear or bicubic per op (Interpolation.RANDOM)
            hparams["interpolation"] = interpolation
        policy = AutoAugment.parse(str(args.aa), hparams)
    erasing = None
    if float(getattr(args, "reprob", 0.0)) > 0:
        erasing = RandomErasing.from_timm(probability=float(args.reprob), mode=getattr(args, "remode", "pixel"),
                                          max_count=int(getattr(args, "recount", 1)))
    mix = None
    mixing = float(args.mixup) > 0 or float(args.cutmix) > 0 or args.cutmix_minmax is not None
    if mixing and not getattr(args, "no_prefetcher", False):  # else the script's own Mixup mixes
        mix = BatchMix.from_timm(
            mixup_alpha=float(args.mixup), cutmix_alpha=float(args.cutmix), cutmix_minmax=args.cutmix_minmax,
            prob=float(args.mixup_prob), switch_prob=float(args.mixup_switch_prob), mode=args.mixup_mode,
            label_smoothing=float(args.smoothing), num_classes=int(args.num_classes))
    return Recipe(interpolation=_timm_filter(interpolation), hflip=float(getattr(args, "hflip", 0.5)),
                  vflip=float(getattr(args, "vflip", 0.0)),
                  grayscale=float(getattr(args, "grayscale_prob", 0.0) or 0.0),
                  color_jitter=jitter, auto_augment=policy, erasing=erasing, mix=mix)


def _tv(test: Callable[[Any], bool], train_only: bool = True) -> Active:
    """Active when ``test`` holds, on the training loader only unless ``train_only`` is False."""
    return lambda args, config, train: (train or not train_only) and test(args)


# torchvision references/classification/train.py (the one that runs with torchvision 0.29): every
# flag that reaches its datasets' presets (presets.ClassificationPresetTrain/Eval: RandomResizedCrop
# with torchvision's default scale and ratio, flip 0.5, ImageNet mean/std; Resize(shorter side) then
# CenterCrop), its samplers, its collate function and its two DataLoaders
TORCHVISION_FLAGS: dict[str, Flag] = {
    "batch_size": Flag("-b/--batch-size", H, "batch size per rank (training and evaluation): batch_size"),
    "workers": Flag("-j/--workers", H, "loader workers: num_workers (DALI's threads)"),
    "train_crop_size": Flag("--train-crop-size", H,
                            "RandomResizedCrop's size (scale 0.08-1, ratio 3/4-4/3): size of training"),
    "val_crop_size": Flag("--val-crop-size", H, "CenterCrop's size: size of evaluation"),
    "val_resize_size": Flag("--val-resize-size", H,
                            "Resize of the shorter side before the centre crop: crop_pct = crop / resize"),
    "interpolation": Flag("--interpolation", H, "the filter of every resize, training and evaluation (and of "
                          "the policy's geometric ops): Recipe.interpolation"),
    "auto_augment": Flag("--auto-augment/--ra-magnitude", H,
                         "ta_wide, ra (its magnitude) and imagenet: Recipe.auto_augment"),
    "augmix": Flag("--auto-augment augmix/cifar10/svhn", R,
                   "AugMix, and AutoAugment's CIFAR-10 and SVHN tables",
                   _tv(lambda a: getattr(a, "auto_augment", None) in ("augmix", "cifar10", "svhn"))),
    "random_erase": Flag("--random-erase", H, "RandomErasing(p) after normalisation: Recipe.erasing"),
    "mixup_alpha": Flag("--mixup-alpha/--cutmix-alpha", H, "the collate function's RandomChoice of MixUp and "
                        "CutMix: Recipe.mix (soft targets; --label-smoothing stays in the loss)"),
    "ra_sampler": Flag("--ra-sampler/--ra-reps", R,
                       "repeated-augmentation sampler (the script uses it only when distributed)",
                       _tv(lambda a: bool(getattr(a, "ra_sampler", False))
                           and bool(getattr(a, "distributed", False)))),
    "weights": Flag("--weights (with --test-only)", R, "evaluation preprocessing from the weights' transforms",
                    lambda a, c, t: not t and bool(getattr(a, "weights", None))
                    and bool(getattr(a, "test_only", False))),
    "device": Flag("--device", H, "the device batches land on: device"),
    "backend": Flag("--backend", H, "no effect: the Loader decodes and resizes the tiles itself "
                    "(PIL or tensor alike)"),
    "use_v2": Flag("--use-v2", H, "no effect: the same transforms either way (v2's MixUp/CutMix: "
                   "see --mixup-alpha)"),
    "cache_dataset": Flag("--cache-dataset", H, "no effect on the Loader (caches the script's own datasets)"),
    "distributed": Flag("(distributed launch)", H,
                        "rank and world_size from torch.distributed (DistributedSampler's split)"),
}


def torchvision_options(args: Any, *, train: bool, num_classes: int | None = None) -> dict[str, Any]:
    """Loader keyword arguments (all but the store) for torchvision's classification reference.

    Parameters
    ----------
    args : argparse.Namespace
        ``references/classification/train.py``'s parsed arguments.
    train : bool
        ``data_loader`` (``ClassificationPresetTrain``, a random sampler) or ``data_loader_test``
        (``ClassificationPresetEval``, sequential).
    num_classes : int, optional
        The classes of the training set (the script's ``len(dataset.classes)``): needed when
        ``--mixup-alpha`` or ``--cutmix-alpha`` mixes batches into soft targets.

    Returns
    -------
    dict
        ``Loader(store, **options)``'s options: mean and std are the presets' ImageNet values in
        0..1 units, scale and ratio ``RandomResizedCrop``'s defaults, the horizontal flip the
        presets' 0.5, pin_memory as the script's DataLoaders; the training order reshuffles each
        epoch and keeps its tail (``RandomSampler``, ``DistributedSampler``), evaluation is in
        store order (``SequentialSampler``).

    Raises
    ------
    ConfigError
        Naming, in one line, each refused flag (``TORCHVISION_FLAGS``) the script would apply.
    """
    refuse("torchvision train.py", TORCHVISION_FLAGS, args, {}, train)
    options: dict[str, Any] = {
        "batch_size": int(args.batch_size), "shuffle": train, "drop_last": False, "train": train,
        "num_workers": max(1, int(args.workers)), "pin_memory": True, "device": getattr(args, "device", None),
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),  # the presets' defaults
    }
    interpolation = str(getattr(args, "interpolation", "bilinear"))
    if interpolation not in set(Interpolation) or interpolation == Interpolation.RANDOM:
        raise ConfigError(f"torchvision train.py --interpolation {interpolation}: the Loader resizes with "
                          "nearest, bilinear, bicubic or lanczos")
    if train:
        options["size"] = int(args.train_crop_size)
        options["scale"], options["ratio"] = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults
        options["recipe"] = _torchvision_recipe(args, Interpolation(interpolation), num_classes)
    else:
        filtered = Interpolation(interpolation)
        options["recipe"] = None if filtered is Interpolation.BILINEAR else Recipe(interpolation=filtered)
        crop, resize = int(args.val_crop_size), int(args.val_resize_size)
        if not 0 < crop <= resize:
            raise ConfigError(f"torchvision train.py --val-crop-size {crop} with --val-resize-size {resize}: "
                              "the Loader centre-crops inside the resized picture (crop <= resize)")
        options["size"], options["crop_pct"] = crop, crop / resize
    return options


def _torchvision_recipe(args: Any, interpolation: Interpolation, num_classes: int | None) -> Recipe:
    """``ClassificationPresetTrain``'s recipe and ``train.py``'s collate, from its flags."""
    policy = None
    chosen = getattr(args, "auto_augment", None)
    if chosen:
        policy = AutoAugment.parse(str(chosen))
        # presets.py hands the policy the script's --interpolation (the class default is nearest)
        if interpolation.value not in set(PolicyInterpolation):
            raise ConfigError(f"torchvision train.py --interpolation {interpolation.value} with --auto-augment"
                              ": the policy's geometric ops resize nearest, bilinear or bicubic here")
        policy = replace(policy, interpolation=PolicyInterpolation(interpolation.value))
        if chosen == "ra":
            policy = replace(policy, magnitude=int(getattr(args, "ra_magnitude", 9)))
    erase = float(getattr(args, "random_erase", 0.0))
    mixup, cutmix = float(getattr(args, "mixup_alpha", 0.0)), float(getattr(args, "cutmix_alpha", 0.0))
    mix = None
    if mixup > 0 or cutmix > 0:
        if num_classes is None:
            raise ConfigError("torchvision train.py --mixup-alpha/--cutmix-alpha: give torchvision_options "
                              "num_classes= (the script's num_classes) for the soft targets")
        mix = BatchMix.from_torchvision(num_classes, mixup_alpha=mixup, cutmix_alpha=cutmix)
    return Recipe(interpolation=interpolation, auto_augment=policy,
                  erasing=RandomErasing(p=erase) if erase > 0 else None, mix=mix)


# torchvision references/detection/train.py: every flag that reaches its datasets (get_coco and
# presets.DetectionPresetTrain/Eval: the pictures at their own size, 0..1 floats, no normalisation,
# which the model's own transform does), its batch samplers, its collate functions and its two
# DataLoaders
DETECTION_AUGMENTATIONS: Final = ("hflip", "lsj", "multiscale", "ssd", "ssdlite")
LSJ_SIDE: Final = 1024  # the lsj preset's ScaleJitter target_size and FixedSizeCrop size
LSJ_FILL: Final = (123, 117, 104)  # the presets' mean: FixedSizeCrop's fill, RandomZoomOut's in ssd


def _augmentation(args: Any) -> str:
    return str(getattr(args, "data_augmentation", "hflip"))


TORCHVISION_DETECTION_FLAGS: dict[str, Flag] = {
    "data_path": Flag("--data-path", H, "the folder of the script's COCO layout: the stores `store-train` and "
                      "`store-val` beside `annotations/instances_{train,val}2017.json`"),
    "dataset": Flag("--dataset coco", H, "boxes and category ids (COCO's 91 classes), with each object's "
                    "instance mask for a model whose name holds `mask`"),
    "coco_kp": Flag("--dataset coco_kp", R, "person keypoints (a store holds no keypoints)",
                    lambda a, c, t: getattr(a, "dataset", "coco") == "coco_kp"),
    "batch_size": Flag("-b/--batch-size", H, "training batch size per rank (full batches, as the script's "
                       "batch samplers make them): batch_size; evaluation takes one picture a batch, as the "
                       "script does"),
    "workers": Flag("-j/--workers", H, "loader workers: num_workers (DALI's threads)"),
    "aspect_ratio_group_factor": Flag("--aspect-ratio-group-factor", H, "no effect: every tile has one "
                                      "shape, so every batch is one aspect group"),
    "hflip": Flag("--data-augmentation hflip", H, "the whole tile, mirrored with probability 0.5: "
                  "Recipe(crop=\"none\") (with a `--fit stretch` store, the picture as the script's models "
                  "see it; with `--fit pad`, its letterbox)"),
    "ssdlite": Flag("--data-augmentation ssdlite", H, "RandomIoUCrop with its defaults, then the flip: "
                    "Recipe(crop=\"iou\"), drawn against each picture's stored boxes"),
    "lsj": Flag("--data-augmentation lsj", H, "large-scale jitter at 1024: ScaleJitter((1024, 1024)) then "
                "the reference's FixedSizeCrop(1024, fill=mean), then the flip: Recipe(crop=\"lsj\", "
                "fill=(123, 117, 104)) with size=1024 (masks padded with 0)"),
    "ssd": Flag("--data-augmentation ssd", H, "RandomPhotometricDistort, RandomZoomOut(fill=mean), "
                "RandomIoUCrop, then the flip: Recipe(photometric=PhotometricDistort(), crop=\"zoom_iou\", "
                "fill=(123, 117, 104)), drawn against each picture's stored boxes"),
    "augmentation": Flag("--data-augmentation multiscale", R,
                         "shortest-side resizes to several sizes (the Loader's output is one square)",
                         lambda a, c, t: t and _augmentation(a) not in ("hflip", "ssdlite", "lsj", "ssd")),
    "use_copypaste": Flag("--use-copypaste", R, "SimpleCopyPaste in the training collate function",
                          lambda a, c, t: t and bool(getattr(a, "use_copypaste", False))),
    "use_v2": Flag("--use-v2", H, "crowd objects stay in the training targets (iscrowd 1), as the Loader hands "
                   "them over; without it the script drops them: refused where a training picture has one"),
    "backend": Flag("--backend", H, "no effect: the Loader decodes the tiles itself (PIL, tensor or tv_tensor "
                    "alike)"),
    "weights": Flag("--weights (with --test-only)", H, "the weights' evaluation transforms: 0..1 floats of the "
                    "whole picture, as the script's own preset"),
    "device": Flag("--device", H, "the device batches land on: device"),
    "distributed": Flag("(distributed launch)", H, "rank and world_size from torch.distributed (the "
                        "DistributedSamplers' split)"),
}


def torchvision_detection_options(args: Any, *, train: bool) -> dict[str, Any]:
    """Loader keyword arguments (all but the store and its subset) for torchvision's detection
    reference, ``references/detection/train.py``.

    Parameters
    ----------
    args : argparse.Namespace
        The script's parsed arguments.
    train : bool
        ``data_loader`` (``DetectionPresetTrain``, a random order in full batches) or
        ``data_loader_test`` (``DetectionPresetEval``, one picture a batch, in order).

    Returns
    -------
    dict
        ``Loader(store, **options)``'s options: the tiles at their own side (the model's
        transform resizes them, as it resizes the script's full-size pictures), 0..1 floats
        (``ToDtype(torch.float, scale=True)``: mean 0, std 1, no normalisation), boxes with
        their category ids as targets (and instance masks for a model whose name holds
        ``mask``); training frames each whole tile (``hflip``), SSD's IoU crop of its picture
        (``ssdlite``), SSD's photometric distortion, zoom-out (on the preset's mean) and IoU
        crop (``ssd``) or large-scale jitter's 1024 square of it (``lsj``, padded with the
        preset's mean) and mirrors it with probability 0.5; evaluation frames the whole tile.

    Raises
    ------
    ConfigError
        Naming, in one line, each refused flag (``TORCHVISION_DETECTION_FLAGS``) the script would
        apply.
    """
    refuse("torchvision detection train.py", TORCHVISION_DETECTION_FLAGS, args, {}, train)
    augmentation = _augmentation(args)
    if augmentation not in DETECTION_AUGMENTATIONS:  # the script's preset refuses it too, before this
        raise ConfigError(f"torchvision detection train.py --data-augmentation {augmentation}: one of "
                          f"{', '.join(DETECTION_AUGMENTATIONS)}")
    targets = ("boxes", "masks") if "mask" in str(getattr(args, "model", "")) else ("boxes",)
    options: dict[str, Any] = {
        "batch_size": int(args.batch_size) if train else 1, "shuffle": train, "drop_last": train,
        "train": train, "num_workers": max(1, int(args.workers)), "device": getattr(args, "device", None),
        "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0), "targets": targets,
    }
    if train:  # the preset's crop (none, SSD's IoU crop, large-scale jitter), then RandomHorizontalFlip(0.5)
        crop = {"ssdlite": Crop.IOU, "lsj": Crop.LSJ, "ssd": Crop.ZOOM_IOU}.get(augmentation, Crop.NONE)
        options["recipe"] = Recipe(crop=crop, fill=LSJ_FILL if crop.pads else (0, 0, 0),
                                   photometric=PhotometricDistort() if augmentation == "ssd" else None)
        if crop is Crop.LSJ:  # ScaleJitter's target_size and FixedSizeCrop's size: the output side
            options["size"] = LSJ_SIDE
    return options


# open_clip's trainer (open_clip_train 3.3.0, the one the open_clip_torch wheel ships): every flag
# that reaches get_data (the datasets, their samplers and DataLoaders) and the model's preprocess
# config that shapes its transforms (open_clip.transform.image_transform: RandomResizedCrop at the
# model's size, aug_cfg's scale (default 0.9-1), torchvision's ratio, always bicubic, no flip, then
# normalisation; evaluation resizes with the config's filter and centre-crops). data_config is the
# model's preprocess_cfg (``model.visual.preprocess_cfg``: size, mean, std, interpolation, resize_mode)
OPEN_CLIP_SCALE: Final = (0.9, 1.0)  # open_clip's AugmentationCfg.scale


def _aug(args: Any) -> Mapping[str, Any]:
    return dict(getattr(args, "aug_cfg", None) or {})


def _side(config: Mapping[str, Any]) -> tuple[int, int]:
    size = config.get("size", 224)
    return (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[-2]), int(size[-1]))


def _sources(value: str | None) -> list[str]:
    return [part for part in (value or "").split("::") if part]


OPEN_CLIP_FLAGS: dict[str, Flag] = {
    "dataset_type": Flag("--dataset-type tilefeed", H, "the choice the swap adds: --train-data and --val-data "
                         "name tilefeed stores (`tilefeed preprocess` of the shards, parquet files or table)"),
    "train_data": Flag("--train-data", H, "one store, or several joined by `::`: a Mix of them, named by "
                       "their folders"),
    "upsampling": Flag("--train-data-upsampling-factors", H, "Mix weights: each store's size times its "
                       "factor, as open_clip weighs its shards (open_clip asks --dataset-resampled with it; "
                       "the weights hold either way)"),
    "dataset_resampled": Flag("--dataset-resampled", H, "Mix(replacement=True): each position's sample drawn "
                              "with replacement, the same draws after a resume and on any world size"),
    "train_num_samples": Flag("--train-num-samples", H, "Mix epoch_samples: the samples of an epoch over all "
                              "ranks (a store repeats or is sub-sampled to fill it)"),
    "val_data": Flag("--val-data", H, "one store, read in order, whole, on the evaluating rank (rank 0 of 1, "
                     "as the script evaluates on its master alone), no batch dropped"),
    "val_sources": Flag("--val-data a::b", R, "several evaluation stores",
                        lambda a, c, t: not t and len(_sources(getattr(a, "val_data", None))) > 1),
    "val_num_samples": Flag("--val-num-samples", R, "a sample count of the evaluation set (the Loader "
                            "evaluates the whole store)",
                            lambda a, c, t: not t and getattr(a, "val_num_samples", None) is not None),
    "csv_keys": Flag("--csv-img-key/--csv-caption-key/--csv-separator", H, "no effect at training: `tilefeed "
                     "preprocess --csv-img-key/--csv-caption-key/--csv-separator` read the table with them "
                     "when the store was made; the caption column is the store's `caption`"),
    "json_text_key": Flag("--json-text-key/--json-text-key-probs", H, "(later open_clip; absent in 3.3.0) "
                          "caption names split on `;`, each sample's first not empty: text=[names]; with "
                          "probs, each sample's names in a weighted random order (a missing or 0 weight a "
                          "fallback after the drawn ones): text={name: prob}; without it the store's "
                          "`caption`"),
    "image_key": Flag("--image-key/--text-key/--max-image-pixels", H, "(later open_clip; absent in 3.3.0) "
                      "no effect at training: `tilefeed preprocess --image-key`, `--caption-key` and "
                      "`--max-pixels` apply them when the store is made"),
    "batch_size": Flag("--batch-size", H, "batch size per rank, training and evaluation: batch_size "
                       "(training drops the incomplete tail, as the script's DataLoader)"),
    "workers": Flag("--workers", H, "loader workers: num_workers (DALI's threads)"),
    "seed": Flag("--seed", H, "seed: the order, every crop and caption pick"),
    "size": Flag("--force-image-size (the model's image size)", H, "preprocess_cfg size: size (square)"),
    "shape": Flag("--force-image-size H W (not square)", R, "the Loader outputs square images",
                  lambda a, c, t: _side(c)[0] != _side(c)[1]),
    "mean": Flag("--image-mean/--image-std (the model's)", H,
                 "preprocess_cfg mean/std in 0..1 units: mean, std"),
    "interpolation": Flag("--image-interpolation (the model's)", H, "preprocess_cfg interpolation: the "
                          "evaluation resize's filter (random is bicubic there, as open_clip's); training "
                          "resizes bicubic whatever it says, as open_clip's RandomResizedCrop"),
    "resize_mode": Flag("--image-resize-mode (the model's)", H, "evaluation framing of a square tile "
                        "(shortest, longest and squash resize it alike); the picture's framing is the store's: "
                        "`tilefeed preprocess --fit crop` is shortest's, `pad` longest's, `stretch` squash's"),
    "scale": Flag("--aug-cfg scale=", H, "RandomResizedCrop area range (default 0.9-1): scale; ratio "
                  "torchvision's 3/4-4/3 and no flip, as open_clip's train transform"),
    "color_jitter": Flag("--aug-cfg color_jitter= color_jitter_prob=", H, "colour jitter (4 values) applied "
                         "with that probability: Recipe.color_jitter"),
    "gray_scale_prob": Flag("--aug-cfg gray_scale_prob=", H, "random grayscale: Recipe.grayscale"),
    "aug_unused": Flag("--aug-cfg ratio= re_prob= re_count= (color_jitter= without color_jitter_prob=)", H,
                       "no effect, as open_clip's own transform leaves them unused without use_timm (it "
                       "warns)"),
    "use_timm": Flag("--aug-cfg use_timm=True", R, "timm's create_transform in place of open_clip's",
                     lambda a, c, t: t and bool(_aug(a).get("use_timm", False))),
    "tokenizer": Flag("(the model's tokenizer)", H, "tokenizer: run on the reader threads, each batch's "
                      "(B, context_length) tokens"),
    "precision": Flag("--precision", H, "no effect: float32 images, which the script casts to its input dtype"),
    "device": Flag("--device", H, "the device batches land on: device (tokens stay on the host until the "
                   "script moves them)"),
    "imagenet_val": Flag("--imagenet-val/--imagenet-v2", H, "not swapped: zero-shot evaluation reads its "
                         "own ImageFolder, unchanged"),
    "distributed": Flag("(distributed launch)", H, "training: rank and world_size from torch.distributed "
                        "(DistributedSampler's split)"),
    "horovod": Flag("--horovod", R, "Horovod's ranks (no torch.distributed group to take them from)",
                    lambda a, c, t: bool(getattr(a, "horovod", False))),
}


def open_clip_options(args: Any, preprocess_cfg: Mapping[str, Any], *, train: bool,
                      tokenizer: Callable[[list[str]], torch.Tensor] | None) -> dict[str, Any]:
    """Loader keyword arguments, the store or mixture among them, for open_clip's trainer
    ``open_clip_train``.

    Parameters
    ----------
    args : argparse.Namespace
        ``open_clip_train.params.parse_args``'s output after ``main`` set it up (``args.device``,
        ``args.distributed``).
    preprocess_cfg : mapping
        The model's preprocess config (``model.visual.preprocess_cfg`` or
        ``open_clip.get_model_preprocess_cfg(model)``: size, mean and std in 0..1 units,
        interpolation, resize_mode), with the script's ``--image-*`` overrides in it.
    train : bool
        ``data["train"]`` (``--train-data``: RandomResizedCrop, shuffled, full batches) or
        ``data["val"]`` (``--val-data``: the evaluation transform, in order).
    tokenizer : callable, optional
        The script's ``get_tokenizer(args.model)``: list of str -> (B, L) tokens, run on the
        Loader's reader threads. None hands over the captions as str.

    Returns
    -------
    dict
        ``Loader(**options)``, the captions (``text``) and the tokenizer among them, so a batch
        is open_clip's ``(images, texts)``: ``store`` (a folder) or, where ``--train-data``
        joins stores with ``::`` or sets upsampling factors, ``--dataset-resampled`` or
        ``--train-num-samples``, ``mix`` (``Mix`` keywords: ``Loader(Mix(**options.pop("mix")),
        **options)``).

    Raises
    ------
    ConfigError
        Naming, in one line, each refused flag (``OPEN_CLIP_FLAGS``) the script would apply, or
        a flag's value the Loader cannot take.
    """
    refuse("open_clip_train", OPEN_CLIP_FLAGS, args, preprocess_cfg, train)
    flag = "--train-data" if train else "--val-data"
    sources = _sources(getattr(args, "train_data" if train else "val_data", None))
    if not sources:
        raise ConfigError(f"open_clip_train {flag}: name a tilefeed store (`tilefeed preprocess SRC STORE`)")
    options: dict[str, Any] = {
        **(_open_clip_store(args, sources) if train else {"store": sources[0]}),
        "batch_size": int(args.batch_size), "shuffle": train, "drop_last": train, "train": train,
        "seed": int(getattr(args, "seed", 0)), "size": _side(preprocess_cfg)[0],
        "mean": tuple(float(v) for v in preprocess_cfg["mean"]),
        "std": tuple(float(v) for v in preprocess_cfg["std"]),
        "num_workers": max(1, int(getattr(args, "workers", 1))), "device": getattr(args, "device", None),
        "text": _open_clip_text(args), "tokenizer": tokenizer,
    }
    if train:
        options["scale"] = tuple(float(v) for v in _aug(args).get("scale", OPEN_CLIP_SCALE))
        options["ratio"] = (3 / 4, 4 / 3)  # RandomResizedCrop's default: open_clip passes none
        options["recipe"] = _open_clip_recipe(args)
    else:  # the script evaluates on its master alone, the whole set: one rank of one
        options["rank"], options["world_size"], options["crop_pct"] = 0, 1, 1.0
        chosen = str(preprocess_cfg.get("interpolation") or "bicubic")
        if chosen not in ("bicubic", "bilinear", "random"):  # open_clip asserts the same three
            raise ConfigError(f"open_clip_train interpolation {chosen!r}: bicubic, bilinear or random")
        filtered = Interpolation.BILINEAR if chosen == "bilinear" else Interpolation.BICUBIC
        options["recipe"] = Recipe(interpolation=filtered)
    return options


def _open_clip_store(args: Any, sources: list[str]) -> dict[str, Any]:
    """The training store: ``{"store": folder}``, or ``{"mix": Mix keywords}`` where open_clip
    would mix, resample or resize (the Mix is the caller's to make: mixing sits above the recipe)."""
    factors = _sources(getattr(args, "train_data_upsampling_factors", None))
    resampled = bool(getattr(args, "dataset_resampled", False))
    count = getattr(args, "train_num_samples", None)
    if len(sources) == 1 and not factors and not resampled and count is None:
        return {"store": sources[0]}
    folders = [s.rstrip("/").rsplit("/", 1)[-1] or s for s in sources]
    names = folders if len(set(folders)) == len(folders) else [f"{i}:{f}" for i, f in enumerate(folders)]
    weights = None
    if factors:
        if len(factors) != len(sources):
            raise ConfigError(f"open_clip_train --train-data-upsampling-factors: {len(factors)} factors for "
                              f"{len(sources)} --train-data sources")
        weights = {name: _store_size(source) * float(factor)
                   for name, source, factor in zip(names, sources, factors, strict=True)}
    return {"mix": {"stores": dict(zip(names, sources, strict=True)), "weights": weights,
                    "epoch_samples": None if count is None else int(count), "replacement": resampled}}


def _store_size(source: str) -> int:
    """A local store's sample count, read from its metadata alone."""
    from tilefeed.store.documents import open_store

    if "://" in source:
        raise ConfigError(f"open_clip_train --train-data-upsampling-factors with {source}: a bucket store's "
                          "size is not read here; give the Mix weights (size times factor) yourself")
    return int(open_store(source)[1].samples)


def _open_clip_text(args: Any) -> str | list[str] | dict[str, float]:
    """The caption names, as open_clip's later ``--json-text-key`` (names split on ``;``, the
    first not empty taken) and ``--json-text-key-probs`` (weights, the missing ones 0: fallbacks
    after the drawn ones) pick them; without them the store's ``caption``."""
    keys = getattr(args, "json_text_key", None)
    names = [k.strip() for k in (keys.split(";") if isinstance(keys, str) else list(keys or [])) if k.strip()]
    if not names:
        return "caption"
    probs = getattr(args, "json_text_key_probs", None)
    if probs is None:
        return names[0] if len(names) == 1 else names
    weights = [float(p) for p in (probs.split() if isinstance(probs, str) else probs)]
    if len(weights) > len(names):
        raise ConfigError(f"open_clip_train --json-text-key-probs: {len(weights)} values for {len(names)} "
                          "keys (open_clip refuses more values than keys)")
    return dict(zip(names, weights + [0.0] * (len(names) - len(weights)), strict=True))


def _open_clip_recipe(args: Any) -> Recipe:
    """open_clip's training transform after its crop: bicubic, no flip, jitter and grayscale by aug_cfg."""
    aug = _aug(args)
    jitter = None
    if aug.get("color_jitter_prob"):  # open_clip applies the jitter only with a probability
        values = aug.get("color_jitter")
        if not isinstance(values, (list, tuple)) or len(values) != 4:
            raise ConfigError("open_clip_train --aug-cfg color_jitter_prob needs color_jitter of 4 values "
                              "(open_clip asserts the same)")
        brightness, contrast, saturation, hue = (float(v) for v in values)
        jitter = ColorJitter(brightness, contrast, saturation, hue, p=float(aug["color_jitter_prob"]))
    return Recipe(interpolation=Interpolation.BICUBIC, hflip=0.0, color_jitter=jitter,
                  grayscale=float(aug.get("gray_scale_prob") or 0.0))


def table(flags: Mapping[str, Flag]) -> list[tuple[str, str, str]]:
    """(flag, verdict, meaning) rows of a script's table, for the docs."""
    return [(row.flag, row.verdict.value, row.meaning) for row in flags.values()]
