"""The recipe adapters: timm's and torchvision's flags, as each script applies them, become Loader
options or a one-line refusal naming the flag; the options build a working Loader."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from tilefeed.pipeline import ConfigError, Loader
from tilefeed.pipeline.recipe.adapters import (
    TIMM_FLAGS, TORCHVISION_FLAGS, Verdict, table, timm_options, torchvision_options,
)


def timm_args(**changes: Any) -> argparse.Namespace:
    """timm train.py's defaults for the flags its loaders read (its parser, written out: the
    script is not importable), with bilinear resizes and no colour jitter."""
    values = dict(batch_size=128, validation_batch_size=None, workers=4, pin_mem=False, seed=42,
                  no_aug=False, train_crop_mode=None, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3], hflip=0.5,
                  vflip=0.0, color_jitter=0.0, color_jitter_prob=None, grayscale_prob=None,
                  gaussian_blur_prob=None, aa=None, aug_repeats=0, aug_splits=0, reprob=0.0, mixup=0.0,
                  cutmix=0.0, cutmix_minmax=None, train_interpolation="bilinear", train_img_sizes=None,
                  train_batches_per_epoch=None, naflex_loader=False, epoch_repeats=0.0,
                  train_num_samples=None, val_num_samples=None, input_img_mode=None, model_dtype=None,
                  channels_last=False, device="cpu")
    values.update(changes)
    return argparse.Namespace(**values)


def timm_config(**changes: Any) -> dict[str, Any]:
    from timm.data import resolve_data_config

    config = resolve_data_config({"input_size": (3, 32, 32), "interpolation": "bilinear"},
                                 pretrained_cfg={"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
                                                 "crop_pct": 0.9, "crop_mode": "center"})
    config.update(changes)
    return config


def test_timm_options_map_the_data_config_and_flags() -> None:
    train = timm_options(timm_args(), timm_config(), train=True)
    assert train["mean"] == (0.485, 0.456, 0.406) and train["size"] == 32 and train["shuffle"]
    assert train["scale"] == (0.08, 1.0) and train["batch_size"] == 128 and train["drop_last"]
    val = timm_options(timm_args(validation_batch_size=64), timm_config(), train=False)
    assert val["crop_pct"] == 0.9 and val["batch_size"] == 64 and not val["shuffle"] and not val["train"]


def test_timm_options_build_a_loader_that_normalises_as_timm(store: Path) -> None:
    with Loader(store, **{**timm_options(timm_args(workers=1), timm_config(), train=False),
                          "batch_size": 4}) as loader:
        images, _ = next(iter(loader))
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
        assert loader.settings.mean == pytest.approx((0.485 * 255, 0.456 * 255, 0.406 * 255))


@pytest.mark.parametrize("changes, config, train, named", [
    ({"aa": "rand-m9-mstd0.5"}, {}, True, "--aa"),
    ({"color_jitter": 0.4}, {}, True, "--color-jitter"),
    ({"color_jitter": 0.4, "aa": "3a"}, {}, True, "--color-jitter"),  # '3a' keeps the jitter
    ({"reprob": 0.25}, {}, True, "--reprob"),
    ({"mixup": 0.8}, {}, True, "--mixup"),
    ({"vflip": 0.5}, {}, True, "--vflip"),
    ({"hflip": 0.0}, {}, True, "--hflip"),
    ({"train_interpolation": "random"}, {}, True, "--train-interpolation"),
    ({}, {"interpolation": "bicubic"}, False, "--interpolation"),
    ({}, {"crop_mode": "squash"}, False, "crop_mode"),
    ({"aug_repeats": 3}, {}, True, "--aug-repeats"),
    ({"train_crop_mode": "rkrr"}, {}, True, "--train-crop-mode"),
    ({"no_aug": True}, {}, True, "--no-aug"),
    ({"train_img_sizes": [32, 48]}, {}, True, "--train-img-sizes"),
    ({}, {"input_size": (3, 32, 48)}, True, "--input-size"),
])
def test_a_refused_timm_flag_is_named_in_one_line(changes: dict[str, Any], config: dict[str, Any],
                                                  train: bool, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        timm_options(timm_args(**changes), timm_config(**config), train=train)
    message = str(caught.value)
    assert named in message and "\n" not in message


@pytest.mark.parametrize("changes, train", [
    ({"color_jitter": 0.4, "aa": None, "no_aug": False}, False),  # evaluation applies no jitter
    ({"aa": "rand-m9-mstd0.5"}, False),
    ({"train_interpolation": "random"}, False),
    ({"color_jitter": 0.0}, True),  # ColorJitter(0, 0, 0) changes no pixel
])
def test_a_flag_the_script_does_not_apply_is_not_refused(changes: dict[str, Any], train: bool) -> None:
    timm_options(timm_args(**changes), timm_config(), train=train)


def test_colour_jitter_under_a_randaugment_policy_is_named_for_the_policy_only() -> None:
    """timm turns the jitter off under every --aa policy but '3a': only --aa is named."""
    with pytest.raises(ConfigError) as caught:
        timm_options(timm_args(aa="rand-m9-mstd0.5", color_jitter=0.4), timm_config(), train=True)
    assert "--aa" in str(caught.value) and "--color-jitter" not in str(caught.value)


def tv_args(**changes: Any) -> argparse.Namespace:
    """torchvision's reference train.py defaults for the flags its loaders read."""
    values = dict(batch_size=32, workers=16, train_crop_size=224, val_crop_size=224, val_resize_size=256,
                  interpolation="bilinear", auto_augment=None, ra_magnitude=9, augmix_severity=3,
                  random_erase=0.0, mixup_alpha=0.0, cutmix_alpha=0.0, ra_sampler=False, ra_reps=3,
                  weights=None, test_only=False, device="cpu", backend="pil", use_v2=False,
                  cache_dataset=False, distributed=False)
    values.update(changes)
    return argparse.Namespace(**values)


def test_torchvision_options_give_crop_pct_from_the_val_sizes() -> None:
    val = torchvision_options(tv_args(val_resize_size=232, val_crop_size=224), train=False)
    assert val["size"] == 224 and val["crop_pct"] == pytest.approx(224 / 232)
    train = torchvision_options(tv_args(train_crop_size=176), train=True)
    assert train["size"] == 176 and train["train"] and train["mean"] == (0.485, 0.456, 0.406)
    assert train["scale"] == (0.08, 1.0) and train["ratio"] == (3 / 4, 4 / 3)  # RandomResizedCrop's
    assert train["shuffle"] and not train["drop_last"] and not val["shuffle"]


def test_ra_sampler_is_refused_only_where_the_script_uses_it() -> None:
    """train.py builds its RASampler only under a distributed launch; alone it is ignored."""
    torchvision_options(tv_args(ra_sampler=True), train=True)
    with pytest.raises(ConfigError, match="--ra-sampler"):
        torchvision_options(tv_args(ra_sampler=True, distributed=True), train=True)


@pytest.mark.parametrize("changes, train, named", [
    ({"auto_augment": "ta_wide"}, True, "--auto-augment"),
    ({"random_erase": 0.1}, True, "--random-erase"),
    ({"mixup_alpha": 0.2}, True, "--mixup-alpha"),
    ({"ra_sampler": True, "distributed": True}, True, "--ra-sampler"),
    ({"interpolation": "bicubic"}, False, "--interpolation"),
    ({"weights": "ResNet18_Weights.DEFAULT", "test_only": True}, False, "--weights"),
])
def test_a_refused_torchvision_flag_is_named_in_one_line(changes: dict[str, Any], train: bool,
                                                         named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        torchvision_options(tv_args(**changes), train=train)
    assert named in str(caught.value) and "\n" not in str(caught.value)
    if train:  # the evaluation loader applies no training augmentation
        torchvision_options(tv_args(**changes), train=False)


def test_every_row_says_honoured_or_refused_and_refused_rows_can_fire() -> None:
    for flags in (TIMM_FLAGS, TORCHVISION_FLAGS):
        for flag, verdict, meaning in table(flags):
            assert flag and meaning and verdict in (Verdict.HONOURED, Verdict.REFUSED)
        for row in flags.values():
            assert (row.active is not None) == (row.verdict is Verdict.REFUSED), row.flag
