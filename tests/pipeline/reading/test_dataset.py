from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tilefeed.pipeline import StoreReader, TileDataset


def test_tile_dataset_in_a_multi_worker_dataloader(store: Path) -> None:
    ds = TileDataset(store)
    assert len(ds) == 50 and ds.classes == ["c0", "c1", "c2", "c3", "c4"]
    reader = StoreReader(store)
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=False,
                        multiprocessing_context="spawn")
    tiles, labels = [], []
    for x, y in loader:
        assert x.dtype == torch.uint8 and x.shape[1:] == (32, 32, 3)
        tiles.append(x)
        labels += y.tolist()
    all_tiles = torch.cat(tiles)
    assert len(all_tiles) == 50 and labels == reader.labels.tolist()
    for i in (0, 17, 49):
        np.testing.assert_array_equal(all_tiles[i].numpy(), reader.read(i))


def test_tile_dataset_pickles_without_open_maps(store: Path) -> None:
    ds = TileDataset(store)
    original = ds[7]  # opens the reader, and maps a shard, in this process
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._reader is None  # no map crossed the pickle: the clone opens its own
    tile, label = clone[7]
    assert torch.equal(tile, original[0]) and label == original[1]
    assert clone._reader is not None and clone._reader is not ds._reader
    transformed = TileDataset(store, transform=lambda t: t.permute(2, 0, 1))
    tile, label = transformed[-1]
    assert tile.shape == (3, 32, 32) and label == 4


def test_out_of_range_samples_are_an_index_error(store: Path) -> None:
    reader = StoreReader(store)
    out = np.empty((2, 32, 32, 3), dtype=np.uint8)
    for bad in ([0, 50], [-1, 3]):
        with pytest.raises(IndexError, match=f"sample {bad[0] if bad[0] < 0 else 50} is out of range"):
            reader.read_batch_into(bad, out)
    with pytest.raises(IndexError):
        TileDataset(store)[50]
