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

open_clip's trainer has its table in ``open_clip_adapter``, by the same rules.
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
from tilefeed.store.choices import choice
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


# torchvision's modes are one filter each: timm's ``random`` (a draw per sample, or per policy
# op slot) is not among them
ONE_FILTER = tuple(m for m in Interpolation if m is not Interpolation.RANDOM)
ONE_POLICY_FILTER = tuple(m for m in PolicyInterpolation if m is not PolicyInterpolation.RANDOM)


def _timm_train_flag(args: Any, data_config: Mapping[str, Any]) -> tuple[str, str]:
    """The training interpolation timm's ``train.py`` passes to ``create_loader``, and the flag it
    comes from: ``--train-interpolation``, else (with ``--no-aug``, or none given) the
    evaluation's, ``--interpolation`` or the model's default."""
    chosen = getattr(args, "train_interpolation", "random")
    if getattr(args, "no_aug", False) or not chosen:
        return str(data_config["interpolation"]), "--interpolation"
    return str(chosen), "--train-interpolation"


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
    return _timm_train_flag(args, data_config)[0] not in set(PolicyInterpolation)


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
                  "mixup and cutmix with timm's soft targets: Recipe.batch_mix under the prefetcher (the "
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
        chosen = _timm_filter(str(data_config["interpolation"]), "--interpolation")
        options["recipe"] = None if chosen is Interpolation.BILINEAR else Recipe(interpolation=chosen)
    return options


def _timm_filter(value: str, flag: str) -> Interpolation:
    """timm's filter ``value`` as the Loader's ``Interpolation``, refused naming the script's ``flag``."""
    return choice(Interpolation, value, f"timm train.py {flag}")


def _timm_recipe(args: Any, data_config: Mapping[str, Any]) -> Recipe:
    """The training recipe ``create_loader(is_training=True)`` builds from timm's flags."""
    interpolation, flag = _timm_train_flag(args, data_config)
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
    batch_mix = None
    mixing = float(args.mixup) > 0 or float(args.cutmix) > 0 or args.cutmix_minmax is not None
    if mixing and not getattr(args, "no_prefetcher", False):  # else the script's own Mixup mixes
        batch_mix = BatchMix.from_timm(
            mixup_alpha=float(args.mixup), cutmix_alpha=float(args.cutmix), cutmix_minmax=args.cutmix_minmax,
            prob=float(args.mixup_prob), switch_prob=float(args.mixup_switch_prob), mode=args.mixup_mode,
            label_smoothing=float(args.smoothing), num_classes=int(args.num_classes))
    return Recipe(interpolation=_timm_filter(interpolation, flag),
                  hflip=float(getattr(args, "hflip", 0.5)), vflip=float(getattr(args, "vflip", 0.0)),
                  grayscale=float(getattr(args, "grayscale_prob", 0.0) or 0.0),
                  color_jitter=jitter, auto_augment=policy, erasing=erasing, batch_mix=batch_mix)


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
                        "CutMix: Recipe.batch_mix (soft targets; --label-smoothing stays in the loss)"),
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
    # random is timm's draw per sample: torchvision's InterpolationMode has no such mode
    interpolation = choice(Interpolation, str(getattr(args, "interpolation", "bilinear")),
                           "torchvision train.py --interpolation", among=ONE_FILTER)
    if train:
        options["size"] = int(args.train_crop_size)
        options["scale"], options["ratio"] = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults
        options["recipe"] = _torchvision_recipe(args, interpolation, num_classes)
    else:
        options["recipe"] = (None if interpolation is Interpolation.BILINEAR
                             else Recipe(interpolation=interpolation))
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
        filtered = choice(PolicyInterpolation, interpolation.value,
                          "torchvision train.py --interpolation with --auto-augment", among=ONE_POLICY_FILTER)
        policy = replace(policy, interpolation=filtered)
        if chosen == "ra":
            policy = replace(policy, magnitude=int(getattr(args, "ra_magnitude", 9)))
    erase = float(getattr(args, "random_erase", 0.0))
    mixup, cutmix = float(getattr(args, "mixup_alpha", 0.0)), float(getattr(args, "cutmix_alpha", 0.0))
    batch_mix = None
    if mixup > 0 or cutmix > 0:
        if num_classes is None:
            raise ConfigError("torchvision train.py --mixup-alpha/--cutmix-alpha: give torchvision_options "
                              "num_classes= (the script's num_classes) for the soft targets")
        batch_mix = BatchMix.from_torchvision(num_classes, mixup_alpha=mixup, cutmix_alpha=cutmix)
    return Recipe(interpolation=interpolation, auto_augment=policy,
                  erasing=RandomErasing(p=erase) if erase > 0 else None, batch_mix=batch_mix)


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


def table(flags: Mapping[str, Flag]) -> list[tuple[str, str, str]]:
    """(flag, verdict, meaning) rows of a script's table, for the docs."""
    return [(row.flag, row.verdict.value, row.meaning) for row in flags.values()]
