"""Recipe settings and draws: torchvision's checks, deterministic draws on their own stream,
today's crops and flips untouched, the resize filters against PIL's, and the Loader wired."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tilefeed.pipeline import Loader
from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.crops import frame_inputs as crop_inputs
from tilefeed.pipeline.engine.operations import graph_inputs
from tilefeed.pipeline.engine.crops import random_resized_crops
from tilefeed.pipeline.recipe.draws import draw
from tilefeed.pipeline.recipe.recipe import INTERP_CODES, ColorJitter, Interpolation, Recipe
from tilefeed.store.errors import ConfigError
from tests.pipeline.recipe.helpers import tiles

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


@pytest.mark.parametrize("kwargs,words", [
    (dict(hflip=1.5), "hflip must be a probability"),
    (dict(grayscale=-0.1), "grayscale must be a probability"),
    (dict(interpolation="box"), "interpolation must be one of"),
    (dict(color_jitter=(0.4, 0.4)), "color_jitter must be a ColorJitter"),
])
def test_bad_values_are_refused_in_one_line(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as e:
        Recipe(**kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs", [dict(brightness=-0.1), dict(hue=0.6), dict(contrast=(1.5, 0.5)),
                                    dict(saturation=(0.1, 0.2, 0.3)), dict(hue=(-0.6, 0.1)), dict(p=1.2)])
def test_colour_jitter_is_checked_as_torchvision_checks_it(kwargs: dict) -> None:
    from torchvision.transforms import v2

    with pytest.raises(ConfigError):
        ColorJitter(**kwargs)
    if "p" not in kwargs:
        with pytest.raises((ValueError, TypeError)):
            v2.ColorJitter(**kwargs)


def test_colour_jitter_ranges_are_torchvisions() -> None:
    from torchvision.transforms import v2

    for kwargs in (dict(brightness=0.4, contrast=1.5, saturation=(0.2, 3), hue=0.1),
                   dict(brightness=0, hue=(0.0, 0.0)), dict(contrast=(1, 1), hue=(-0.2, 0.3))):
        ours, theirs = ColorJitter(**kwargs), v2.ColorJitter(**kwargs)
        for name, span in ours.ranges().items():
            assert span == (None if getattr(theirs, name) is None else tuple(getattr(theirs, name)))


def test_batch_mix_is_taken_by_its_former_name_mix_with_a_deprecation_warning() -> None:
    """``Recipe(mix=...)`` and ``recipe.mix`` still work for a release, each warning with the new
    name; both names at once are refused in one line; positional order is unchanged."""
    import dataclasses

    from tilefeed.pipeline.recipe.batch_mix import BatchMix
    from tilefeed.pipeline.recipe.erasing import RandomErasing

    batch_mix = BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10)
    recipe = Recipe(batch_mix=batch_mix)
    with pytest.warns(DeprecationWarning, match="batch_mix") as caught:
        old = Recipe(mix=batch_mix)
    assert caught[0].filename == __file__  # the warning points at the caller
    assert old == recipe and old.batch_mix is batch_mix and old.identity() == recipe.identity()
    with pytest.warns(DeprecationWarning, match="batch_mix"):
        assert Recipe(mix=None) == Recipe()
    with pytest.warns(DeprecationWarning, match="batch_mix"):
        assert recipe.mix is batch_mix
    with pytest.warns(DeprecationWarning):
        assert Recipe().mix is None  # the property, not the keyword's default left on the class
    with pytest.raises(ConfigError, match="not both") as e:
        Recipe(batch_mix=batch_mix, mix=batch_mix)
    assert "\n" not in str(e.value)
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="batch_mix must be a BatchMix"):
        Recipe(mix="mixup")
    erasing = RandomErasing(p=0.25)
    assert Recipe("bicubic", 0.5, 0.0, 0.0, None, None, erasing, batch_mix) == Recipe(
        interpolation="bicubic", erasing=erasing, batch_mix=batch_mix)
    assert [f.name for f in dataclasses.fields(Recipe)][6:9] == ["erasing", "batch_mix", "crop"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither replace() nor identity() reads the old name
        assert dataclasses.replace(recipe, hflip=0.25).batch_mix is batch_mix
        assert dataclasses.replace(recipe, batch_mix=None) == Recipe()
        identity = recipe.identity()
    # the saved states' key for this field stays "mix", in its place, so they load as before
    assert "batch_mix" not in identity and list(identity)[6:9] == ["erasing", "mix", "crop"]
    assert identity["mix"]["num_classes"] == 10 and Recipe().identity()["mix"] is None


def test_a_dataclass_made_from_recipe_builds() -> None:
    """A subclass made with ``@dataclass`` inherits no InitVar: its ``__post_init__`` call passes
    no ``mix``, which Recipe's then takes as left out."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Tagged(Recipe):
        tag: str = "run"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tagged = Tagged(hflip=0.25, tag="a")
    assert tagged.hflip == 0.25 and tagged.batch_mix is None and tagged.tag == "a"


def test_interp_codes_are_dalis() -> None:
    from nvidia.dali import types

    assert INTERP_CODES == {Interpolation.NEAREST: int(types.INTERP_NN),
                            Interpolation.BILINEAR: int(types.INTERP_LINEAR),
                            Interpolation.BICUBIC: int(types.INTERP_CUBIC),
                            Interpolation.LANCZOS: int(types.INTERP_LANCZOS3)}


def _augment(recipe: Recipe | None, train: bool = True) -> Augment:
    return Augment(train=train, tile=32, normalize=True, half=False, channels_first=True, windows=True,
                   recipe=recipe)


def test_the_default_recipe_keeps_todays_crops_and_flips_bit_for_bit() -> None:
    boxes = np.tile(np.array([[0, 0, 32, 32]]), (500, 1))
    samples = np.arange(500)
    today = crop_inputs(boxes, _augment(None), 7, 3, 24, samples, samples)
    windows = random_resized_crops(7, 3, samples, 32, 32, SCALE, RATIO)
    for recipe in (Recipe(), Recipe("random", vflip=0.5, grayscale=0.2, color_jitter=ColorJitter(0.4))):
        got = graph_inputs(boxes, _augment(recipe), 7, 3, 24, samples, samples)
        for name, value in today.items():
            assert np.array_equal(got[name], value), name
        assert np.array_equal(got["flip"], windows.flip)
    sent = graph_inputs(boxes, _augment(None), 7, 3, 24, samples, samples)
    assert list(sent) == ["start", "end", "flip", "size"]


def test_draws_are_a_function_of_seed_epoch_and_key_and_their_shares_are_the_probabilities() -> None:
    recipe = Recipe("random", hflip=0.3, vflip=0.1, grayscale=0.2,
                    color_jitter=ColorJitter(0.4, hue=0.1, p=0.8))
    keys = np.arange(20000)
    d = draw(recipe, 5, 2, keys)
    again = draw(recipe, 5, 2, keys[::-1])
    assert np.array_equal(d.order, again.order[::-1]) and np.array_equal(d.factors, again.factors[::-1])
    assert not np.array_equal(d.factors, draw(recipe, 5, 3, keys).factors)
    assert d.hflip is not None
    sigma = lambda p: 4 * np.sqrt(p * (1 - p) / len(keys))  # noqa: E731
    for bits, p in ((d.hflip, 0.3), (d.vflip, 0.1), (d.grayscale, 0.2), (d.jitter, 0.8),
                    (d.interp == INTERP_CODES[Interpolation.BICUBIC], 0.5)):
        assert abs(bits.mean() - p) < sigma(p)
    # brightness uniform in [0.6, 1.4], hue in [-0.1, 0.1], contrast and saturation neutral
    assert 0.6 <= d.factors[:, 0].min() and d.factors[:, 0].max() <= 1.4
    assert abs(d.factors[:, 0].mean() - 1.0) < 0.01 and abs(d.factors[:, 3]).max() <= 0.1
    assert (d.factors[:, 1:3] == 1).all()
    # every one of the 24 orders about equally often, as randperm(4)
    counts = np.unique(d.order @ np.array([64, 16, 4, 1]), return_counts=True)[1]
    assert len(counts) == 24 and counts.min() > 20000 / 24 * 0.85
    # the parameters of one option do not move when another is turned on or off
    alone = draw(Recipe(vflip=0.1), 5, 2, keys)
    assert np.array_equal(alone.vflip, d.vflip)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "lanczos", "nearest"])
def test_dalis_resize_with_each_filter_is_pils_on_the_same_window(interpolation: str) -> None:
    """DALI's antialiased resize (the GPU path's and whole-tile evaluation's) against PIL's
    (torchvision's PIL path, and the CPU host resize itself), shrinking and enlarging the same
    window: measured at most 2 levels apart and 0.23 on average (nearest: equal)."""
    from nvidia.dali import fn, pipeline_def, types

    images = tiles(8, 64)
    pil = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS, "nearest": Image.Resampling.NEAREST}[interpolation]
    code = INTERP_CODES[Interpolation(interpolation)]
    for side in (24, 100):
        @pipeline_def(batch_size=8, num_threads=1, device_id=None)
        def pipe(side: int = side) -> object:
            src = fn.external_source(source=lambda: images, batch=True, layout="HWC")
            interp = fn.external_source(source=lambda: np.full(8, code, np.int32), batch=True)
            return fn.resize(src, size=[float(side)] * 2, roi_start=[5.0, 7.0], roi_end=[55.0, 50.0],
                             roi_relative=False, antialias=True,
                             interp_type=fn.reinterpret(interp, dtype=types.INTERP_TYPE))

        p = pipe()
        p.build()
        ours = p.run()[0].as_array().astype(int)
        ref = np.stack([np.asarray(Image.fromarray(i).resize((side, side), pil, box=(7, 5, 50, 55)))
                        for i in images])
        diff = np.abs(ours - ref)
        assert diff.max() <= (0 if interpolation == "nearest" else 2)
        assert diff.mean() <= 0.3


def test_the_cpu_host_resize_uses_each_samples_filter(store: Path) -> None:
    """Training on the CPU (pillow-simd cuts and resizes): a nearest-neighbour recipe gives
    repeated rows, bilinear blends them."""
    seen = {}
    for interpolation in ("nearest", "bilinear"):
        with Loader(store, 8, train=True, size=64, dtype=torch.uint8, layout="NHWC", with_index=True,
                    num_workers=1, recipe=Recipe(interpolation, hflip=0.0)) as loader:
            imgs, _, _ = next(iter(loader))
        seen[interpolation] = imgs
    # enlarging (crops of at most 32 pixels to 64) by nearest repeats whole rows; bilinear blends
    def repeats(x: torch.Tensor) -> float:
        return float((x[:, 1:] == x[:, :-1]).all(dim=-1).float().mean())
    assert repeats(seen["nearest"]) > 0.4
    assert repeats(seen["bilinear"]) < 0.2
