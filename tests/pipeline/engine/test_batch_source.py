"""The batch source: which of the operations' inputs the graph is fed on each path, and the
DCT scale a JPEG tile is decoded at."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.batch_source import decode_scale, graph_names
from tilefeed.pipeline.engine.operations import inputs as sent
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import PolicyInterpolation
from tilefeed.pipeline.recipe.recipe import ColorJitter, PhotometricDistort, Recipe
from tilefeed.pipeline.recipe.solarize import RandomSolarize

WINDOW = ("start", "end", "flip", "size")
PASTE = ("flip", "size", "cut_start", "cut_end", "cut_size", "paste_anchor")
PHOTOMETRIC = ("pd_order", "pd_brightness", "pd_contrast", "pd_saturation", "pd_hue", "pd_permutation")


def _augment(recipe: Recipe | None, train: bool = True, windows: bool = True) -> Augment:
    return Augment(train=train, tile=32, normalize=False, half=False, channels_first=False, windows=windows,
                   recipe=recipe)


def test_the_host_path_leaves_the_graph_the_horizontal_flip_alone() -> None:
    recipe = Recipe("random", hflip=0.3, vflip=0.5, grayscale=0.2,
                    color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8), auto_augment="ta_wide",
                    photometric=PhotometricDistort())
    augment = Augment(train=True, tile=32, normalize=False, half=False, channels_first=False, windows=True,
                      recipe=recipe)
    assert graph_names(sent(augment), True) == ("flip",)
    assert [name for name, spec in sent(augment).items() if not spec.host_applied] == ["flip"]
    assert "aa_op" in graph_names(sent(augment), False)  # a GPU graph applies them


def test_a_random_filter_reaches_the_host_kernels_only() -> None:
    """``aa_filter`` is sent with a random-interpolation policy's inputs, stays with the host
    kernels on the host-resize path, and is not declared by a device graph (which warps every
    slot bilinear); a fixed filter sends none."""
    policy = AutoAugment.parse("rand-m9-mstd0.5")
    augment = Augment(train=True, tile=32, normalize=False, half=False, channels_first=False, windows=True,
                      recipe=Recipe(auto_augment=policy))
    assert sent(augment)["aa_filter"].host_only and sent(augment)["aa_filter"].host_applied
    assert graph_names(sent(augment), True) == ("flip",)
    device = graph_names(sent(augment), False)
    assert "aa_op" in device and "aa_filter" not in device
    bilinear = replace(policy, interpolation=PolicyInterpolation.BILINEAR)
    fixed = replace(augment, recipe=Recipe(auto_augment=bilinear))
    assert "aa_filter" not in sent(fixed)


@pytest.mark.parametrize(("recipe", "train", "windows", "host", "graph"), [
    (None, True, True, ("flip",), WINDOW),
    (Recipe(), True, True, ("flip",), (*WINDOW, "interp")),
    (Recipe("random", hflip=0.3, vflip=0.5, grayscale=0.2,
            color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8)),
     True, True, ("flip",),
     (*WINDOW, "interp", "vflip", "grayscale", "jitter", "order", "brightness", "contrast", "saturation",
      "hue")),
    (Recipe(photometric=PhotometricDistort()), True, True, ("flip",), (*WINDOW, "interp", *PHOTOMETRIC)),
    (Recipe(auto_augment="ta_wide"), True, True, ("flip",),
     (*WINDOW, "interp", "aa_op", "aa_param", "aa_matrix")),
    (Recipe(auto_augment=AutoAugment.parse("rand-m9-mstd0.5")), True, True, ("flip",),
     (*WINDOW, "interp", "aa_op", "aa_param", "aa_matrix")),
    (Recipe(solarize=RandomSolarize(128.0)), True, True, ("flip",), (*WINDOW, "interp", "solarize")),
    (Recipe(crop="none"), True, True, ("flip",), (*WINDOW, "interp")),
    (Recipe(crop="iou"), True, True, ("flip",), (*WINDOW, "interp")),
    (Recipe(crop="zoom_iou", photometric=PhotometricDistort()), True, True, ("flip",),
     (*PASTE, "interp", *PHOTOMETRIC)),
    (Recipe(crop="lsj"), True, True, ("flip",), (*PASTE, "interp")),
    (Recipe(crop="iou"), False, True, ("flip",), (*WINDOW, "interp")),
    (Recipe(interpolation="bicubic"), False, False, ("resize", "crop"), ("resize", "crop", "interp")),
    (None, False, False, ("resize", "crop"), ("resize", "crop")),
])
def test_the_graph_is_fed_what_the_declarations_leave_it_in_order(
        recipe: Recipe | None, train: bool, windows: bool, host: tuple[str, ...],
        graph: tuple[str, ...]) -> None:
    """Each path's graph inputs, in the order the graph is fed them, from the operations'
    declarations alone: on the host-resize path the flip alone (whole tiles: the framing); on the
    graph's own path all but what only the host reads (a crop that pads: the whole window; an
    IoU crop: its keep)."""
    augment = _augment(recipe, train, windows)
    assert graph_names(sent(augment), True) == host
    assert graph_names(sent(augment), False) == graph


@pytest.mark.parametrize("crop", ["iou", "zoom_iou"])
def test_an_iou_crops_keep_is_declared_for_the_host_alone(crop: str) -> None:
    """The keep of an IoU crop (one flag an object, not a sample) is sent in training only and
    is fed to the graph on neither path."""
    declared = sent(_augment(Recipe(crop=crop)))
    assert declared["keep"].host_only and declared["keep"].dtype == np.dtype(np.bool_)
    assert all("keep" not in graph_names(declared, host) for host in (True, False))
    assert "keep" not in sent(_augment(Recipe(crop=crop), train=False))
    assert "keep" not in sent(_augment(Recipe(crop="lsj")))


def test_decode_scale_is_the_smallest_that_still_covers_the_output() -> None:
    assert decode_scale(128, 128, 16, 128, 128) == 8
    assert decode_scale(128, 96, 16, 128, 128) == 4  # the narrower side decides
    assert decode_scale(64, 64, 32, 128, 128) == 2
    assert decode_scale(63, 64, 32, 128, 128) == 1
    assert decode_scale(100, 100, 13, 100, 100) == 8  # 100 / 8 rounds up to 13 decoded pixels
    assert decode_scale(100, 100, 14, 100, 100) == 4
