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
from tilefeed.pipeline.recipe.open_clip_adapter import OPEN_CLIP_FLAGS, open_clip_options


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
                  channels_last=False, device="cpu", remode="pixel", recount=1, resplit=False,
                  mixup_prob=1.0, mixup_switch_prob=0.5, mixup_mode="batch", smoothing=0.1, num_classes=10,
                  no_prefetcher=False)
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
    ({"aa": "augmix-m5-w4-d2"}, {}, True, "augmix"),  # the policy parser's own one line
    ({"aa": "3a"}, {}, True, "3a"),
    ({"reprob": 0.25, "resplit": True}, {}, True, "--resplit"),
    ({"mixup": 0.8, "mixup_mode": "elem"}, {}, True, "mode='elem'"),
    ({"gaussian_blur_prob": 0.1}, {}, True, "--gaussian-blur-prob"),
    ({}, {"crop_mode": "squash"}, False, "crop_mode"),
    ({"aug_repeats": 3}, {}, True, "--aug-repeats"),
    ({"train_crop_mode": "rkrr"}, {}, True, "--train-crop-mode"),
    ({"no_aug": True}, {}, True, "--no-aug"),
    ({"train_img_sizes": [32, 48]}, {}, True, "--train-img-sizes"),
    ({}, {"input_size": (3, 32, 48)}, True, "--input-size"),
    ({"aa": "rand-m9", "train_interpolation": "lanczos"}, {}, True,
     "--train-interpolation lanczos/box/hamming"),
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
    ({"train_interpolation": "lanczos"}, True),  # no policy: the resize alone takes lanczos
    ({"aa": "rand-m9", "train_interpolation": "lanczos"}, False),
    ({"color_jitter": 0.0}, True),  # ColorJitter(0, 0, 0) changes no pixel
])
def test_a_flag_the_script_does_not_apply_is_not_refused(changes: dict[str, Any], train: bool) -> None:
    timm_options(timm_args(**changes), timm_config(), train=train)


def test_timm_recipe_flags_become_the_recipe_as_timm_applies_them() -> None:
    from tilefeed.pipeline.recipe.batch_mix import MixStyle
    from tilefeed.pipeline.recipe.erasing import Fill
    from tilefeed.pipeline.recipe.policy_tables import Family, Policy

    recipe = timm_options(timm_args(aa="rand-m9-mstd0.5-inc1", color_jitter=0.4, reprob=0.25, mixup=0.8,
                                    cutmix=1.0, train_interpolation="random", hflip=0.3, vflip=0.1,
                                    grayscale_prob=0.2), timm_config(), train=True)["recipe"]
    assert recipe.interpolation == "random"
    assert (recipe.hflip, recipe.vflip, recipe.grayscale) == (0.3, 0.1, 0.2)
    assert recipe.color_jitter is None  # timm turns the jitter off under a RandAugment policy
    policy = recipe.auto_augment
    assert (policy.policy, policy.family, policy.magnitude, policy.mstd) == (Policy.RAND, Family.TIMM, 9, 0.5)
    assert policy.increasing and policy.fill == (124, 116, 104)  # timm's img_mean from the config's mean
    assert policy.interpolation == "random"  # no interpolation hparam: timm's bilinear-or-bicubic per op
    fixed = timm_options(timm_args(aa="rand-m9", train_interpolation="bilinear"), timm_config(), train=True)
    assert fixed["recipe"].auto_augment.interpolation == "bilinear"  # the hparam timm passes the policy
    # DeiT's --train-interpolation bicubic --aa rand-m9-mstd0.5-inc1: timm's
    # aa_params['interpolation'] = str_to_pil_interp('bicubic'), the resize bicubic too
    deit = timm_options(timm_args(aa="rand-m9-mstd0.5-inc1", train_interpolation="bicubic"), timm_config(),
                        train=True)["recipe"]
    assert deit.interpolation == "bicubic" and deit.auto_augment.interpolation == "bicubic"
    # no --train-interpolation: the model's data_config interpolation, the policy's too
    assert timm_options(timm_args(aa="rand-m9", train_interpolation=None), timm_config(interpolation="bicubic"),
                        train=True)["recipe"].auto_augment.interpolation == "bicubic"
    assert recipe.erasing.p == 0.25 and recipe.erasing.value is Fill.RANDOM  # --remode pixel
    batch_mix = recipe.batch_mix
    assert (batch_mix.mixup_alpha, batch_mix.cutmix_alpha, batch_mix.label_smoothing,
            batch_mix.num_classes) == (0.8, 1.0, 0.1, 10)
    assert batch_mix.style is MixStyle.TIMM
    jitter = timm_options(timm_args(color_jitter=0.4, color_jitter_prob=0.8), timm_config(),
                          train=True)["recipe"].color_jitter
    assert jitter.brightness == (0.6, 1.4) and jitter.hue is None and jitter.p == 0.8
    # without the prefetcher the script mixes with its own Mixup: the Loader must not mix again
    unfetched = timm_options(timm_args(mixup=0.8, no_prefetcher=True), timm_config(), train=True)
    assert unfetched["recipe"].batch_mix is None
    evaluation = timm_options(timm_args(), timm_config(interpolation="bicubic"), train=False)
    assert evaluation["recipe"].interpolation == "bicubic"


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


def test_torchvision_recipe_flags_become_the_recipe_as_presets_apply_them() -> None:
    from tilefeed.pipeline.recipe.batch_mix import MixStyle
    from tilefeed.pipeline.recipe.policy_tables import Policy

    recipe = torchvision_options(tv_args(auto_augment="ta_wide", random_erase=0.1, mixup_alpha=0.2,
                                         cutmix_alpha=1.0), train=True, num_classes=7)["recipe"]
    assert recipe.auto_augment.policy is Policy.TRIVIAL_WIDE
    assert recipe.auto_augment.interpolation == "bilinear"  # presets pass --interpolation to the policy
    assert recipe.erasing.p == 0.1 and recipe.erasing.value == 0.0
    assert recipe.batch_mix.style is MixStyle.TORCHVISION and recipe.batch_mix.num_classes == 7
    assert recipe.batch_mix.label_smoothing == 0.0  # torchvision smooths in the loss
    ra = torchvision_options(tv_args(auto_augment="ra", ra_magnitude=5), train=True)["recipe"].auto_augment
    assert ra.policy is Policy.RAND and ra.magnitude == 5
    # presets.py: TrivialAugmentWide(interpolation=InterpolationMode.BICUBIC) under --interpolation bicubic
    bicubic = torchvision_options(tv_args(auto_augment="ta_wide", interpolation="bicubic"),
                                  train=True)["recipe"]
    assert bicubic.interpolation == "bicubic" and bicubic.auto_augment.interpolation == "bicubic"
    assert bicubic.auto_augment.policy is Policy.TRIVIAL_WIDE
    evaluation = torchvision_options(tv_args(interpolation="bicubic"), train=False)
    assert evaluation["recipe"].interpolation == "bicubic"
    with pytest.raises(ConfigError, match="num_classes"):
        torchvision_options(tv_args(mixup_alpha=0.2), train=True)


@pytest.mark.parametrize("changes, train, named", [
    ({"auto_augment": "augmix"}, True, "--auto-augment"),
    ({"auto_augment": "ta_wide", "interpolation": "lanczos"}, True, "--interpolation"),
    ({"ra_sampler": True, "distributed": True}, True, "--ra-sampler"),
    ({"weights": "ResNet18_Weights.DEFAULT", "test_only": True}, False, "--weights"),
])
def test_a_refused_torchvision_flag_is_named_in_one_line(changes: dict[str, Any], train: bool,
                                                         named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        torchvision_options(tv_args(**changes), train=train)
    assert named in str(caught.value) and "\n" not in str(caught.value)
    if train:  # the evaluation loader applies no training augmentation
        torchvision_options(tv_args(**changes), train=False)


FILTERS = "bilinear, bicubic, lanczos, nearest, random"  # Interpolation's values, as choice lists them
ONE_FILTER = "bilinear, bicubic, lanczos, nearest"  # torchvision's: random is timm's


@pytest.mark.parametrize("options, said", [
    (lambda: timm_options(timm_args(train_interpolation="box"), timm_config(), train=True),
     f"timm train.py --train-interpolation must be one of {FILTERS}, got 'box'"),
    (lambda: timm_options(timm_args(), timm_config(interpolation="hamming"), train=False),
     f"timm train.py --interpolation must be one of {FILTERS}, got 'hamming'"),
    (lambda: torchvision_options(tv_args(interpolation="box"), train=True),
     f"torchvision train.py --interpolation must be one of {ONE_FILTER}, got 'box'"),
    (lambda: torchvision_options(tv_args(interpolation="nearest-exact"), train=False),
     f"torchvision train.py --interpolation must be one of {ONE_FILTER}, got 'nearest-exact'"),
    # with no --train-interpolation the training filter is the evaluation's, and the message names its flag
    (lambda: timm_options(timm_args(train_interpolation=None), timm_config(interpolation="box"), train=True),
     f"timm train.py --interpolation must be one of {FILTERS}, got 'box'"),
    # presets.py hands the policy --interpolation: its geometric ops take PolicyInterpolation's values
    (lambda: torchvision_options(tv_args(auto_augment="ta_wide", interpolation="lanczos"), train=True),
     "torchvision train.py --interpolation with --auto-augment must be one of nearest, bilinear, bicubic, "
     "got 'lanczos'"),
])
def test_a_filter_the_loader_lacks_is_refused_naming_the_flag_and_the_values(options: Any, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        options()
    assert str(caught.value) == said


@pytest.mark.parametrize("train", [True, False])
def test_torchvision_refuses_timms_random_filter_in_one_line(train: bool) -> None:
    """``random`` is an ``Interpolation`` (timm's per-sample draw), not one of torchvision's modes."""
    with pytest.raises(ConfigError) as caught:
        torchvision_options(tv_args(interpolation="random"), train=train)
    said = f"torchvision train.py --interpolation must be one of {ONE_FILTER}, got 'random'"
    assert str(caught.value) == said


def test_every_row_says_honoured_or_refused_and_refused_rows_can_fire() -> None:
    for flags in (TIMM_FLAGS, TORCHVISION_FLAGS):
        for flag, verdict, meaning in table(flags):
            assert flag and meaning and verdict in (Verdict.HONOURED, Verdict.REFUSED)
        for row in flags.values():
            assert (row.active is not None) == (row.verdict is Verdict.REFUSED), row.flag


def test_the_integrations_page_shows_the_committed_swaps_and_tables() -> None:
    """docs/integrations.md's and docs/detection.md's swaps and flag tables are what
    tools/integration_docs.py makes of the patches and TIMM_FLAGS / TORCHVISION_FLAGS /
    TORCHVISION_DETECTION_FLAGS; a changed row shows up as a difference."""
    import importlib.util

    root = Path(__file__).parents[3]
    spec = importlib.util.spec_from_file_location("integration_docs", root / "tools" / "integration_docs.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    page = (root / "docs" / "integrations.md").read_text()
    assert tool.rendered(page) == page, "run python tools/integration_docs.py"
    assert page.count("<!-- /generated -->") == 6
    stale = page.replace("| `--aa` | honoured", "| `--aa` | refused")
    assert tool.rendered(stale) != stale  # the negative control: an edited row is rewritten
    detection = (root / "docs" / "detection.md").read_text()
    assert tool.rendered(detection) == detection, "run python tools/integration_docs.py"
    assert detection.count("<!-- /generated -->") == 2
    row = "| `--data-augmentation ssdlite` | "
    stale = detection.replace(row + "honoured", row + "refused")
    assert stale != detection and tool.rendered(stale) != stale


def open_clip_args(**changes: Any) -> argparse.Namespace:
    """open_clip_train 3.3.0's defaults for the flags its data reads (params.py, written out), after
    main's setup (device, distributed)."""
    values: dict[str, Any] = dict(
                  train_data="stores/train", train_data_upsampling_factors=None, val_data="stores/val",
                  train_num_samples=None, val_num_samples=None, dataset_type="tilefeed",
                  dataset_resampled=False, csv_separator="\t", csv_img_key="filepath", csv_caption_key="title",
                  batch_size=64, workers=4, seed=0, aug_cfg={}, device="cpu", distributed=False, horovod=False,
                  precision="amp", imagenet_val=None, imagenet_v2=None)
    values.update(changes)
    return argparse.Namespace(**values)


OPEN_CLIP_CONFIG = {"size": (224, 224), "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
                    "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic",
                    "resize_mode": "shortest", "fill_color": 0}


def oc_options(config: dict[str, Any] | None = None, train: bool = True, **changes: Any) -> dict[str, Any]:
    """open_clip_options for the defaults with ``changes``, the model's config changed by ``config``."""
    return open_clip_options(open_clip_args(**changes), {**OPEN_CLIP_CONFIG, **(config or {})}, train=train,
                             tokenizer=None)


def test_open_clip_options_follow_its_train_and_eval_transforms() -> None:
    from tilefeed.pipeline.recipe.recipe import Interpolation

    train = open_clip_options(open_clip_args(), OPEN_CLIP_CONFIG, train=True, tokenizer=None)
    assert train["store"] == "stores/train" and "mix" not in train
    assert train["text"] == "caption" and train["tokenizer"] is None
    assert train["size"] == 224 and train["mean"] == OPEN_CLIP_CONFIG["mean"] and train["batch_size"] == 64
    assert train["scale"] == (0.9, 1.0) and train["ratio"] == (3 / 4, 4 / 3)  # image_transform's crop
    recipe = train["recipe"]
    assert recipe.hflip == 0.0 and recipe.interpolation is Interpolation.BICUBIC and recipe.color_jitter is None
    assert train["shuffle"] and train["drop_last"] and train["train"]
    def tokens(texts: list[str]) -> torch.Tensor:
        return torch.tensor([[len(t)] for t in texts])

    val = open_clip_options(open_clip_args(), {**OPEN_CLIP_CONFIG, "interpolation": "bilinear"}, train=False,
                            tokenizer=tokens)
    assert val["store"] == "stores/val" and (val["rank"], val["world_size"]) == (0, 1)
    assert val["crop_pct"] == 1.0 and val["recipe"].interpolation is Interpolation.BILINEAR
    assert not val["shuffle"] and not val["drop_last"] and val["tokenizer"] is tokens
    for given, filtered in (("random", Interpolation.BICUBIC), (None, Interpolation.BICUBIC)):
        chosen = open_clip_options(open_clip_args(), {**OPEN_CLIP_CONFIG, "interpolation": given}, train=False,
                                   tokenizer=None)
        assert chosen["recipe"].interpolation is filtered  # open_clip's random evaluates bicubic
    with pytest.raises(ConfigError) as caught:  # open_clip's transform asserts these three alone
        open_clip_options(open_clip_args(), {**OPEN_CLIP_CONFIG, "interpolation": "lanczos"}, train=False,
                          tokenizer=None)
    assert str(caught.value) == ("open_clip_train --image-interpolation must be one of bicubic, bilinear, "
                                 "random, got 'lanczos'")
    jitter = oc_options(aug_cfg={"scale": (0.5, 1.0), "color_jitter": (0.4, 0.4, 0.4, 0.1),
                                 "color_jitter_prob": 0.8, "gray_scale_prob": 0.2})
    assert jitter["scale"] == (0.5, 1.0) and jitter["recipe"].grayscale == 0.2
    assert jitter["recipe"].color_jitter.p == 0.8 and jitter["recipe"].color_jitter.hue == (-0.1, 0.1)


def test_open_clip_mixing_flags_make_a_mix(tmp_path: Path) -> None:
    """``a::b`` with upsampling factors is a Mix weighted by size times factor (the sizes read from
    the stores' metadata), --dataset-resampled its replacement, --train-num-samples its epoch."""
    from tests.helpers import make_pairs_store
    from tilefeed.pipeline import Mix

    a, b = make_pairs_store(tmp_path / "a", 8), make_pairs_store(tmp_path / "b", 4)
    args = open_clip_args(train_data=f"{a}::{b}", train_data_upsampling_factors="1::3", dataset_resampled=True,
                          train_num_samples=10)
    options = open_clip_options(args, OPEN_CLIP_CONFIG, train=True, tokenizer=None)
    assert "store" not in options
    store = Mix(**options["mix"])
    assert store.replacement and store.epoch_samples == 10
    assert store.weights is not None and dict(store.weights) == {"0:pairs-lz4": 8.0, "1:pairs-lz4": 12.0}
    assert list(store.stores.values()) == [str(a), str(b)]
    plain = Mix(**oc_options(train_data=f"{a}::{b}")["mix"])
    assert plain.weights is None and not plain.replacement  # each store's size: every sample once
    assert Mix(**oc_options(train_data=str(a), train_num_samples=6)["mix"]).epoch_samples == 6
    options = open_clip_options(args, {**OPEN_CLIP_CONFIG, "size": 32}, train=True, tokenizer=None)
    with Loader(Mix(**options.pop("mix")), **{**options, "batch_size": 5, "num_workers": 1}) as loader:
        images, texts = next(iter(loader))
        assert images.shape == (5, 3, 32, 32) and len(texts) == 5 and all(isinstance(t, str) for t in texts)
    with pytest.raises(ConfigError, match="2 factors for 1"):
        oc_options(train_data=str(a), train_data_upsampling_factors="1::2")


def test_later_open_clip_caption_flags_pick_the_captions() -> None:
    """open_clip's main branch: ``--json-text-key 'a;b'`` is an order of fallbacks, its
    ``--json-text-key-probs`` (nargs floats) weights padded with 0 for the keys it leaves out."""
    picked = oc_options(json_text_key="caption;synthetic", json_text_key_probs=[0.7, 0.3])
    assert picked["text"] == {"caption": 0.7, "synthetic": 0.3}
    assert oc_options(json_text_key="caption;synthetic", json_text_key_probs=[1.0])["text"] == {
        "caption": 1.0, "synthetic": 0.0}
    assert oc_options(json_text_key="caption; synthetic")["text"] == ["caption", "synthetic"]
    assert oc_options(train=False, json_text_key="synthetic")["text"] == "synthetic"
    with pytest.raises(ConfigError, match="3 values for 2 keys"):
        oc_options(json_text_key="caption;synthetic", json_text_key_probs=[0.5, 0.3, 0.2])


@pytest.mark.parametrize("changes, config, train, named", [
    ({"aug_cfg": {"use_timm": True}}, {}, True, "use_timm"),
    ({"val_data": "a::b"}, {}, False, "--val-data a::b"),
    ({"val_num_samples": 100}, {}, False, "--val-num-samples"),
    ({}, {"size": (224, 192)}, True, "--force-image-size H W"),
    ({"horovod": True}, {}, True, "--horovod"),
])
def test_a_refused_open_clip_flag_is_named_in_one_line(changes: dict[str, Any], config: dict[str, Any],
                                                       train: bool, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        oc_options(config, train, **changes)
    assert named in str(caught.value) and "\n" not in str(caught.value)
    if changes and not train:  # an evaluation-only refusal leaves the training loader alone
        oc_options(config, True, **changes)


def test_every_open_clip_row_says_honoured_or_refused_and_refused_rows_can_fire() -> None:
    for flag, verdict, meaning in table(OPEN_CLIP_FLAGS):
        assert flag and meaning and verdict in (Verdict.HONOURED, Verdict.REFUSED)
    for row in OPEN_CLIP_FLAGS.values():
        assert (row.active is not None) == (row.verdict is Verdict.REFUSED), row.flag
