"""torchvision v2's RandomSolarize as a recipe operation (``pipeline.recipe.solarize``, one module
and one registry line): torchvision's kernel on the same draws in both graph shapes, draws of
its own, a recipe identity that names it only when on, and an exact resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as F

from tilefeed import RandomSolarize
from tilefeed.pipeline import Loader
from tilefeed.pipeline.loader.resume import STATE_VERSION
from tilefeed.pipeline.recipe.draws import draw
from tilefeed.pipeline.recipe.pixel_ops import PIXEL_OPERATIONS
from tilefeed.pipeline.recipe.recipe import ColorJitter, Recipe
from tilefeed.pipeline.recipe.solarize import NEVER, Solarize
from tilefeed.store.errors import ConfigError

UINT8 = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1, train=True, seed=3,
             shuffle=False)
SETTINGS = RandomSolarize(threshold=100.5, p=0.5)


def by_sample(loader: Loader) -> dict[int, torch.Tensor]:
    return {int(i): image for images, _, ids in loader for image, i in zip(images, ids, strict=True)}


def test_each_sample_is_torchvisions_solarize_of_the_same_sample_unsolarized(store: Path, shape: str) -> None:
    """Solarize is the last pixel operation, so a sample equals torchvision v2's ``F.solarize``
    of the same sample under the same recipe without it, where its draw says so, bit for bit."""
    base = Recipe(vflip=0.5, grayscale=0.2, color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1))
    with Loader(store, 8, recipe=base, **UINT8) as plain:  # type: ignore[arg-type]
        before = by_sample(plain)
    solarized = replace(base, solarize=SETTINGS)
    with Loader(store, 8, recipe=solarized, **UINT8) as loader:  # type: ignore[arg-type]
        after = by_sample(loader)
    samples = np.array(sorted(after))
    thresholds = Solarize().draw(SETTINGS, 3, 0, samples)["solarize"]
    on = thresholds < NEVER
    assert 0 < on.sum() < len(samples)  # both kinds of sample are checked
    for sample, applied in zip(samples.tolist(), on.tolist(), strict=True):
        chw = before[sample].permute(2, 0, 1)
        want = F.solarize(chw, SETTINGS.threshold) if applied else chw
        assert torch.equal(after[sample].permute(2, 0, 1), want), sample


def test_solarize_draws_on_a_stream_of_its_own() -> None:
    keys = np.arange(20000)
    recipe = Recipe("random", hflip=0.3, vflip=0.1, grayscale=0.2, color_jitter=ColorJitter(0.4, p=0.8))
    with_it = Recipe("random", hflip=0.3, vflip=0.1, grayscale=0.2, color_jitter=ColorJitter(0.4, p=0.8),
                     solarize=SETTINGS)
    a, b = draw(recipe, 5, 2, keys), draw(with_it, 5, 2, keys)
    for field in ("hflip", "vflip", "grayscale", "jitter", "factors", "order", "interp"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    thresholds = Solarize().draw(SETTINGS, 5, 2, keys)["solarize"]
    assert thresholds.dtype == np.float32 and set(np.unique(thresholds).tolist()) == {100.5, NEVER}
    assert abs((thresholds < NEVER).mean() - 0.5) < 4 * np.sqrt(0.25 / len(keys))
    assert np.array_equal(thresholds[::-1], Solarize().draw(SETTINGS, 5, 2, keys[::-1])["solarize"])
    assert not np.array_equal(thresholds, Solarize().draw(SETTINGS, 5, 3, keys)["solarize"])


def test_the_recipe_names_solarize_only_when_on() -> None:
    assert "solarize" not in Recipe().identity()
    assert Recipe(solarize=SETTINGS).identity()["solarize"] == {"threshold": 100.5, "p": 0.5}
    assert [op.field for op in PIXEL_OPERATIONS] == ["solarize"]
    for bad in (dict(threshold=256), dict(threshold=-1), dict(threshold=128, p=1.5), dict(threshold=True)):
        with pytest.raises(ConfigError, match="^RandomSolarize"):
            RandomSolarize(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^solarize must be a RandomSolarize"):
        Recipe(solarize=128)  # type: ignore[arg-type]


def test_a_solarized_epoch_resumes_exactly(store: Path, shape: str) -> None:
    options = dict(UINT8, shuffle=True)
    recipe = Recipe(solarize=RandomSolarize(threshold=64, p=0.7))
    with Loader(store, 8, recipe=recipe, **options) as whole:  # type: ignore[arg-type]
        every = [batch[0] for batch in whole]
    with Loader(store, 8, recipe=recipe, **options) as first:  # type: ignore[arg-type]
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
    assert state["version"] == STATE_VERSION == 10 and state["recipe"]["solarize"]["threshold"] == 64
    with Loader(store, 8, recipe=recipe, **options) as rest:  # type: ignore[arg-type]
        rest.load_state_dict(state)
        resumed = [batch[0] for batch in rest]
    assert len(resumed) == len(every) - 2
    assert all(torch.equal(a, b) for a, b in zip(resumed, every[2:], strict=True))
    with Loader(store, 8, recipe=Recipe(), **options) as other:  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="recipe="):
            other.load_state_dict(state)
