"""A Loader with a recipe: on the CPU it gives what torchvision's PIL kernels give on the same
drawn parameters, a resumed epoch is the same bit for bit, and a resume under another recipe is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.recipe.draws import draw
from tilefeed.pipeline.recipe.batch_mix import BatchMix
from tilefeed.pipeline.recipe.erasing import RandomErasing
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.recipe import ColorJitter, Recipe
from tilefeed.store.errors import ConfigError
from tests.pipeline.recipe.helpers import torchvision_pil

RECIPE = Recipe("random", hflip=0.3, vflip=0.5, grayscale=0.2,
                color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8))
UINT8 = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1, train=True, seed=3)


def test_the_cpu_path_gives_torchvisions_pil_kernels_on_the_same_draws(store: Path, shape: str) -> None:
    """Each delivered image against: its window resized by PIL with its drawn filter, then
    torchvision v2's functional ops on the PIL picture with its drawn parameters, then its
    horizontal flip: bit for bit in the host shape (the batch source applies them with the same
    PIL calls, ``recipe.host_ops``); in the device shape (DALI's resize, the graph's tensor-style
    ops) within 2 levels on average a sample, the resizes' gap carried through the ops."""
    with Loader(store, 10, size=40, recipe=RECIPE, **UINT8) as loader:
        batches = list(loader)
        samples = np.concatenate([b[2].numpy() for b in batches])
        windows = loader.windows(0, samples)
    with StoreReader(store) as reader:
        pixels = reader.read_batch_into(samples.tolist(), np.empty((len(samples), 32, 32, 3), np.uint8))
    drawn = draw(RECIPE, 3, 0, samples)
    filters = {1: Image.Resampling.BILINEAR, 2: Image.Resampling.BICUBIC}
    ours = np.concatenate([b[0].numpy() for b in batches])
    gaps = []
    for k in range(len(samples)):
        (y0, x0), (y1, x1) = windows[0][k].tolist(), windows[1][k].tolist()
        cut = Image.fromarray(pixels[k]).resize((40, 40), filters[int(drawn.interp[k])], box=(x0, y0, x1, y1))
        ref = torchvision_pil(cut, RECIPE, drawn, k)
        if windows[2][k]:
            ref = ref[:, ::-1]
        assert shape == "device" or np.array_equal(ours[k], ref), k
        gaps.append(np.abs(ours[k].astype(np.int16) - ref.astype(np.int16)).mean())
    assert np.mean(gaps) < 2.0, gaps
    assert drawn.hflip is not None and np.array_equal(windows[2], drawn.hflip)
    assert drawn.jitter.sum() > len(samples) // 2 and drawn.grayscale.sum() > 0  # the ops did act


# timm's RandAugment under its default random filter: bicubic slots drawn per sample and op slot
TIMM_POLICY = Recipe(auto_augment=AutoAugment.parse("rand-m9-mstd0.5-inc1"))


@pytest.mark.parametrize("recipe", [RECIPE, TIMM_POLICY], ids=["jitter", "timm_policy"])
def test_a_resumed_epoch_with_a_recipe_delivers_the_same_samples_bit_for_bit(store: Path, recipe: Recipe,
                                                                              shape: str) -> None:
    opts = dict(UINT8, size=24, recipe=recipe, shuffle=True)
    with Loader(store, 8, **opts) as loader:
        whole = [(b[0].clone(), b[2].clone()) for b in loader]
    with Loader(store, 8, **opts) as loader:
        first = []
        for n, b in enumerate(loader):
            first.append((b[0].clone(), b[2].clone()))
            if n == 2:
                state = loader.state_dict()
                break
    with Loader(store, 5, **opts) as loader:  # another batch size: the same samples, cut anew
        loader.load_state_dict(state)
        rest = {int(i): img for imgs, _, idx in loader for img, i in zip(imgs, idx, strict=True)}
    delivered = {int(i): img for imgs, idx in whole for img, i in zip(imgs, idx, strict=True)}
    resumed = {int(i): img for imgs, idx in first for img, i in zip(imgs, idx, strict=True)} | rest
    assert resumed.keys() == delivered.keys()
    assert all(torch.equal(resumed[i], delivered[i]) for i in delivered)


def test_a_state_saved_under_another_recipe_is_refused(store: Path) -> None:
    with Loader(store, 8, recipe=RECIPE, **UINT8) as loader:
        state = loader.state_dict()
    for other in (None, Recipe(), Recipe("random", hflip=0.3, vflip=0.5, grayscale=0.2)):
        with Loader(store, 8, recipe=other, **UINT8) as loader:
            with pytest.raises(ConfigError, match="recipe"):
                loader.load_state_dict(state)
    with Loader(store, 8, recipe=RECIPE, **UINT8) as loader:
        loader.load_state_dict(state)
    # a timm string's state saved with a bilinear policy does not resume under the random filter
    bilinear = Recipe(auto_augment=AutoAugment.parse("rand-m9", {"interpolation": "bilinear"}))
    with Loader(store, 8, recipe=bilinear, **UINT8) as loader:
        state = loader.state_dict()
    with Loader(store, 8, recipe=Recipe(auto_augment=AutoAugment.parse("rand-m9")), **UINT8) as loader:
        with pytest.raises(ConfigError, match="recipe"):
            loader.load_state_dict(state)


def test_evaluation_takes_only_the_filter_and_a_bad_recipe_is_refused(store: Path) -> None:
    opts = dict(size=24, with_index=True, num_workers=1, dtype=torch.uint8, layout="NHWC")
    with Loader(store, 8, recipe=RECIPE, **opts) as loader:  # random is bilinear in evaluation
        jittered = [b[0] for b in loader]
    with Loader(store, 8, **opts) as loader:
        plain = [b[0] for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(jittered, plain, strict=True))
    with Loader(store, 8, recipe=Recipe("nearest"), **opts) as loader:
        nearest = [b[0] for b in loader]
    assert not all(torch.equal(a, b) for a, b in zip(nearest, plain, strict=True))
    with pytest.raises(ConfigError, match="recipe must be"):
        Loader(store, 8, recipe={"hflip": 0.5})  # type: ignore[arg-type]


FULL = Recipe("random", hflip=0.3, vflip=0.2, grayscale=0.2, color_jitter=ColorJitter(0.4, 0.4, 0.4, 0.1),
              auto_augment="ta_wide", erasing=RandomErasing(p=0.5, value="random"))
FLOAT = dict(with_index=True, num_workers=1, train=True, seed=5, size=24, shuffle=True)


def by_sample(batches: list[tuple[torch.Tensor, ...]]) -> dict[int, torch.Tensor]:
    return {int(i): img for imgs, _, idx in batches for img, i in zip(imgs, idx, strict=True)}


def test_an_elastic_resume_with_every_per_sample_operation_is_bit_identical(store: Path, shape: str) -> None:
    """Two ranks hand over part of the epoch; three ranks, at another batch size, finish it: every
    sample comes out as the uninterrupted run gave it, policy, jitter and erasing noise included,
    in both graph shapes."""
    whole: dict[int, torch.Tensor] = {}
    for rank in range(2):
        with Loader(store, 4, rank=rank, world_size=2, recipe=FULL, **FLOAT) as loader:
            whole |= by_sample([tuple(t.clone() for t in b) for b in loader])
    first: dict[int, torch.Tensor] = {}
    states = []
    for rank in range(2):
        with Loader(store, 4, rank=rank, world_size=2, recipe=FULL, **FLOAT) as loader:
            batches = []
            for n, b in enumerate(loader):
                batches.append(tuple(t.clone() for t in b))
                if n == 1:
                    states.append(loader.state_dict())
                    break
            first |= by_sample(batches)
    assert states[0]["segments"] == states[1]["segments"]
    rest: dict[int, torch.Tensor] = {}
    for rank in range(3):
        with Loader(store, 3, rank=rank, world_size=3, recipe=FULL, **FLOAT) as loader:
            loader.load_state_dict(states[0])
            rest |= by_sample([tuple(t.clone() for t in b) for b in loader])
    assert not first.keys() & rest.keys() and (first | rest).keys() == whole.keys()
    assert all(torch.equal((first | rest)[i], whole[i]) for i in whole)


def test_mixing_repeats_on_the_same_settings_and_gives_soft_targets_on_others(store: Path) -> None:
    """batch_mix's rule at the Loader: the same world size and batch size mix every batch as before;
    another batch size composes new batches, still mixed into targets that sum to one."""
    with StoreReader(store) as reader:
        classes = int(np.max(reader.labels[:])) + 1
    recipe = Recipe(batch_mix=BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=classes))
    opts = dict(FLOAT, with_index=False)
    with Loader(store, 4, recipe=recipe, **opts) as loader:
        once = [tuple(t.clone() for t in b) for b in loader]
    with Loader(store, 4, recipe=recipe, **opts) as loader:
        again = [tuple(t.clone() for t in b) for b in loader]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(once, again, strict=True))
    assert all(t.dtype == torch.float32 and t.shape == (len(x), classes) for x, t in once)
    with Loader(store, 3, recipe=recipe, **opts) as loader:
        other = [tuple(t.clone() for t in b) for b in loader]
    assert all(torch.allclose(t.sum(1), torch.ones(len(t))) for _, t in other)
    with Loader(store, 4, recipe=recipe, **opts) as loader:
        loader.mixup_enabled = False  # timm's --mixup-off-epoch: plain labels' one-hot targets
        plain = next(iter(loader))
    assert plain[1].dtype == torch.int64


def test_mixing_turned_off_between_epochs_drops_the_batches_mixed_ahead(store: Path) -> None:
    """timm's --mixup-off-epoch: ``mixup_enabled = False`` set between two epochs applies to the
    whole next epoch, although the feed had mixed that epoch's first batches ahead; they equal a
    Loader's that never mixed (erasing stays on)."""
    with StoreReader(store) as reader:
        classes = int(np.max(reader.labels[:])) + 1
    recipe = Recipe(erasing=RandomErasing(p=0.5),
                    batch_mix=BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=classes))
    opts = dict(FLOAT, with_index=False, prefetch=4)
    with Loader(store, 4, recipe=recipe, **opts) as loader:
        assert all(t.dtype == torch.float32 for _, t in loader)  # the feed runs on into epoch 1
        loader.mixup_enabled = False
        loader.set_epoch(1)
        switched = [tuple(t.clone() for t in b) for b in loader]
    with Loader(store, 4, recipe=recipe, **opts) as loader:
        loader.mixup_enabled = False
        loader.set_epoch(1)
        plain = [tuple(t.clone() for t in b) for b in loader]
    assert all(t.dtype == torch.int64 for _, t in switched)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(switched, plain, strict=True))


def test_erasing_and_mixing_run_on_the_feeding_thread(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-batch operations overlap the consumer's step: they run where the feed hands a
    batch over, never on the thread iterating the Loader."""
    import threading

    from tilefeed.pipeline.recipe.batch_ops import BatchOps

    threads: list[threading.Thread] = []
    original = BatchOps.__call__

    def recorded(self: BatchOps, out: dict[str, torch.Tensor], batch: int, inputs: Any) -> None:
        threads.append(threading.current_thread())
        original(self, out, batch, inputs)

    monkeypatch.setattr(BatchOps, "__call__", recorded)
    with Loader(store, 4, recipe=Recipe(erasing=RandomErasing(p=1.0)), **FLOAT) as loader:
        batches = list(loader)
    assert len(threads) >= len(batches) > 0
    assert threading.current_thread() not in threads


def test_uint8_is_refused_for_erasing_and_mixing_only_where_they_apply(store: Path) -> None:
    """Erasing and mixing act on the normalised training batch: uint8 training with them is
    refused in one line; an evaluation Loader, which takes only the recipe's filter, accepts it."""
    recipe = Recipe(erasing=RandomErasing(p=1.0))
    with pytest.raises(ConfigError, match="not uint8"):
        Loader(store, 4, recipe=recipe, dtype=torch.uint8, train=True)
    with Loader(store, 4, recipe=recipe, dtype=torch.uint8, train=False) as loader:
        images, _ = next(iter(loader))
    assert images.dtype == torch.uint8
