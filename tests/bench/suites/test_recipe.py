"""The recipe bench: torchvision's ResNet-50 recipe through the Loader (built by the adapter) and
through the DataLoader torchvision's reference script builds, on the same samples; its result
draws the same table again from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import write_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("recipe-bench")
    images = write_folder(root / "images", classes=3, per_class=8, size=(64, 48))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=48, fit="pad"), StoreSettings(shard_size=8), workers=1)
    return images, store


def test_both_sides_run_the_recipe_and_the_table_comes_back_from_json(data: tuple[Path, Path]) -> None:
    from tilefeed.bench.peers.torchvision_recipe import RecipeFlags
    from tilefeed.bench.suites.recipe import DATALOADER, LOADER, OPERATIONS, RecipeResult, bench_recipe

    images, store = data
    flags = RecipeFlags(crop=32)
    result = bench_recipe(images, store, classes=3, batch_size=4, workers=1, step_ms=5, steps=2, rounds=1,
                          flags=flags)
    assert set(result.rate) == set(result.stall) == {LOADER, DATALOADER}
    assert all(f.median > 0 for f in result.rate.values())
    assert all(0 <= f.median <= 1 for f in result.stall.values())
    assert list(result.operations) == list(OPERATIONS)
    # every measured run delivered the same batches on both sides
    runs = result.runs
    assert {r["loader"] for r in runs} == {LOADER, DATALOADER}
    assert len({r["samples"] for r in runs}) == 1
    again = RecipeResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again.table() == result.table() and f"{result.speedup:.2f}x" in result.table()


def test_both_sides_yield_soft_targets_of_the_same_shape(data: tuple[Path, Path]) -> None:
    """The comparison is fair only if both sides give the same batches: images of the crop's size,
    float32 NCHW, and mixed soft targets over the classes."""
    from tilefeed.bench.peers.torchvision_recipe import RecipeFlags, recipe_dataloader
    from tilefeed.bench.suites.recipe import script_args
    from tilefeed.pipeline import Loader
    from tilefeed.pipeline.recipe.adapters import torchvision_options

    images, store = data
    flags = RecipeFlags(crop=32)
    theirs = next(iter(recipe_dataloader(images, 4, workers=0, flags=flags, classes=3)))
    options = torchvision_options(script_args(flags, batch_size=4, workers=1), train=True, num_classes=3)
    with Loader(store, **{**options, "device": "cpu"}) as loader:
        ours = next(iter(loader))
    for side in (theirs, ours):
        images_, targets = side
        assert images_.shape == (4, 3, 32, 32) and images_.dtype == torch.float32
        assert targets.shape == (4, 3) and torch.allclose(targets.sum(1), torch.ones(4))
