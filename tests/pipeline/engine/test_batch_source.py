"""The batch source: which of the operations' inputs the graph is fed on each path, and the
DCT scale a JPEG tile is decoded at."""

from __future__ import annotations

from dataclasses import replace

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.batch_source import HOST_USED, decode_scale, graph_names
from tilefeed.pipeline.engine.operations import inputs as sent
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import PolicyInterpolation
from tilefeed.pipeline.recipe.recipe import ColorJitter, PhotometricDistort, Recipe


def test_the_host_path_leaves_the_graph_the_horizontal_flip_alone() -> None:
    recipe = Recipe("random", hflip=0.3, vflip=0.5, grayscale=0.2,
                    color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8), auto_augment="ta_wide",
                    photometric=PhotometricDistort())
    augment = Augment(train=True, tile=32, normalize=False, half=False, channels_first=False, windows=True,
                      recipe=recipe)
    assert graph_names(sent(augment), True) == ("flip",)
    assert set(sent(augment)) - set(HOST_USED) == {"flip"}
    assert "aa_op" in graph_names(sent(augment), False)  # a GPU graph applies them


def test_a_random_filter_reaches_the_host_kernels_only() -> None:
    """``aa_filter`` is sent with a random-interpolation policy's inputs, stays with the host
    kernels on the host-resize path, and is not declared by a device graph (which warps every
    slot bilinear); a fixed filter sends none."""
    policy = AutoAugment.parse("rand-m9-mstd0.5")
    augment = Augment(train=True, tile=32, normalize=False, half=False, channels_first=False, windows=True,
                      recipe=Recipe(auto_augment=policy))
    assert "aa_filter" in sent(augment) and "aa_filter" in HOST_USED
    assert graph_names(sent(augment), True) == ("flip",)
    device = graph_names(sent(augment), False)
    assert "aa_op" in device and "aa_filter" not in device
    bilinear = replace(policy, interpolation=PolicyInterpolation.BILINEAR)
    fixed = replace(augment, recipe=Recipe(auto_augment=bilinear))
    assert "aa_filter" not in sent(fixed)


def test_decode_scale_is_the_smallest_that_still_covers_the_output() -> None:
    assert decode_scale(128, 128, 16, 128, 128) == 8
    assert decode_scale(128, 96, 16, 128, 128) == 4  # the narrower side decides
    assert decode_scale(64, 64, 32, 128, 128) == 2
    assert decode_scale(63, 64, 32, 128, 128) == 1
    assert decode_scale(100, 100, 13, 100, 100) == 8  # 100 / 8 rounds up to 13 decoded pixels
    assert decode_scale(100, 100, 14, 100, 100) == 4
