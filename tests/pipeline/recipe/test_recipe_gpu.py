"""The recipe on the GPU backend: the same graph functions on device images, against the CPU
path's output (PIL resize there, DALI's on the device). Run by `make gpu-check`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader
from tests.pipeline.recipe.test_loader_recipe import RECIPE

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_recipe_on_the_device_gives_the_cpu_paths_samples(store: Path) -> None:
    """The same samples and parameters on both backends; the resizes differ (DALI's against
    PIL's: at most 2 levels, 0.3 on average, tests/pipeline/recipe/test_recipe.py), and the
    pixel operations carry that through: a mean difference under 2 levels."""
    opts = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1, train=True, seed=3,
                size=40, recipe=RECIPE)
    out = {}
    for device in ("cpu", "cuda"):
        with Loader(store, 10, device=device, **opts) as loader:
            out[device] = {int(i): img.cpu() for imgs, _, idx in loader
                           for img, i in zip(imgs, idx, strict=True)}
    assert out["cpu"].keys() == out["cuda"].keys()
    diff = np.array([(out["cpu"][i].int() - out["cuda"][i].int()).abs().float().mean() for i in out["cpu"]])
    assert diff.mean() < 2.0, diff


def test_a_policy_on_the_device_gives_the_cpu_paths_samples(store: Path) -> None:
    """TrivialAugmentWide draws the same ops for a sample on both backends: the GPU applies them
    with DALI's tensor-style ops, the CPU with PIL's (tests/pipeline/recipe/test_host_ops.py states
    each op's gap: nearest warps' ties, equalize's formula), so the samples stay close on average."""
    from tilefeed.pipeline.recipe.recipe import Recipe

    opts = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1, train=True, seed=3,
                size=40, recipe=Recipe(auto_augment="ta_wide"))
    out = {}
    for device in ("cpu", "cuda"):
        with Loader(store, 10, device=device, **opts) as loader:
            out[device] = {int(i): img.cpu() for imgs, _, idx in loader
                           for img, i in zip(imgs, idx, strict=True)}
    assert out["cpu"].keys() == out["cuda"].keys()
    diff = np.array([(out["cpu"][i].int() - out["cuda"][i].int()).abs().float().mean() for i in out["cpu"]])
    assert np.median(diff) < 4.0, diff


def test_erasing_and_mixing_on_the_device_repeat_and_give_soft_targets(store: Path) -> None:
    """The per-sample noise comes from a CUDA generator seeded per sample, the mix from the
    batch's position: a second pass gives the same tensors; targets are distributions."""
    from tilefeed.pipeline.recipe.batch_mix import BatchMix
    from tilefeed.pipeline.recipe.erasing import RandomErasing
    from tilefeed.pipeline.recipe.recipe import Recipe

    recipe = Recipe(auto_augment="ta_wide", erasing=RandomErasing(p=0.5, value="random"),
                    mix=BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=16))
    passes = []
    for _ in range(2):
        with Loader(store, 8, device="cuda", train=True, seed=4, size=32, recipe=recipe,
                    num_workers=1) as loader:
            passes.append([(x.clone(), y.clone()) for x, y in loader])
    for (x1, y1), (x2, y2) in zip(*passes, strict=True):
        assert x1.is_cuda and torch.isfinite(x1).all() and torch.equal(x1, x2) and torch.equal(y1, y2)
        assert torch.allclose(y1.sum(1), torch.ones(len(y1), device=y1.device))
