"""The Loader's epochs have one owner (``EpochState``): the epoch that comes next, the one being
iterated, a loaded state, and the size each takes; the settings have one copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilefeed.pipeline import Loader
from tilefeed.pipeline.settings import Setting


def test_the_epoch_state_follows_iteration_set_epoch_and_a_loaded_state(store: Path) -> None:
    with Loader(store, 8, shuffle=True, size=lambda e: 16 + 8 * (e % 2)) as loader:
        state = loader.epochs
        assert (loader.epoch, state.current, state.open) == (0, 0, None)
        batches = iter(loader)
        next(batches)
        assert state.open is not None and state.open.epoch == 0 and loader.epoch == 1
        assert loader.size == 16 and loader.size_of(1) == 24  # the open epoch keeps its size
        saved = loader.state_dict()
        assert (saved["epoch"], saved["batch"], saved["size"]) == (0, 1, 16)
        for _ in batches:
            pass
        assert state.open is None and state.current == 1 and loader.size == 24
        loader.set_size(32)
        assert loader.size_of(5) == 32 and loader.state_dict()["set_size"] == 32
        loader.load_state_dict(saved)  # back inside epoch 0, at its size, after its first batch
        assert (loader.epoch, state.resume is not None, loader.size, state.fixed) == (0, True, 16, None)
        assert len(loader.next_epoch_indices()) == loader.samples - 8
        loader.set_epoch(3)  # another epoch: the loaded state's position is dropped
        assert state.resume is None and loader.epoch == 3 and len(loader.next_epoch_indices()) == loader.samples


def test_the_sampler_lists_the_epoch_set_on_it(store: Path) -> None:
    with Loader(store, 8, shuffle=True) as loader:
        loader.sampler.set_epoch(2)
        assert loader.epoch == 2
        assert list(loader.sampler) == loader.epoch_indices(2).tolist() != loader.epoch_indices(0).tolist()
        assert len(loader.sampler) == loader.samples


def test_the_settings_are_read_from_one_copy_and_refuse_a_change(store: Path) -> None:
    with Loader(store, 8, shuffle="shard", drop_last=True, workers=1) as loader:
        assert (loader.batch_size, loader.shuffle, loader.drop_last, loader.workers) == (8, "shard", True, 1)
        assert isinstance(vars(Loader)["batch_size"], Setting)  # read from the settings, not copied
        with pytest.raises(AttributeError, match="batch_size is fixed when the Loader is made"):
            loader.batch_size = 16
        assert loader.batch_size == 8 and len(next(iter(loader))[0]) == 8
