"""Mixup and cutmix against timm's Mixup and torchvision's MixUp/CutMix/RandomChoice: the same
images and targets for the same draw, the same distributions of draws, and the rule for resume."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from timm.data import mixup as timm_mixup
from torchvision.transforms import v2

from tests.pipeline.recipe.two_sample import chi2_same, ks_same
from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.recipe import batch_mix
from tilefeed.pipeline.recipe import erasing as erasing_module
from tilefeed.pipeline.recipe.batch_mix import BatchMix, MixStyle, batch_position
from tilefeed.pipeline.recipe.erasing import RandomErasing
from tilefeed.store.errors import ConfigError
from tests.pipeline.recipe.helpers import as_nchw, in_layout

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("NCHW", "NHWC", "channels_last")
DRAWS = 3000  # batches per distribution check
SIDE = 16


def positions_of_each_kind(mix: BatchMix, seed: int = 3) -> dict[str, int]:
    """A batch position that mixes up, one that cuts, one left alone (where the settings have it)."""
    found: dict[str, int] = {}
    for position in range(400):
        d = mix.draw(seed, 0, position, SIDE, SIDE)
        kind = "cutmix" if d.cutmix else "mixup" if d.lam != 1.0 else "none"
        found.setdefault(kind, position)
    return found


# -- the same images and targets as the libraries, for the same draw -----------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_timm_style_equals_timms_mixup_for_the_same_draw(dtype: torch.dtype, layout: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mix = BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, label_smoothing=0.1, num_classes=10)
    reference = timm_mixup.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, label_smoothing=0.1,
                                 num_classes=10)
    generator = torch.Generator().manual_seed(0)
    for kind, position in positions_of_each_kind(mix).items():
        nchw = torch.randn(6, 3, SIDE, SIDE, generator=generator).to(dtype)
        labels = torch.randint(0, 10, (6,), generator=generator)
        d = mix.draw(3, 0, position, SIDE, SIDE)
        monkeypatch.setattr(reference, "_params_per_batch", lambda d=d: (d.lam, d.cutmix))
        monkeypatch.setattr(timm_mixup, "cutmix_bbox_and_lam", lambda *a, d=d, **k: (d.box, d.lam))
        want_images, want_targets = reference(nchw.clone(), labels)
        images, targets = mix.apply(in_layout(nchw, layout), labels, 3, 0, position, layout)
        assert torch.equal(as_nchw(images, layout), want_images), kind
        assert torch.equal(targets, want_targets), kind
        assert targets.dtype == torch.float32


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_torchvision_style_equals_torchvisions_mixup_and_cutmix_for_the_same_draw(
        dtype: torch.dtype, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mix = BatchMix.from_torchvision(10, mixup_alpha=0.2, cutmix_alpha=1.0)
    generator = torch.Generator().manual_seed(1)
    kinds = positions_of_each_kind(mix)
    assert set(kinds) == {"mixup", "cutmix"}  # torchvision mixes every batch
    for kind, position in kinds.items():
        nchw = torch.randn(5, 3, SIDE, SIDE, generator=generator).to(dtype)
        labels = torch.randint(0, 10, (5,), generator=generator)
        d = mix.draw(3, 0, position, SIDE, SIDE)
        if d.cutmix:
            assert d.box is not None
            top, bottom, left, right = d.box
            reference: Any = v2.CutMix(alpha=1.0, num_classes=10)
            params = {"box": (left, top, right, bottom), "lam_adjusted": d.lam}
        else:
            reference = v2.MixUp(alpha=0.2, num_classes=10)
            params = {"lam": d.lam}
        monkeypatch.setattr(reference, "make_params", lambda flat, params=params: params)
        want_images, want_targets = reference(nchw.clone(), labels)
        images, targets = mix.apply(in_layout(nchw, layout), labels, 3, 0, position, layout)
        assert torch.equal(as_nchw(images, layout), want_images), kind
        assert torch.equal(targets, want_targets), kind


def test_mixing_keeps_the_tensor_and_its_layout() -> None:
    mix = BatchMix.from_timm(mixup_alpha=1.0, cutmix_alpha=1.0, num_classes=4)
    labels = torch.arange(4)
    for layout in LAYOUTS:
        images = in_layout(torch.randn(4, 3, SIDE, SIDE), layout)
        strides = images.stride()
        for position in positions_of_each_kind(mix).values():
            out, _ = mix.apply(images, labels, 3, 0, position, layout)
            assert out is images and out.stride() == strides


# -- the same distributions of draws --------------------------------------------------------------

def observe(run: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch of two (image 0 all zeros, image 1 nonzero everywhere, labels 0 and 1): the kind
    (0 left alone, 1 mixup, 2 cutmix), mixup's lambda and cutmix's pasted area, read from what
    ``run(images, labels)`` gives back for image 0 (paired with image 1 by flip and by roll)."""
    kinds, lams, areas = [], [], []
    base = torch.zeros(2, 1, SIDE, SIDE)
    base[1] = 1.0 + torch.arange(SIDE * SIDE, dtype=torch.float32).reshape(1, SIDE, SIDE) / 256
    labels = torch.tensor([0, 1])
    for i in range(DRAWS):
        images, targets = run(base.clone(), labels, i)
        zeros = images[0] == 0
        if bool(zeros.all()):
            kinds.append(0)
        elif bool(zeros.any()):
            kinds.append(2)
            areas.append(float((~zeros).float().mean()))
        else:
            kinds.append(1)
            lams.append(float(targets[0, 0]))
    return np.array(kinds), np.array(lams), np.array(areas)


def ours(mix: BatchMix) -> Any:
    return lambda images, labels, i: mix.apply(images, labels, 11, 2, i)


def timms(**options: Any) -> Any:
    np.random.seed(0)
    reference = timm_mixup.Mixup(label_smoothing=0.0, num_classes=2, **options)
    return lambda images, labels, i: reference(images, labels)


def torchvisions(mixup_alpha: float, cutmix_alpha: float) -> Any:
    torch.manual_seed(0)
    reference = v2.RandomChoice([v2.MixUp(alpha=mixup_alpha, num_classes=2),
                                 v2.CutMix(alpha=cutmix_alpha, num_classes=2)])
    return lambda images, labels, i: reference(images, labels)


@pytest.fixture(scope="module")
def timm_draws() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return observe(timms(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.8, switch_prob=0.4))


def test_timm_style_draws_as_timm(timm_draws: tuple[np.ndarray, ...]) -> None:
    kinds, lams, areas = observe(ours(BatchMix.from_timm(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.8,
                                                         switch_prob=0.4, label_smoothing=0.0, num_classes=2)))
    want_kinds, want_lams, want_areas = timm_draws
    assert chi2_same(kinds, want_kinds)
    assert ks_same(lams, want_lams)
    assert ks_same(areas, want_areas)


def test_timm_style_negative_controls_fail(timm_draws: tuple[np.ndarray, ...]) -> None:
    """The checks above can fail: alpha 0.4 for 0.2, and switch_prob 0.55 for 0.4."""
    want_kinds, want_lams, _ = timm_draws
    _, lams, _ = observe(ours(BatchMix.from_timm(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.8, switch_prob=0.4,
                                                 label_smoothing=0.0, num_classes=2)))
    assert not ks_same(lams, want_lams)
    kinds, _, _ = observe(ours(BatchMix.from_timm(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.8, switch_prob=0.55,
                                                  label_smoothing=0.0, num_classes=2)))
    assert not chi2_same(kinds, want_kinds)


def test_timm_minmax_boxes_draw_as_timm() -> None:
    kinds, _, areas = observe(ours(BatchMix.from_timm(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8),
                                                      label_smoothing=0.0, num_classes=2)))
    want_kinds, _, want_areas = observe(timms(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8)))
    assert (kinds == 2).all() and (want_kinds == 2).all()
    assert ks_same(areas, want_areas)
    _, _, wider = observe(ours(BatchMix.from_timm(mixup_alpha=0.0, cutmix_minmax=(0.3, 0.8),
                                                  label_smoothing=0.0, num_classes=2)))
    assert not ks_same(wider, want_areas)  # negative control


def test_torchvision_style_draws_as_torchvision_and_a_negative_control_fails() -> None:
    kinds, lams, areas = observe(ours(BatchMix.from_torchvision(2, mixup_alpha=0.2, cutmix_alpha=1.0)))
    want_kinds, want_lams, want_areas = observe(torchvisions(0.2, 1.0))
    assert chi2_same(kinds, want_kinds)
    assert ks_same(lams, want_lams)
    assert ks_same(areas, want_areas)
    _, lams_04, _ = observe(ours(BatchMix.from_torchvision(2, mixup_alpha=0.4, cutmix_alpha=1.0)))
    assert not ks_same(lams_04, want_lams)


def test_beta_draws_match_numpys_beta_for_small_and_large_alpha() -> None:
    u = uniforms(5, 0, np.arange(20000), 2 * (1 + 3 * batch_mix.GAMMA_TRIES))
    rng = np.random.default_rng(0)
    for alpha in (0.1, 0.2, 1.0, 4.0):
        ours_ = batch_mix.beta(u, alpha)
        assert np.isfinite(ours_).all() and ((ours_ >= 0) & (ours_ <= 1)).all()
        assert ks_same(ours_[:4000], rng.beta(alpha, alpha, 4000)), alpha
    assert not ks_same(batch_mix.beta(u, 0.4)[:4000], rng.beta(0.2, 0.2, 4000))  # negative control


def test_soft_targets_sum_to_one_with_timms_smoothed_values() -> None:
    mix = BatchMix.from_timm(mixup_alpha=1.0, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=7)
    labels = torch.tensor([0, 3, 6, 2, 5, 1])
    for position in range(40):
        _, targets = mix.apply(torch.randn(6, 3, SIDE, SIDE), labels, 0, 0, position)
        lam = mix.draw(0, 0, position, SIDE, SIDE).lam
        assert torch.allclose(targets.sum(1), torch.ones(6))
        on, off = 1 - 0.1 + 0.1 / 7, 0.1 / 7
        assert targets[0, 0] == pytest.approx(on * lam + off * (1 - lam), abs=1e-6)
        assert targets[0, 1] == pytest.approx(off * lam + on * (1 - lam), abs=1e-6)  # its partner's, the last
        assert targets[0, 4] == pytest.approx(off, abs=1e-7)  # a class of neither


# -- determinism and the rule for resume ----------------------------------------------------------

def test_a_draw_is_a_function_of_seed_epoch_and_position_only() -> None:
    mix = BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10)
    images = torch.randn(8, 3, SIDE, SIDE)
    labels = torch.randint(0, 10, (8,))
    first = mix.apply(images.clone(), labels, 7, 1, 5)
    again = mix.apply(images.clone(), labels, 7, 1, 5)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    draws = {mix.draw(7, epoch, position, SIDE, SIDE) for epoch in (1, 2) for position in range(20)}
    assert len(draws) > 30  # other positions and epochs, other draws
    # the mixing stream is neither the crops' nor the erasing's
    keys = np.arange(4)
    assert not np.array_equal(uniforms(stream_seed(7, batch_mix.STREAM), 1, keys, 8), uniforms(7, 1, keys, 8))
    assert len({7, stream_seed(7, batch_mix.STREAM), stream_seed(7, erasing_module.STREAM)}) == 3


def epoch_batches(keys: np.ndarray, world: int, batch: int,
                  start: int = 0) -> list[tuple[int, int, np.ndarray]]:
    """(rank, step, keys) of each batch of ``keys`` split over ``world`` ranks, batch by batch
    in rank order, as the Loader deals them (steps counted from ``start``)."""
    out = []
    per_step = world * batch
    for step in range(len(keys) // per_step):
        for rank in range(world):
            lo = step * per_step + rank * batch
            out.append((rank, start + step, keys[lo:lo + batch]))
    return out


def run(mix: BatchMix, erasing: RandomErasing, images: torch.Tensor, labels: torch.Tensor,
        batches: list[tuple[int, int, np.ndarray]], world: int, before: int = 0) -> dict[int, tuple[Any, ...]]:
    """Erase then mix every batch; per batch position: (its keys, images, targets)."""
    out = {}
    for rank, step, keys in batches:
        position = batch_position(step, rank, world, before)
        erased = erasing.erase(images[keys].clone(), keys, 9, 4)
        mixed, targets = mix.apply(erased.clone(), labels[keys], 9, 4, position)
        out[position] = (keys, erased, mixed, targets)
    return out


def test_resume_rule_same_settings_identical_other_settings_redrawn_per_sample_kept() -> None:
    mix = BatchMix.from_timm(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10)
    erasing = RandomErasing(p=0.8, value="random")
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(48, 3, SIDE, SIDE, generator=generator)
    labels = torch.randint(0, 10, (48,), generator=generator)
    order = np.random.default_rng(1).permutation(48)
    whole = run(mix, erasing, images, labels, epoch_batches(order, 2, 4), 2)
    # stopped after 2 steps of world 2, resumed with the same settings: batch for batch the same
    first = run(mix, erasing, images, labels, epoch_batches(order[:16], 2, 4), 2)
    rest = run(mix, erasing, images, labels, epoch_batches(order[16:], 2, 4, start=2), 2)
    resumed = first | rest
    assert resumed.keys() == whole.keys()
    for position, (keys, erased, mixed, targets) in whole.items():
        assert np.array_equal(resumed[position][0], keys)
        again = resumed[position][1:]
        assert all(torch.equal(a, b) for a, b in zip(again, (erased, mixed, targets), strict=True))
    # resumed on world 3, batch 2: the rest is dealt anew; positions continue after the 2 * 2
    # batches handed over, each batch drawn from its own position and mixed within itself
    elastic = run(mix, erasing, images, labels, epoch_batches(order[16:], 3, 2), 3, before=2 * 2)
    assert min(elastic) == 4 and not set(elastic) & set(first)
    erased_whole = {int(k): e for keys, erased, _, _ in whole.values()
                    for k, e in zip(keys, erased, strict=True)}
    for position, (keys, erased, mixed, targets) in elastic.items():
        for k, e in zip(keys, erased, strict=True):  # per-sample erasing: bit-identical
            assert torch.equal(e, erased_whole[int(k)])
        d = mix.draw(9, 4, position, SIDE, SIDE)  # batch-level: the new position's draw
        want = mix.targets(labels[keys], d.lam)
        assert torch.equal(targets, want)
        partner = erased.flip(0)
        if d.box is None and d.lam != 1.0:
            assert torch.equal(mixed, erased * d.lam + partner * (1 - d.lam))
    # and the new batches' draws are not the old batches' draws at the same step
    assert any(mix.draw(9, 4, p, SIDE, SIDE) != mix.draw(9, 4, p - 4, SIDE, SIDE) for p in elastic)


def test_batch_position_is_refused_out_of_range() -> None:
    assert batch_position(3, 1, 4, before=10) == 10 + 3 * 4 + 1
    with pytest.raises(ConfigError):
        batch_position(0, 4, 4)


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "words"), [
    (lambda: BatchMix.from_timm(mode="pair"), "mode='pair'"),
    (lambda: BatchMix.from_timm(mode="elem"), "mode='elem'"),
    (lambda: BatchMix.from_timm(multi_label=True), "multi_label"),
    (lambda: BatchMix.from_timm(mixup_alpha=0.0), "nothing to mix"),
    (lambda: BatchMix.from_timm(prob=1.5), "prob"),
    (lambda: BatchMix.from_timm(cutmix_minmax=(0.8, 0.2)), "cutmix_minmax"),
    (lambda: BatchMix(10, label_smoothing=0.1, style=MixStyle.TORCHVISION), "label_smoothing"),
    (lambda: BatchMix.from_torchvision(10), "nothing to mix"),
    (lambda: BatchMix(10, style="keras"), "style"),  # type: ignore[arg-type]
])
def test_options_it_cannot_honour_are_refused_in_one_line(make: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")) as caught:
        make()
    assert "\n" not in str(caught.value)


def test_uint8_batches_are_refused() -> None:
    mix = BatchMix.from_timm(num_classes=3)
    with pytest.raises(ConfigError, match="normalised float"):
        mix.apply(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]), 0, 0, 0)
