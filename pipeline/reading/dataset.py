"""``TileDataset``: the store as a map-style torch Dataset, for users who keep their DataLoader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from tilefeed.pipeline.reading.reader import StoreReader


class TileDataset(Dataset[tuple[Any, int]]):
    """``ds[i] -> (tile, label)``: tile i as a (T, T, 3) uint8 tensor, or ``transform(tile)``.

    Picklable: the store is opened lazily in each process, so DataLoader workers (fork or
    spawn) each map the shards themselves. ``store`` may be an open ``StoreReader`` to share
    in this process (the store is then not opened and checked a second time).

    Parameters
    ----------
    store : str, Path or StoreReader
        A store folder or bucket URL, or an open reader.
    transform : callable, optional
        Applied to each (T, T, 3) uint8 tile; ``ds[i]`` then returns ``(transform(tile), label)``.
    **store_options
        StoreReader's ``storage_options``, ``cache_dir`` and ``cache_limit``, for a store in
        object storage.
    """

    def __init__(self, store: str | Path | StoreReader,
                 transform: Callable[[torch.Tensor], Any] | None = None, **store_options: Any) -> None:
        """``store_options``: StoreReader's ``storage_options``, ``cache_dir``, ``cache_limit``
        for a store in object storage."""
        self._reader: StoreReader | None = None
        if isinstance(store, StoreReader):
            self._reader, store_options = store, store.options()
            store = store.location
        self.store, self.store_options = store, store_options
        self.transform = transform
        self._len = len(self.reader)

    @property
    def reader(self) -> StoreReader:
        if self._reader is None:
            self._reader = StoreReader(self.store, **self.store_options)
        return self._reader

    @property
    def classes(self) -> list[str]:
        return self.reader.classes

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if index < 0:
            index += self._len
        reader = self.reader
        tile = torch.from_numpy(reader.read(index))
        return (self.transform(tile) if self.transform else tile), int(reader.labels[index])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state
