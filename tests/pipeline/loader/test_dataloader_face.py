"""What training scripts read on a loader besides its batches, one test per attribute (timm's
``train.py``, Lightning's loops, accelerate's ``prepare``), and the units of ``mean``/``std``."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import ConfigError, Loader
from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD
from tilefeed.pipeline.options import DATALOADER_ONLY
from tilefeed.pipeline.settings import pixel_units


def small(store: Path, **options: object) -> Loader:
    return Loader(store, 8, train=False, dtype=torch.uint8, layout="NHWC", workers=1,
                  with_index=True, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("world, rank, drop_last", [(1, 0, False), (2, 1, False), (3, 2, True)])
def test_batch_sampler_lists_the_batches_this_rank_yields(store: Path, world: int, rank: int,
                                                           drop_last: bool) -> None:
    with small(store, rank=rank, world_size=world, drop_last=drop_last) as loader:
        bs = loader.batch_sampler
        assert bs.batch_size == 8 and bs.drop_last is drop_last and bs.sampler is loader.sampler
        for epoch in (0, 3):
            bs.set_epoch(epoch)
            listed = list(bs)
            assert len(bs) == len(listed) == len(loader)
            yielded = [idx.tolist() for *_, idx in loader]
            assert listed == yielded, epoch


def test_batch_sampler_set_epoch_reaches_the_loader(store: Path) -> None:
    with small(store, seed=3) as loader:
        loader.batch_sampler.set_epoch(5)
        assert loader.epoch == 5
        first = [idx.tolist() for *_, idx in loader]
    with small(store, seed=3) as other:
        other.set_epoch(5)
        assert first == [idx.tolist() for *_, idx in other]
        other.set_epoch(4)  # the negative control: another epoch is another order
        assert first != [idx.tolist() for *_, idx in other]


def test_timm_set_loader_epoch_runs_on_a_loader(store: Path) -> None:
    """timm's own ``_set_loader_epoch`` (train.py 1.0.31), as the script writes it: it reads
    ``loader.dataset``, then ``loader.batch_sampler`` (the AttributeError the swap met)."""
    def _set_loader_epoch(loader: Loader, epoch: int) -> None:  # timm's, verbatim in behaviour
        if hasattr(loader.dataset, "set_epoch"):
            loader.dataset.set_epoch(epoch)
        if hasattr(loader.batch_sampler, "set_epoch"):
            loader.batch_sampler.set_epoch(epoch)
        elif hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)

    with small(store) as loader:
        _set_loader_epoch(loader, 2)
        assert loader.epoch == 2


def test_lightning_set_sampler_epoch_calls_each_distinct_sampler_once(store: Path) -> None:
    """Lightning's ``_set_sampler_epoch`` collects ``loader.sampler`` and
    ``loader.batch_sampler.sampler`` by id: one object, one call (Lightning is not installed;
    its rule is written out here)."""
    with small(store) as loader:
        found = {id(s): s for s in (getattr(loader, "sampler", None),
                                    getattr(getattr(loader, "batch_sampler", None), "sampler", None))
                 if s is not None and callable(getattr(s, "set_epoch", None))}
        assert len(found) == 1
        for sampler in found.values():
            sampler.set_epoch(1)
        assert loader.epoch == 1


def test_sampler_lists_this_ranks_samples(store: Path) -> None:
    with small(store, rank=1, world_size=2) as loader:
        assert list(loader.sampler) == loader.epoch_indices(0).tolist()
        assert len(loader.sampler) == len(list(loader.sampler))


def test_dataset_is_map_style_with_the_epoch_samples(store: Path) -> None:
    from torch.utils.data import IterableDataset

    with small(store) as loader:
        assert len(loader.dataset) == loader.samples and not isinstance(loader.dataset, IterableDataset)


@pytest.mark.parametrize("workers", [0, 2])
def test_accelerates_skip_first_batches_is_refused_not_served_raw_tiles(store: Path, workers: int) -> None:
    """accelerate's ``skip_first_batches`` builds a plain DataLoader over ``loader.dataset`` and
    ``loader.batch_sampler`` (with the Loader's ``num_workers``): its first batch fails with the
    one line naming the Loader's own resume, rather than train on raw stored tiles; the dataset
    and batch sampler still give what scripts read of them."""
    from accelerate.data_loader import skip_first_batches

    from tilefeed.pipeline.loader.dataloader_face import ITEMS_REFUSED

    with Loader(store, 8, train=True, num_workers=max(workers, 1)) as loader:
        skipped = skip_first_batches(loader, 2)
        if workers == 0:
            skipped.num_workers = 0  # torch's own process, and the error raised as it is
        with pytest.raises(ConfigError) as caught:
            next(iter(skipped))
        assert str(caught.value).splitlines()[-1].endswith(ITEMS_REFUSED)
        assert "register_for_checkpointing" in ITEMS_REFUSED and "\n" not in ITEMS_REFUSED
        assert len(loader.dataset) == 50 and loader.dataset.classes == loader.reader.classes
        assert [len(b) for b in loader.batch_sampler] == [8] * 6 + [2]
        assert len(list(loader)) == 7  # the Loader itself unharmed


def test_dataloader_numbers_read_back(store: Path) -> None:
    with Loader(store, 8, train=False, dtype=torch.uint8, num_workers=1, prefetch_factor=3) as loader:
        numbers = (loader.batch_size, loader.drop_last, loader.num_workers, loader.prefetch_factor)
        assert numbers == (8, False, 1, 3)
        assert loader.pin_memory is False and loader.persistent_workers is False


@pytest.mark.parametrize("name", sorted(set(DATALOADER_ONLY) - {"sampler", "batch_sampler"}))
def test_absent_dataloader_attributes_fail_in_one_line(store: Path, name: str) -> None:
    with small(store) as loader:
        with pytest.raises(AttributeError) as caught:
            getattr(loader, name)
        message = str(caught.value)
        assert name in message and "\n" not in message
        assert not hasattr(loader, name) and getattr(loader, name, "default") == "default"
    with small(store) as loader:  # a typo is still Python's own error
        with pytest.raises(AttributeError, match="no attribute 'batch_sizes'"):
            loader.batch_sizes  # noqa: B018


# -- mean and std units ------------------------------------------------------------------------

def test_timm_and_torchvision_units_give_the_same_normalisation(store: Path) -> None:
    unit = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert pixel_units(*unit) == (IMAGENET_MEAN, IMAGENET_STD)
    outputs = []
    for mean, std in (unit, (IMAGENET_MEAN, IMAGENET_STD), ((10.0, 20.0, 30.0), (2.0, 4.0, 8.0))):
        with Loader(store, 4, shuffle="none", train=False, layout="NHWC", mean=mean, std=std,
                    workers=1) as loader:
            outputs.append(next(iter(loader))[0])
            assert loader.settings.mean == pixel_units(mean, std)[0]
    assert torch.equal(outputs[0], outputs[1])
    assert not torch.allclose(outputs[0], outputs[2])  # the control: other values, other output


def test_state_and_identity_hold_no_normalisation(store: Path) -> None:
    states = []
    for mean, std in (((0.5,) * 3, (0.25,) * 3), ((127.5,) * 3, (63.75,) * 3)):
        with small(store, mean=mean, std=std) as loader:
            states.append(loader.state_dict())
            assert not any(key in ("mean", "std") for key in loader._identity)
    assert states[0] == states[1]


@pytest.mark.parametrize("mean, std, accepted", [
    ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), True),
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), True),  # timm's inception units
    ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), True),  # 0..1 units: no normalisation but the scale
    ((0.0, 0.0, 0.0), (255.0, 255.0, 255.0), True),
    ((123.7, 116.3, 103.5), (58.4, 57.1, 57.4), True),
    ((0.485, 0.456, 0.406), (58.4, 57.1, 57.4), False),  # a 0..1 mean beside a 0..255 std
    ((123.7, 116.3, 103.5), (0.229, 0.224, 0.225), False),  # a 0..255 mean beside a 0..1 std
    ((0.5, 0.5, 0.5), (0.5, 2.0, 0.5), False),  # std on both sides of 1
    ((-0.1, 0.5, 0.5), (0.2, 0.2, 0.2), False),
    ((0.5, 0.5, 0.5), (0.0, 0.2, 0.2), False),
    ((0.5, 0.5), (0.2, 0.2), False),
    ((300.0, 0.0, 0.0), (60.0, 60.0, 60.0), False),
    (("a", 0.5, 0.5), (0.2, 0.2, 0.2), False),
])
def test_mean_and_std_units_rule(store: Path, mean: tuple[float, ...], std: tuple[float, ...],
                                 accepted: bool) -> None:
    if accepted:
        m, s = pixel_units(mean, std)
        assert max(s) > 1 and all(0 <= v <= 255 for v in m)
        return
    with pytest.raises(ConfigError) as caught:
        small(store, mean=mean, std=std)
    message = str(caught.value)
    assert "std all <= 1 means 0..1 units" in message and "\n" not in message


def test_the_rule_is_in_the_loader_docstring() -> None:
    doc = inspect.getdoc(Loader) or ""
    assert "0..1 units" in doc and "0..255 pixel units" in doc
    assert np.isclose(pixel_units((1.0,) * 3, (1.0,) * 3)[0][0], 255.0)
