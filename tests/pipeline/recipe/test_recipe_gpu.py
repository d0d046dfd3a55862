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
